"""``GET /v1/sandboxes/{id}/shell-ws`` with a real WebSocket client (the ``websockets`` package)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from tests.live import LivePlatform

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def key(live: LivePlatform) -> str:
    return live.api_key()


@pytest.fixture(scope="module")
def sid(live: LivePlatform, key: str) -> Iterator[str]:
    with live.http(key, timeout=60) as api:
        created = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "debian:13"})
        assert created.status_code == 200, created.text
        sandbox_id = str(created.json()["data"]["id"])
        try:
            yield sandbox_id
        finally:
            api.delete(f"/v1/sandboxes/{sandbox_id}")


def ws_url(live: LivePlatform, path: str) -> str:
    return live.url.replace("http://", "ws://") + path


async def read_until(ws: ClientConnection, needle: bytes) -> bytes:
    seen = b""
    async with asyncio.timeout(15):
        while needle not in seen:
            message = await ws.recv()
            assert isinstance(message, bytes), message
            seen += message
    return seen


async def test_a_shell_over_websocket_types_resizes_and_exits(live: LivePlatform, key: str, sid: str) -> None:
    url = ws_url(live, f"/v1/sandboxes/{sid}/shell-ws?rows=20&cols=90")
    async with connect(url, additional_headers={"X-Api-Key": key}) as ws:
        await ws.send(b"stty size; echo ready-$((1+1))\n")
        assert b"20 90" in await read_until(ws, b"ready-2")
        await ws.send(json.dumps({"type": "resize", "rows": 44, "cols": 123}))
        await ws.send(json.dumps({"type": "input", "data": "stty size\n"}))
        await read_until(ws, b"44 123")
        await ws.send(b"exit 4\n")
        async with asyncio.timeout(15):
            while True:
                message = await ws.recv()
                if isinstance(message, str):
                    break
        assert json.loads(message) == {"type": "exit", "exit_code": 4, "signal": None}
        async with asyncio.timeout(5):
            await ws.wait_closed()
        assert ws.close_code == 1000


async def test_leaving_ends_the_shell_and_errors_are_http(live: LivePlatform, key: str, sid: str) -> None:
    url = ws_url(live, f"/v1/sandboxes/{sid}/shell-ws")
    async with connect(url, additional_headers={"X-Api-Key": key}) as ws:
        await ws.send(b"echo $$ > /tmp/shell.pid; echo saved\n")
        await read_until(ws, b"saved")
    async with httpx.AsyncClient(base_url=live.url, headers={"X-Api-Key": key}) as api:
        listed = (await api.get(f"/v1/sandboxes/{sid}/processes")).json()["data"]["processes"]
        shells = [p for p in listed if p["kind"] == "pty" and p["cmd"] == "bash"]
        assert shells, listed
        for _ in range(100):  # the hang-up is sent as the socket closes; give it a moment to land
            states = [
                (await api.get(f"/v1/sandboxes/{sid}/processes/{p['process_id']}")).json()["data"]
                for p in shells
            ]
            if all(state["leader_exited"] for state in states):
                break
            await asyncio.sleep(0.1)
        assert all(state["leader_exited"] for state in states), states
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, additional_headers={"X-Api-Key": "sk_wrong"}):
            pass
    assert refused.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as bad_rows:
        async with connect(url + "?rows=0", additional_headers={"X-Api-Key": key}):
            pass
    assert bad_rows.value.response.status_code == 400 and b"rows" in bad_rows.value.response.body
    with pytest.raises(InvalidStatus) as missing:
        async with connect(
            ws_url(live, "/v1/sandboxes/sb-nope/shell-ws"), additional_headers={"X-Api-Key": key}
        ):
            pass
    assert missing.value.response.status_code == 404


async def test_a_sandbox_access_token_opens_its_own_shell_only(
    live: LivePlatform, key: str, sid: str
) -> None:
    async with httpx.AsyncClient(base_url=live.url, headers={"X-Api-Key": key}, timeout=60) as api:
        issued = await api.post(f"/v1/sandboxes/{sid}/access-token")
        assert issued.status_code == 200, issued.text
        token = issued.json()["data"]["token"]
        other = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "debian:13"})
        other_id = other.json()["data"]["id"]
        try:
            async with connect(
                ws_url(live, f"/v1/sandboxes/{sid}/shell-ws"), additional_headers={"X-Api-Key": token}
            ) as ws:
                await ws.send(b"echo token-$((7*6))\n")
                await read_until(ws, b"token-42")
            with pytest.raises(InvalidStatus) as elsewhere:
                async with connect(
                    ws_url(live, f"/v1/sandboxes/{other_id}/shell-ws"),
                    additional_headers={"X-Api-Key": token},
                ):
                    pass
            assert elsewhere.value.response.status_code == 404
        finally:
            await api.delete(f"/v1/sandboxes/{other_id}")
            await api.delete(f"/v1/sandboxes/{sid}/access-token")
