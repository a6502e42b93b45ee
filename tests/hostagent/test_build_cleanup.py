"""A template build's cleanup runs to its end however often the build is cancelled meanwhile.

A build is cancelled by its template's delete and again when the caller awaiting that delete is
cancelled; a second cancellation between the egress detach and the namespace's destroy once left the
build's address in the agent's addresses.json (builds.py ``_to_the_end``)."""

from __future__ import annotations

import asyncio

import pytest

from paddock_hostagent.builds import _to_the_end


async def test_cleanup_finishes_through_two_cancellations_and_the_cancellation_goes_on() -> None:
    steps: list[str] = []

    async def cleanup() -> None:
        steps.append("detach")
        await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)  # the second cancellation lands here, as between detach and destroy
        steps.append("destroy")

    async def attempt() -> None:
        try:
            await asyncio.sleep(10)  # the build's RUN step
        finally:
            await _to_the_end(cleanup())

    task = asyncio.create_task(attempt())
    await asyncio.sleep(0.01)
    task.cancel()  # the template's delete
    await asyncio.sleep(0.07)
    task.cancel()  # the delete's own caller gave up
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["detach", "destroy"]


async def test_a_cleanup_error_is_raised_when_nothing_was_cancelled() -> None:
    async def cleanup() -> None:
        raise OSError("the namespace would not go")

    with pytest.raises(OSError, match="would not go"):
        await _to_the_end(cleanup())
