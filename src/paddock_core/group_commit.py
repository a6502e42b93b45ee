"""Group commit per key: calls for one key that arrive while that key's group is running wait, then run
together as the next group, in one call of ``run``.

Why: some writes take turns on a lock for their whole transaction (a create holds its account's row
while it checks the caps and places the sandbox), so their rate is one over the time the lock is held,
however many arrive. A group of them holds the lock once, for about the time of one. A call that finds
no group running starts one at once, so an unhurried caller waits for nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: The most items one group takes; the rest wait for the next. Bounds what one transaction does and
#: holds (the callers waiting are bounded by the server's own limits).
MAX_GROUP = 32


class GroupCommit(Generic[T, R]):
    """One running group per key. ``run(key, items)`` answers, for each item in order, its result or
    the exception it raises; ``submit`` returns or raises that for its item.

    ``run`` failing as a whole (its transaction's commit, a lost connection) fails every item of its
    group with that exception. An item whose caller stopped waiting before its group started is left
    out of it.
    """

    def __init__(self, max_group: int = MAX_GROUP) -> None:
        self.max_group = max_group
        self._waiting: dict[str, list[tuple[T, asyncio.Future[R]]]] = {}
        self._running: dict[str, asyncio.Task[None]] = {}

    async def submit(
        self, key: str, item: T, run: Callable[[str, Sequence[T]], Awaitable[Sequence[R | BaseException]]]
    ) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((item, future))
        if key not in self._running:
            # A task of its own: a group must not end with the caller that happened to start it.
            self._running[key] = asyncio.create_task(self._drain(key, run))
        return await future

    def running(self, key: str) -> bool:
        return key in self._running

    async def _drain(
        self, key: str, run: Callable[[str, Sequence[T]], Awaitable[Sequence[R | BaseException]]]
    ) -> None:
        try:
            while waiting := self._waiting.pop(key, None):
                if len(waiting) > self.max_group:
                    self._waiting[key] = waiting[self.max_group :]
                    waiting = waiting[: self.max_group]
                group = [(item, future) for item, future in waiting if not future.done()]
                if not group:
                    continue
                try:
                    outcomes: Sequence[R | BaseException] = await run(key, [item for item, _ in group])
                except Exception as exc:  # the whole group's failure is each item's
                    outcomes = [exc] * len(group)
                except BaseException as exc:  # cancelled (the process stopping): tell them all, then stop
                    for _, future in group + self._waiting.pop(key, []):
                        if not future.done():
                            future.set_exception(exc)
                    raise
                if len(outcomes) != len(group):  # a bug in ``run``: never leave a caller waiting
                    problem = RuntimeError(f"group of {len(group)} answered {len(outcomes)} outcomes")
                    outcomes = [problem] * len(group)
                for (_, future), outcome in zip(group, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._running.pop(key, None)
