"""The E2B-only part of a sandbox (migration 0012): its template name, lifetime and metadata.

Kept in their own tables beside ``sandboxes``, which stays as the ``/v1`` routes know it; a sandbox
created through ``/v1`` has no row here and reads in E2B's terms with no metadata and no end time.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text, delete, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.models import Base
from paddock_core import errors

#: Bounds on what a caller stores (isolation rule 5: every input a tenant controls is bounded).
MAX_METADATA_KEYS = 64
MAX_METADATA_KEY_BYTES = 256
MAX_METADATA_VALUE_BYTES = 4096
#: E2B's own ceiling on a sandbox's lifetime (24 h on its Pro plan); also the largest ``timeout``.
MAX_TIMEOUT_S = 24 * 3600
#: E2B's default ``timeout`` when a create names none (the SDK always sends one: 300).
DEFAULT_TIMEOUT_S = 300


class E2bSandbox(Base):
    __tablename__ = "e2b_sandboxes"

    sandbox_id: Mapped[str] = mapped_column(String(40), ForeignKey("sandboxes.id"), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(40), ForeignKey("users.id"))
    template_id: Mapped[str] = mapped_column(String(128))
    timeout_s: Mapped[int] = mapped_column(Integer)
    auto_pause: Mapped[bool] = mapped_column(Boolean, default=False)
    #: When the expiry worker kills (or, with ``auto_pause``, pauses) the sandbox; ``None`` while paused.
    end_at: Mapped[dt.datetime | None] = mapped_column(nullable=True, index=True)
    created_at: Mapped[dt.datetime] = mapped_column()


class E2bMetadata(Base):
    __tablename__ = "e2b_sandbox_metadata"

    sandbox_id: Mapped[str] = mapped_column(String(40), ForeignKey("sandboxes.id"), primary_key=True)
    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


def check_metadata(metadata: dict[str, str] | None, field: str = "metadata") -> dict[str, str]:
    """The metadata as given, or a 400 naming the field that breaks a bound."""
    metadata = metadata or {}
    if len(metadata) > MAX_METADATA_KEYS:
        raise errors.ValidationFailed.field(field, f"at most {MAX_METADATA_KEYS} keys")
    for key, value in metadata.items():
        if not key or len(key.encode()) > MAX_METADATA_KEY_BYTES:
            raise errors.ValidationFailed.field(field, f"keys must be 1 to {MAX_METADATA_KEY_BYTES} bytes")
        if len(value.encode()) > MAX_METADATA_VALUE_BYTES:
            raise errors.ValidationFailed.field(f"{field}.{key}", f"at most {MAX_METADATA_VALUE_BYTES} bytes")
    return metadata


def check_timeout(timeout: int | None, field: str = "timeout") -> int:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if not 0 <= timeout <= MAX_TIMEOUT_S:
        raise errors.ValidationFailed.field(field, f"must be between 0 and {MAX_TIMEOUT_S} seconds")
    return timeout


async def get(session: AsyncSession, sandbox_id: str) -> E2bSandbox | None:
    return await session.get(E2bSandbox, sandbox_id)


async def metadata_of(session: AsyncSession, sandbox_ids: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {sandbox_id: {} for sandbox_id in sandbox_ids}
    if not sandbox_ids:
        return out
    rows = await session.scalars(select(E2bMetadata).where(E2bMetadata.sandbox_id.in_(sandbox_ids)))
    for row in rows:
        out[row.sandbox_id][row.key] = row.value
    return out


async def record(
    session: AsyncSession,
    *,
    sandbox_id: str,
    user_id: str,
    template_id: str,
    timeout_s: int,
    auto_pause: bool,
    metadata: dict[str, str],
    now: dt.datetime,
) -> E2bSandbox:
    row = E2bSandbox(
        sandbox_id=sandbox_id,
        user_id=user_id,
        template_id=template_id,
        timeout_s=timeout_s,
        auto_pause=auto_pause,
        end_at=now + dt.timedelta(seconds=timeout_s),
        created_at=now,
    )
    session.add(row)
    for key, value in metadata.items():
        session.add(E2bMetadata(sandbox_id=sandbox_id, key=key, value=value))
    return row


async def set_end(
    session: AsyncSession,
    sandbox_id: str,
    user_id: str,
    template_id: str,
    end_at: dt.datetime | None,
    now: dt.datetime,
) -> E2bSandbox:
    """Sets the sandbox's end time, making its row if it was created through ``/v1``."""
    row = await session.get(E2bSandbox, sandbox_id, with_for_update=True)
    if row is None:
        row = E2bSandbox(
            sandbox_id=sandbox_id,
            user_id=user_id,
            template_id=template_id,
            timeout_s=DEFAULT_TIMEOUT_S,
            auto_pause=False,
            created_at=now,
        )
        session.add(row)
    row.end_at = end_at
    return row


async def forget(session: AsyncSession, sandbox_id: str) -> None:
    await session.execute(delete(E2bMetadata).where(E2bMetadata.sandbox_id == sandbox_id))
