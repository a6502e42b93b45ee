"""The §12.2 routes on the control plane: shapes, validation (400 naming the field), 404/409 mapping.

The host is the unit seam (``FakeHostLink``); tests/terminals runs the same routes against real
sandboxes and a real guest agent.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import api, fake_host

__all__ = ["api", "fake_host"]

pytestmark = pytest.mark.db


@pytest.fixture
async def sid(api: httpx.AsyncClient) -> str:
    created = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
    assert created.status_code == 200, created.text
    return str(created.json()["data"]["id"])


async def test_start_list_get_and_the_managed_process_shape(api: httpx.AsyncClient, sid: str) -> None:
    started = await api.post(f"/v1/sandboxes/{sid}/processes", json={"pty": {"rows": 30, "cols": 100}})
    assert started.status_code == 200, started.text
    proc = started.json()["data"]
    required = {"process_id", "kind", "pid", "state", "leader_exited", "tree_exited", "created_at", "output"}
    assert required <= proc.keys() and proc["kind"] == "pty"
    assert set(proc["output"]) == {"oldest_seq", "newest_seq", "bytes"}
    listed = (await api.get(f"/v1/sandboxes/{sid}/processes")).json()["data"]
    assert [p["process_id"] for p in listed["processes"]] == [proc["process_id"]]
    got = await api.get(f"/v1/sandboxes/{sid}/processes/{proc['process_id']}")
    assert got.json()["data"]["process_id"] == proc["process_id"]


async def test_bad_input_names_the_field(api: httpx.AsyncClient, sid: str) -> None:
    base = f"/v1/sandboxes/{sid}/processes"
    no_cmd = await api.post(base, json={})
    assert no_cmd.status_code == 400 and "cmd" in no_cmd.text
    rows = await api.post(base, json={"cmd": "bash", "pty": {"rows": 0}})
    assert rows.status_code == 400 and "rows" in rows.text
    proc = (await api.post(base, json={"cmd": "sleep", "args": ["9"]})).json()["data"]["process_id"]
    bad_signal = await api.post(f"{base}/{proc}/signal", json={"signal": "SIGSTOP"})
    assert bad_signal.status_code == 400 and "signal" in bad_signal.text
    bad_scope = await api.get(f"{base}/{proc}/wait", params={"scope": "forest"})
    assert bad_scope.status_code == 400 and "scope" in bad_scope.text
    bad_grace = await api.delete(f"{base}/{proc}", params={"grace_ms": "-1"})
    assert bad_grace.status_code == 400 and "grace_ms" in bad_grace.text
    bad_after = await api.get(f"{base}/{proc}/connect", params={"after": "x"})
    assert bad_after.status_code == 400 and "after" in bad_after.text
    no_data = await api.post(f"{base}/{proc}/input", json={})
    assert no_data.status_code == 400 and "data_base64" in no_data.text


async def test_unknown_process_is_404_and_resizing_a_pipe_is_409(api: httpx.AsyncClient, sid: str) -> None:
    base = f"/v1/sandboxes/{sid}/processes"
    missing = await api.get(f"{base}/proc_nope")
    assert missing.status_code == 404 and missing.json()["status"] == "fail"
    proc = (await api.post(base, json={"cmd": "sleep", "args": ["9"]})).json()["data"]["process_id"]
    resize = await api.post(f"{base}/{proc}/resize", json={"rows": 10})
    assert resize.status_code == 409, resize.text
    other = await api.get("/v1/sandboxes/sb_doesnotexist/processes")
    assert other.status_code == 404


async def test_input_stdin_close_signal_kill_and_the_stream(api: httpx.AsyncClient, sid: str) -> None:
    base = f"/v1/sandboxes/{sid}/processes"
    proc = (await api.post(base, json={"cmd": "cat"})).json()["data"]["process_id"]
    sent = await api.post(f"{base}/{proc}/input", json={"data_base64": "aGkK"})
    assert sent.status_code == 200 and isinstance(sent.json()["data"]["input_seq"], int)
    closed = await api.post(f"{base}/{proc}/stdin/close")  # no body, no Content-Type
    assert closed.json()["data"] == {"ok": True}
    signalled = (await api.post(f"{base}/{proc}/signal", json={"signal": "SIGINT"})).json()["data"]
    assert signalled["signal"] == "SIGINT" and signalled["state"] == "exited"
    async with api.stream("GET", f"{base}/{proc}/connect", params={"after": 0}) as resp:
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) async for line in resp.aiter_lines() if line.strip()]
    assert [line["type"] for line in lines] == ["data", "exit"]
    assert lines[0]["data_base64"] == "aGkK"
    killed = (await api.delete(f"{base}/{proc}", params={"grace_ms": 0})).json()["data"]
    assert killed["signal"] == "SIGKILL"


async def test_bad_base64_is_400_and_an_unreachable_host_503(
    api: httpx.AsyncClient, sid: str, fake_host: FakeHostLink
) -> None:
    base = f"/v1/sandboxes/{sid}/processes"
    proc = (await api.post(base, json={"cmd": "cat"})).json()["data"]["process_id"]
    bad = await api.post(f"{base}/{proc}/input", json={"data_base64": "not base64!"})
    assert bad.status_code == 400 and "data_base64" in bad.text
    fake_host.processes_host_down = True
    down = await api.post(base, json={"cmd": "cat"})
    assert down.status_code == 503 and down.headers.get("Retry-After"), down.text
    assert (await api.get(f"{base}/{proc}")).status_code == 503
