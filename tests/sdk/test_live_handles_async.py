"""Names and handles through the SDK against the real platform: ``sandboxes.get(id_or_name)``,
``sb.name``/``sb.id``/``sb.status``, a sandbox access token naming its own sandbox (the README's token
example), and ``sb.url(port)`` turning ingress on.

Written once for the async client; ``scripts/unasync.py`` generates ``test_live_handles.py``.
"""

from __future__ import annotations

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048


async def test_a_sandbox_by_name_for_a_key_and_for_its_token(live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB, name="handle-box") as sb,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB, name="other-box") as other,
    ):
        assert (sb.name, sb.status, sb.id.startswith("sb-")) == ("handle-box", "running", True)
        found = await client.sandboxes.get("handle-box")
        assert (found.id, found.name, found.status) == (sb.id, "handle-box", "running")
        assert (await client.sandboxes.get(sb.id)).name == "handle-box"
        with pytest.raises(paddock.NotFoundError):
            await client.sandboxes.get("no-such-box")

        token = (await sb.create_access_token()).token
        async with paddock.AsyncClient(live.url, token) as agent:
            mine = await agent.sandboxes.get("handle-box")  # was 403: names needed the account's list
            assert mine.id == sb.id
            assert (await mine.run("echo", ["by name"])).stdout == "by name\n"
            with pytest.raises(paddock.NotFoundError):
                await agent.sandboxes.get("other-box")  # another sandbox of the owner: as if absent
            with pytest.raises(paddock.NotFoundError):
                await agent.sandboxes.get(other.id)


async def test_url_turns_ingress_on(live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        assert not sb.info.ingress_enabled
        url = await sb.url(8080)
        assert sb.info.ingress_enabled and (await client.sandboxes.get(sb.id)).info.ingress_enabled
        assert url == sb.info.ingress_url_template.replace("<port>", "8080")
        assert "8080" in url and "<port>" not in url
        assert await sb.url(9000) == url.replace("8080", "9000")
