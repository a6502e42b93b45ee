"""SSH keys added through a sandbox's access token belong to that token (docs/access-tokens.md): the SSH
gateway's key check accepts them only while the token that added them is enabled. Keys added with the
account's key are the sandbox's and outlive any token.

The gateway's check (``GatewayServer.validate_public_key``, what asyncssh calls for every key a client
offers) runs here on both engines with a hand-moved clock, for expiry; tests/terminals/test_live_ssh.py
shows the same through OpenSSH against a live platform.
"""

from __future__ import annotations

import asyncssh
import httpx
import pytest

from paddock_controlplane.edge import sshgate
from tests.controlplane.conftest import Clocked, user_client

pytestmark = pytest.mark.db


def new_key() -> tuple[str, asyncssh.SSHKey]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    return key.export_public_key().decode().strip(), key.convert_to_public()


async def opens(clocked: Clocked, sandbox_id: str, key: asyncssh.SSHKey) -> bool:
    return bool(await sshgate.GatewayServer(clocked.services).validate_public_key(sandbox_id, key))


async def add(http: httpx.AsyncClient, sandbox_id: str, line: str, key: str | None = None) -> httpx.Response:
    headers = {"X-API-Key": key} if key else {}
    return await http.post(f"/v1/sandboxes/{sandbox_id}/ssh-pubkeys", json={"keys": [line]}, headers=headers)


async def token_of(http: httpx.AsyncClient, sandbox_id: str, path: str = "access-token", **body: int) -> str:
    issued = await http.post(f"/v1/sandboxes/{sandbox_id}/{path}", json=body or None)
    assert issued.status_code == 200, issued.text
    return str(issued.json()["data"]["token"])


async def test_keys_added_through_a_token_stop_with_it_and_the_accounts_stay(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        account_line, account_key = new_key()
        made = await http.post(
            "/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "ssh_pubkeys": [account_line]}
        )
        sandbox_id = made.json()["data"]["id"]
        agent_line, agent_key = new_key()

        token = await token_of(http, sandbox_id, expires_in_seconds=600)
        added = await add(http, sandbox_id, agent_line, token)
        assert added.status_code == 200 and added.json()["data"] == {"count": 2}, added.text
        assert await opens(clocked, sandbox_id, agent_key) and await opens(clocked, sandbox_id, account_key)
        # Expired: checked at each connection, no job needed.
        clocked.clock.advance(601)
        assert not await opens(clocked, sandbox_id, agent_key)
        assert await opens(clocked, sandbox_id, account_key)

        # The owner sees which keys the token added; the sandbox's own list holds the account's only.
        shown = (await http.get(f"/v1/sandboxes/{sandbox_id}/access-token")).json()["data"]
        assert shown["ssh_pubkeys"] == [agent_line]
        assert (await http.get(f"/v1/sandboxes/{sandbox_id}")).json()["data"]["ssh_pubkeys"] == [account_line]

        # A new token starts with no keys; rotating it stops those added through the old generation,
        # and a principal of the old generation cannot add more (it is refused, not merged).
        token = await token_of(http, sandbox_id)
        assert not await opens(clocked, sandbox_id, agent_key)
        assert (await add(http, sandbox_id, agent_line, token)).status_code == 200
        assert await opens(clocked, sandbox_id, agent_key)
        await token_of(http, sandbox_id, "access-token/rotate")
        assert not await opens(clocked, sandbox_id, agent_key)
        assert (await add(http, sandbox_id, agent_line, token)).status_code == 401

        # Disabled: the same.
        disabled_token = await token_of(http, sandbox_id, "access-token/rotate")
        late_line, late_key = new_key()
        assert (await add(http, sandbox_id, late_line, disabled_token)).status_code == 200
        assert await opens(clocked, sandbox_id, late_key)
        assert (await http.delete(f"/v1/sandboxes/{sandbox_id}/access-token")).status_code == 200
        assert not await opens(clocked, sandbox_id, late_key)

        # A key the account adds is the sandbox's, token or none.
        added = await add(http, sandbox_id, agent_line)
        assert added.status_code == 200 and added.json()["data"] == {"count": 2}
        assert await opens(clocked, sandbox_id, agent_key)

        # Destroyed: nothing opens it.
        assert (await http.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 200
        await clocked.status(http, sandbox_id, "destroyed")
        assert not await opens(clocked, sandbox_id, account_key)


async def test_a_sandbox_holds_a_bounded_number_of_keys(clocked: Clocked) -> None:
    _, http = await user_client(clocked)
    async with http:
        made = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb"})
        sandbox_id = made.json()["data"]["id"]
        lines = [new_key()[0] for _ in range(101)]
        too_many = await http.post(f"/v1/sandboxes/{sandbox_id}/ssh-pubkeys", json={"keys": lines})
        assert too_many.status_code == 400, too_many.text
        assert "keys" in too_many.json()["data"], too_many.text
        token = await token_of(http, sandbox_id)
        through_token = await http.post(
            f"/v1/sandboxes/{sandbox_id}/ssh-pubkeys", json={"keys": lines}, headers={"X-API-Key": token}
        )
        assert through_token.status_code == 400 and "keys" in through_token.json()["data"]
        fits = await http.post(f"/v1/sandboxes/{sandbox_id}/ssh-pubkeys", json={"keys": lines[:100]})
        assert fits.status_code == 200 and fits.json()["data"] == {"count": 100}
