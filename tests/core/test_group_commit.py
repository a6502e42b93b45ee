"""``paddock_core.group_commit``: what arrives for a key while its group runs is run together next, and
each caller gets its own item's outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from paddock_core.group_commit import GroupCommit


class Runs:
    """A ``run`` that records each group and answers each item doubled, or its error."""

    def __init__(self, hold: asyncio.Event | None = None, fail: BaseException | None = None) -> None:
        self.groups: list[list[int]] = []
        self.hold = hold
        self.fail = fail

    async def __call__(self, key: str, items: Sequence[int]) -> list[int | BaseException]:
        self.groups.append(list(items))
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        return [ValueError(f"odd {n}") if n % 2 else n * 2 for n in items]


async def test_a_lone_call_runs_at_once_and_later_ones_wait_to_run_together() -> None:
    groups: GroupCommit[int, int] = GroupCommit()
    hold = asyncio.Event()
    run = Runs(hold)
    first = asyncio.create_task(groups.submit("acct", 2, run))
    await asyncio.sleep(0.01)
    assert run.groups == [[2]], "the first call did not start a group at once"
    later = [asyncio.create_task(groups.submit("acct", n, run)) for n in (4, 6, 8)]
    other = asyncio.create_task(groups.submit("other", 10, run))  # another key is not held up
    await asyncio.sleep(0.01)
    assert run.groups == [[2], [10]]
    hold.set()
    async with asyncio.timeout(5):
        assert await first == 4
        assert [await task for task in later] == [8, 12, 16]
        assert await other == 20
    assert run.groups == [[2], [10], [4, 6, 8]]
    assert not groups.running("acct") and not groups.running("other")


async def test_each_caller_gets_its_own_outcome_and_a_failed_run_fails_its_group() -> None:
    groups: GroupCommit[int, int] = GroupCommit()
    hold = asyncio.Event()
    run = Runs(hold)
    tasks = [asyncio.create_task(groups.submit("acct", n, run)) for n in (2, 3, 4)]
    hold.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert outcomes[0] == 4 and outcomes[2] == 8
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "odd 3"

    broken = Runs(fail=ConnectionError("the database went away"))
    failed = await asyncio.gather(*(groups.submit("acct", n, broken) for n in (2, 4)), return_exceptions=True)
    assert all(isinstance(f, ConnectionError) for f in failed), failed
    assert await groups.submit("acct", 6, Runs()) == 12, "a failed group left its key stuck"


async def test_a_group_takes_at_most_its_bound_and_a_caller_that_left_is_not_run() -> None:
    groups: GroupCommit[int, int] = GroupCommit(max_group=3)
    hold = asyncio.Event()
    run = Runs(hold)
    first = asyncio.create_task(groups.submit("acct", 0, run))
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(groups.submit("acct", n, run)) for n in (2, 4, 6, 8, 10)]
    await asyncio.sleep(0.01)
    waiting[1].cancel()  # its caller went away before its group began
    hold.set()
    async with asyncio.timeout(5):
        assert await first == 0
        assert [await waiting[i] for i in (0, 2, 3, 4)] == [4, 12, 16, 20]
    with pytest.raises(asyncio.CancelledError):
        await waiting[1]
    # The first group, then the next three waiting (one of them gone), then the rest.
    assert run.groups == [[0], [2, 6], [8, 10]]
