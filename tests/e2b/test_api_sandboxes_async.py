"""The same E2B API through the SDK's async client (``AsyncSandbox``), unmodified and configured only
by the three environment variables: create, get_info, list by metadata and state, set_timeout,
pause/connect, kill and the SDK's NotFound (fails on the old code: nothing listened)."""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import time

import pytest

from e2b import AsyncSandbox, NotFoundException, SandboxQuery, SandboxState
from tests.e2b.conftest import E2bPlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]


async def test_async_create_list_pause_connect_kill(e2b_env: E2bPlatform) -> None:
    tag = secrets.token_hex(4)
    first, second = await asyncio.gather(
        AsyncSandbox.create(metadata={"async": tag}, timeout=120),
        AsyncSandbox.create(metadata={"async": tag}, timeout=120),
    )
    try:
        info = await first.get_info()
        assert info.state == SandboxState.RUNNING and info.metadata == {"async": tag}
        listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"async": tag})).next_items()
        assert {item.sandbox_id for item in listed} == {first.sandbox_id, second.sandbox_id}

        assert await first.pause() is True
        paused = AsyncSandbox.list(query=SandboxQuery(metadata={"async": tag}, state=[SandboxState.PAUSED]))
        assert [item.sandbox_id for item in await paused.next_items()] == [first.sandbox_id]
        resumed = await AsyncSandbox.connect(first.sandbox_id)
        assert (await resumed.get_info()).state == SandboxState.RUNNING

        await second.set_timeout(1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                await AsyncSandbox.get_info(second.sandbox_id)
            except NotFoundException:
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError("the sandbox outlived its timeout by 30 s")

        assert await AsyncSandbox.kill(first.sandbox_id) is True
        with pytest.raises(NotFoundException):
            await AsyncSandbox.get_info(first.sandbox_id)
        assert await AsyncSandbox.list(query=SandboxQuery(metadata={"async": tag})).next_items() == []
    finally:
        await AsyncSandbox.kill(first.sandbox_id)
        await AsyncSandbox.kill(second.sandbox_id)


async def test_async_refresh_never_shortens_and_connect_extends(e2b_env: E2bPlatform) -> None:
    sandbox = await AsyncSandbox.create(timeout=200)
    try:
        await AsyncSandbox.connect(sandbox.sandbox_id, timeout=30)  # shorter: a running one keeps 200 s
        left = ((await sandbox.get_info()).end_at - dt.datetime.now(dt.UTC)).total_seconds()
        assert 150 < left <= 201, left
        await AsyncSandbox.connect(sandbox.sandbox_id, timeout=600)
        left = ((await sandbox.get_info()).end_at - dt.datetime.now(dt.UTC)).total_seconds()
        assert 550 < left <= 601, left
    finally:
        await sandbox.kill()
