"""The SDK's access-token calls (§12.1) against a real control plane on 127.0.0.1 (host seam faked).

The owner issues a token; a second client built with that token as its API key drives the sandbox and
is refused everything else with the SDK's typed errors.
"""

from __future__ import annotations

import asyncio
import re

import pytest

import paddock
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink

pytestmark = pytest.mark.db


async def test_a_token_client_drives_its_sandbox_and_nothing_else(
    controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user()
    async with paddock.AsyncClient(controlplane.url, key) as owner:
        sb = await owner.sandboxes.create("s-1vcpu-1gb")
        other = await owner.sandboxes.create("s-1vcpu-1gb")
        assert (await sb.access_token()).enabled is False
        issued = await sb.create_access_token()
        assert issued.enabled and issued.token and re.fullmatch(r"sbt_[A-Za-z0-9_-]{43}", issued.token)
        assert issued.token not in repr(issued)
        with pytest.raises(paddock.ConflictError):
            await sb.create_access_token()
        shown = await sb.access_token()
        assert shown.token is None and shown.token_hint == f"sbt_…{issued.token[-4:]}"

        async with paddock.AsyncClient(controlplane.url, issued.token) as agent:
            mine = await agent.sandboxes.get(sb.id)
            assert (await mine.run("echo", ["hi"])).stdout == "echo hi\n"
            await mine.write_file("/tmp/x", b"data")
            assert await mine.read_file("/tmp/x") == b"data"
            with pytest.raises(paddock.NotFoundError):
                await agent.sandboxes.get(other.id)
            with pytest.raises(paddock.PermissionDeniedError):
                await agent.whoami()
            with pytest.raises(paddock.PermissionDeniedError):
                await agent.sandboxes.list()
            with pytest.raises(paddock.PermissionDeniedError):
                await mine.fork()
            with pytest.raises(paddock.PermissionDeniedError):
                await mine.rotate_access_token()

            rotated = await sb.rotate_access_token(expires_in_seconds=3600)
            assert rotated.token != issued.token and rotated.rotated_at and rotated.expires_at
            with pytest.raises(paddock.AuthenticationError):
                await agent.sandboxes.get(sb.id)
        assert (await sb.disable_access_token()).enabled is False
        assert (await sb.disable_access_token()).enabled is False
        with pytest.raises(paddock.ConflictError):
            await sb.rotate_access_token()


async def test_the_sync_client_has_the_same_calls(
    controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user()

    def work() -> tuple[bool, str, bool]:
        with paddock.Client(controlplane.url, key) as owner:
            sb = owner.sandboxes.create("s-1vcpu-1gb")
            token = sb.create_access_token().token
            assert token is not None
            with paddock.Client(controlplane.url, token) as agent:
                out = agent.sandboxes.get(sb.id).run("echo", ["sync"]).stdout
            return sb.access_token().enabled, out, sb.disable_access_token().enabled

    assert await asyncio.to_thread(work) == (True, "echo sync\n", False)
