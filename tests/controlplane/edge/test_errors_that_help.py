"""Errors that say what to do, as a user meets them: against a real control plane on 127.0.0.1 (host
seam faked), through raw HTTP, the SDK and the CLI (a subprocess configured by the environment).

- An unknown body field stays ignored (spec §2.2) but is named in a ``Warning: 299`` header, which the
  SDK raises as a ``paddock.PaddockWarning`` and the CLI prints as a ``warning:`` line.
- A 400 states its message once; no key names ``PADDOCK_API_KEY``; a server that is down is named by
  the URL that was tried.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import warnings

import httpx
import pytest

import paddock
from tests.cli.test_sandbox_cli import Cli
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import api, fake_host
from tests.ports import free_port

__all__ = ["api", "fake_host"]

pytestmark = pytest.mark.db

SHAPE = "s-1vcpu-1gb"


async def test_unknown_body_fields_are_ignored_but_named(api: httpx.AsyncClient) -> None:
    resp = await api.post("/v1/sandboxes", json={"shape": SHAPE, "envz": {"A": "b"}, "labelz": []})
    assert resp.status_code == 200, resp.text  # still ignored: a client of the contract sees no change
    assert resp.headers["warning"] == (
        "299 - \"unknown field 'envz' ignored\", 299 - \"unknown field 'labelz' ignored\""
    )
    sid = resp.json()["data"]["id"]
    assert "warning" not in (await api.post("/v1/sandboxes", json={"shape": SHAPE})).headers

    # an optional body (exec through its route, not the fast lane) and a PATCH are named too
    ran = await api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true", "cwdd": "/tmp"})
    assert ran.status_code == 200 and ran.headers["warning"] == "299 - \"unknown field 'cwdd' ignored\""
    patched = await api.patch(f"/v1/sandboxes/{sid}", json={"ingress_enable": True})
    assert patched.headers["warning"] == "299 - \"unknown field 'ingress_enable' ignored\""

    # a hostile name is cut, quoted safely and bounded in number
    many = {f'x"\\\n{i}' + "y" * 200: 1 for i in range(15)}
    header = (await api.post("/v1/sandboxes", json={"shape": SHAPE, **many})).headers["warning"]
    assert header.count("unknown field '") == 10 and '299 - "5 more unknown fields ignored"' in header
    assert "\n" not in header and len(header) < 1200


async def test_the_sdk_and_the_cli_show_the_warning(
    controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user()
    async with paddock.AsyncClient(controlplane.url, key) as client:
        with pytest.raises(TypeError, match="envz"):  # the typed SDK refuses it before sending (issue 31)
            await client.sandboxes.create(SHAPE, envz={"A": "b"})  # type: ignore[call-arg]
        with pytest.warns(paddock.PaddockWarning, match="unknown field 'envz' ignored"):
            made = await client.request("POST", "v1/sandboxes", json={"shape": SHAPE, "envz": {"A": "b"}})
        sb = await client.sandboxes.get(made["id"])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await sb.refresh()  # no warning without a reason
    script = (
        "import sys, paddock; from paddock_cli import output; output.show_server_warnings();"
        "paddock.Client(sys.argv[1], sys.argv[2]).request('POST', 'v1/sandboxes',"
        " json={'shape': 's-1vcpu-1gb', 'envz': {}})"
    )
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script, controlplane.url, key],
        capture_output=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.decode() == "warning: 299 - \"unknown field 'envz' ignored\"\n"


async def test_a_400_no_key_and_a_server_down_say_what_to_do(
    controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user()
    down = f"http://127.0.0.1:{free_port()}"  # a port nothing listens on

    def work() -> None:
        bad = Cli(controlplane.url, key)("sandbox", "create", "--shape", "no-such-shape")
        err = bad.stderr.decode()
        assert bad.returncode == 1 and err.count("unknown shape") == 1, err  # was stated twice

        keyless = Cli(controlplane.url, key)
        del keyless.env["PADDOCK_API_KEY"]
        refused = keyless("sandbox", "ls")
        assert refused.returncode == 1 and "PADDOCK_API_KEY" in refused.stderr.decode()

        gone = Cli(down, key)("sandbox", "ls")
        assert gone.returncode == 3 and down in gone.stderr.decode(), gone.stderr

    await asyncio.to_thread(work)
    async with paddock.AsyncClient(controlplane.url, "") as client:
        with pytest.raises(paddock.AuthenticationError, match="PADDOCK_API_KEY"):
            await client.sandboxes.list()
    async with paddock.AsyncClient(down, key, retry=paddock.RetryPolicy(max_retries=0)) as client:
        with pytest.raises(paddock.TransportError, match=down.replace(".", r"\.")):
            await client.sandboxes.list()


async def test_did_you_mean_and_the_setting_that_allows_a_private_target(api: httpx.AsyncClient) -> None:
    shape = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1bg"})).json()["data"]
    assert shape["shape"] == "unknown shape 's-1vcpu-1bg' (did you mean 's-1vcpu-1gb'?); see GET /v1/shapes"
    image = (await api.post("/v1/sandboxes", json={"shape": SHAPE, "rootfs": "debian:31"})).json()["data"]
    assert "unknown image 'debian:31' (did you mean 'debian:13'?)" in image["rootfs"]
    far = (await api.post("/v1/sandboxes", json={"shape": "zzzz"})).json()["data"]
    assert "did you mean" not in far["shape"]

    hook = await api.post("/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/hook"})
    assert hook.status_code == 400
    assert "PADDOCK_CP_WEBHOOK_ALLOW_PRIVATE_TARGETS=true" in hook.json()["data"]["url"]


async def test_a_failed_template_says_why_and_sizes_read_in_mib(
    controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    _, key = await controlplane.new_user()
    headers = {"X-Api-Key": key}
    body = {"name": "broken", "dockerfile": "FROM debian:13\nRUN FAIL\n"}
    created = (await controlplane.http.post("/v1/templates", json=body, headers=headers)).json()["data"]
    good = {"name": "fine", "dockerfile": "FROM debian:13\nENV A=1\n"}
    await controlplane.http.post("/v1/templates", json=good, headers=headers)
    for _ in range(200):
        views = (await controlplane.http.get("/v1/templates", headers=headers)).json()["data"]["data"]
        if {v["status"] for v in views} <= {"ready", "failed"} and len(views) == 2:
            break
        await asyncio.sleep(0.05)
    view = (await controlplane.http.get(f"/v1/templates/{created['id']}", headers=headers)).json()["data"]
    assert view["status"] == "failed" and view["error"]  # why, in the view itself

    cli = Cli(controlplane.url, key)
    listed = await asyncio.to_thread(cli, "template", "ls")
    out = listed.stdout.decode()
    assert listed.returncode == 0 and "SIZE_MIB" in out and "ERROR" in out, listed.stderr
    broken_row = next(line for line in out.splitlines() if "broken" in line)
    assert view["error"].strip().splitlines()[0][:40] in broken_row
    shown = (await asyncio.to_thread(cli, "template", "get", "broken")).stdout.decode()
    assert "error" in shown and view["error"].strip().splitlines()[0][:40] in shown
    fine = next(v for v in views if v["name"] == "fine")
    fine_row = next(line for line in out.splitlines() if " fine " in line)
    assert fine["ext4_size_bytes"] == 4096 and " 0.0 " in fine_row  # the fake host's 4 KiB, in MiB
