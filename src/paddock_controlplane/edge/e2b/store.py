"""The E2B-only part of a sandbox: its template name (migration 0012, narrowed by 0014).

A sandbox's lifetime and metadata live in the native columns ``/v1`` shows (``timeout_s``,
``on_timeout``, ``end_at``, ``metadata``; migration 0013), so a sandbox reads the same through either
API and the reconciler's ``lifecycle.expire_pass`` enforces E2B's ``timeout`` (``autoPause`` is
``on_timeout: pause``). Only the ``templateID`` the caller named has no native home; a sandbox created
through ``/v1`` has no row here and reads with the template its rootfs maps to.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ForeignKey, String
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.records.models import Base
from paddock_controlplane.sandboxes import lifecycle
from paddock_core import errors

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
    session: AsyncSession, *, sandbox_id: str, user_id: str, template_id: str, now: dt.datetime
) -> E2bSandbox:
    row = E2bSandbox(sandbox_id=sandbox_id, user_id=user_id, template_id=template_id, created_at=now)
    session.add(row)
    return row
