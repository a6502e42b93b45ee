"""The one way a sandbox's state change is recorded around a call to its host.

Every change follows the same three steps: (1) a short transaction records the transitional status
(``pausing``, ``resuming``, ``destroying``; ``creating``/``forking`` when the row is written) after the
caller's own checks; (2) the host is called outside any transaction, so no lock is held across the
network; (3) :func:`settle` records the outcome in a second transaction, together with its webhook
event (``webhooks.emit`` writes the outbox row in that same transaction) — but only if the row is still
in a status the caller expects, since a destroy may have overtaken a pause, say. A process that dies
between (1) and (3) leaves the transitional status, which the reconciler settles.

Step (1) differs per operation (which locks, which checks, which statuses are a no-op), so it stays
with the operation; (2) and (3) are here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane import hostlink
from paddock_controlplane.models import Sandbox
from paddock_controlplane.services import Services
from paddock_core.db import transaction

T = TypeVar("T")


@dataclass(frozen=True)
class Settled(Generic[T]):
    """What step (3) found and did."""

    #: The row after the outcome was recorded; ``None`` if it no longer exists, or if a failure was
    #: not to be recorded (``on_failure`` left out).
    row: Sandbox | None
    #: Whether the outcome was written (the row was still in one of the expected statuses).
    recorded: bool
    #: The host's failure, or ``None`` when the call succeeded.
    error: Exception | None


async def settle(
    services: Services,
    sandbox_id: str,
    call: Callable[[], Awaitable[T]],
    *,
    expect: Collection[str],
    on_success: Callable[[AsyncSession, Sandbox, T], Awaitable[None]],
    on_failure: Callable[[AsyncSession, Sandbox, Exception], Awaitable[None]] | None = None,
    failures: tuple[type[Exception], ...] = (hostlink.HostError,),
) -> Settled[T]:
    """Call the host, then record the outcome if the row is still in ``expect``.

    ``failures`` are the exceptions that are an outcome to record (anything else propagates and records
    nothing). Without ``on_failure`` a failure is left as it is: the row stays in its transitional
    status for the reconciler to retry.
    """
    try:
        value = await call()
    except failures as exc:
        if on_failure is None:
            return Settled(row=None, recorded=False, error=exc)
        async with transaction(services.sessions) as session:
            row = await session.get(Sandbox, sandbox_id, with_for_update=True)
            recorded = row is not None and row.status in expect
            if row is not None and recorded:
                await on_failure(session, row, exc)
        return Settled(row=row, recorded=recorded, error=exc)
    async with transaction(services.sessions) as session:
        row = await session.get(Sandbox, sandbox_id, with_for_update=True)
        recorded = row is not None and row.status in expect
        if row is not None and recorded:
            await on_success(session, row, value)
    return Settled(row=row, recorded=recorded, error=None)
