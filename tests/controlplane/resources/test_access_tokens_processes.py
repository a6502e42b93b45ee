"""§12.1 lets a delegated access token drive its own sandbox's managed processes (§12.2): the process
routes take the same sandbox-scoped principal as exec, so another sandbox's processes are 404."""

from __future__ import annotations

import httpx
import pytest

from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.resources.test_access_tokens import as_token, fail, issue, new_sandbox
from tests.controlplane.sandboxes.test_sandboxes_rules import api, fake_host

__all__ = ["api", "fake_host"]

pytestmark = pytest.mark.db


async def test_a_token_drives_its_own_processes_only(api: httpx.AsyncClient, fake_host: FakeHostLink) -> None:
    sid = await new_sandbox(api)
    other = await new_sandbox(api)
    token = as_token((await issue(api, sid))["token"])
    started = await api.post(
        f"/v1/sandboxes/{sid}/processes", json={"cmd": "sleep", "args": ["9"]}, headers=token
    )
    assert started.status_code == 200, started.text
    process_id = started.json()["data"]["process_id"]
    listed = await api.get(f"/v1/sandboxes/{sid}/processes", headers=token)
    assert [p["process_id"] for p in listed.json()["data"]["processes"]] == [process_id]
    got = await api.get(f"/v1/sandboxes/{sid}/processes/{process_id}", headers=token)
    assert got.status_code == 200 and got.json()["data"]["process_id"] == process_id

    owners = await api.post(f"/v1/sandboxes/{other}/processes", json={"cmd": "sleep", "args": ["9"]})
    assert owners.status_code == 200, owners.text
    theirs = owners.json()["data"]["process_id"]
    fail(await api.get(f"/v1/sandboxes/{other}/processes", headers=token), 404, "NOT_FOUND")
    fail(await api.get(f"/v1/sandboxes/{other}/processes/{theirs}", headers=token), 404, "NOT_FOUND")
    fail(
        await api.post(f"/v1/sandboxes/{other}/processes", json={"cmd": "true"}, headers=token),
        404,
        "NOT_FOUND",
    )
    fail(await api.delete(f"/v1/sandboxes/{other}/processes/{theirs}", headers=token), 404, "NOT_FOUND")
