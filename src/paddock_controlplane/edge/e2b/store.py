"""The E2B-only part of a sandbox: its template name (migration 0012, narrowed by 0014); and the ``:tag``
names of snapshots (``e2b_snapshot_tags``, migration 0023), which Paddock's own snapshot names do not
have (edge/e2b/snapshots.py).

A sandbox's lifetime and metadata live in the native columns ``/v1`` shows (``timeout_s``,
``on_timeout``, ``end_at``, ``metadata``; migration 0013), so a sandbox reads the same through either
API and the reconciler's ``lifecycle.expire_pass`` enforces E2B's ``timeout`` (``autoPause`` is
``on_timeout: pause``). Only the ``templateID`` the caller named has no native home; a sandbox created
through ``/v1`` has no row here and reads with the template its rootfs maps to.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ForeignKey, String, delete, false, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.records.models import Base, Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.sandboxes import lifecycle, suspension
from paddock_core import errors
from paddock_core.db import transaction

#: The bounds are /v1's own (one source): a label set through either API fits the other.
MAX_METADATA_KEYS = lifecycle.MAX_METADATA_KEYS
#: E2B's own ceiling on a sandbox's lifetime (24 h on its Pro plan), /v1's too.
MAX_TIMEOUT_S = lifecycle.MAX_TIMEOUT_S
#: E2B's default ``timeout`` when a create names none (the SDK always sends one: 300).
DEFAULT_TIMEOUT_S = 300


class E2bSandbox(Base):
    __tablename__ = "e2b_sandboxes"

    sandbox_id: Mapped[str] = mapped_column(String(40), ForeignKey("sandboxes.id"), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(40), ForeignKey("users.id"))
    template_id: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column()
    #: E2B's ``autoResume`` (migration 0031): an SDK call or port traffic that finds it paused resumes it.
    auto_resume: Mapped[bool] = mapped_column(default=False, server_default=false())


class E2bSnapshotTag(Base):
    """E2B's ``name:tag`` of a snapshot: ``tag`` is ``default`` for a name given without one. The snapshot
    row may be gone (deleted through ``/v1``): such a tag names nothing, and a new snapshot takes it."""

    __tablename__ = "e2b_snapshot_tags"

    user_id: Mapped[str] = mapped_column(String(40), ForeignKey("users.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    snapshot_id: Mapped[str] = mapped_column(String(40), index=True)
    created_at: Mapped[dt.datetime] = mapped_column()


async def tagged(session: AsyncSession, user_id: str, name: str, tag: str | None) -> list[str]:
    """The snapshot ids ``name:tag`` names (every tag of ``name`` when ``tag`` is None)."""
    statement = select(E2bSnapshotTag.snapshot_id).where(
        E2bSnapshotTag.user_id == user_id, E2bSnapshotTag.name == name
    )
    if tag is not None:
        statement = statement.where(E2bSnapshotTag.tag == tag)
    return list((await session.scalars(statement)).all())


async def tags_of(session: AsyncSession, snapshot_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    """``(name, tag)`` pairs of each snapshot."""
    rows = await session.execute(
        select(E2bSnapshotTag.snapshot_id, E2bSnapshotTag.name, E2bSnapshotTag.tag).where(
            E2bSnapshotTag.snapshot_id.in_(snapshot_ids)
        )
    )
    out: dict[str, list[tuple[str, str]]] = {}
    for snapshot_id, name, tag in rows.tuples():
        out.setdefault(snapshot_id, []).append((name, tag))
    return out


async def tag_snapshot(
    session: AsyncSession, *, user_id: str, name: str, tag: str, snapshot_id: str, now: dt.datetime
) -> None:
    """Points ``name:tag`` at ``snapshot_id`` (the caller checked that it names no live snapshot)."""
    await session.execute(
        delete(E2bSnapshotTag).where(
            E2bSnapshotTag.user_id == user_id, E2bSnapshotTag.name == name, E2bSnapshotTag.tag == tag
        )
    )
    session.add(E2bSnapshotTag(user_id=user_id, name=name, tag=tag, snapshot_id=snapshot_id, created_at=now))


async def untag(session: AsyncSession, snapshot_id: str) -> None:
    await session.execute(delete(E2bSnapshotTag).where(E2bSnapshotTag.snapshot_id == snapshot_id))


def check_metadata(metadata: dict[str, str] | None, field: str = "metadata") -> dict[str, str]:
    """The metadata as given, or a 400 naming the field that breaks a bound (/v1's bounds)."""
    return lifecycle.check_metadata(metadata, field)


def check_timeout(timeout: int | None, field: str = "timeout") -> int:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if not 0 <= timeout <= MAX_TIMEOUT_S:
        raise errors.ValidationFailed.field(field, f"must be between 0 and {MAX_TIMEOUT_S} seconds")
    return timeout


async def get(session: AsyncSession, sandbox_id: str) -> E2bSandbox | None:
    return await session.get(E2bSandbox, sandbox_id)


async def record(
    session: AsyncSession,
    *,
    sandbox_id: str,
    user_id: str,
    template_id: str,
    now: dt.datetime,
    auto_resume: bool = False,
) -> E2bSandbox:
    row = E2bSandbox(
        sandbox_id=sandbox_id,
        user_id=user_id,
        template_id=template_id,
        created_at=now,
        auto_resume=auto_resume,
    )
    session.add(row)
    return row


#: The least lifetime a sandbox gets when activity resumes it (E2B's auto-resume: five minutes, or the
#: sandbox's own timeout when that is longer).
WOKEN_MIN_TIMEOUT_S = 300


async def resume_on_activity(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    """``suspension.resume`` for activity that found the sandbox paused (an SDK call, port traffic: the
    edge's and the ingress's wakes); then, for an E2B sandbox, its lifetime starts again,
    ``max(5 min, its timeout)`` from now, as E2B's auto-resume does, so that it pauses (or ends) again
    when the activity stops instead of running with no end. A sandbox made through ``/v1`` (no row
    here), one with no timeout, or one whose lifetime already runs is left as it is."""
    resumed = await suspension.resume(services, user_id, sandbox_id)
    if resumed.status != SandboxStatus.RUNNING:
        return resumed
    async with transaction(services.sessions) as session:
        if await session.get(E2bSandbox, sandbox_id) is None:
            return resumed
        sandbox = await session.get(Sandbox, sandbox_id, with_for_update=True)
        if sandbox is not None and sandbox.end_at is None and sandbox.timeout_s:
            timeout_s = max(WOKEN_MIN_TIMEOUT_S, sandbox.timeout_s)
            sandbox.end_at = services.clock() + dt.timedelta(seconds=timeout_s)
    return resumed
