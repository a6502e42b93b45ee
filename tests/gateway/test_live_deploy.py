"""Deployments that really run: the gateway on real anvil chains, hosting on a live Paddock control plane
and host agent (``tests/live.py``), sandboxes on ``devbox:1`` under runc/crun.

What a user notices: the paid two-call flow ends with an endpoint that serves the uploaded app (static,
Python, Node), ``runEnvs``/``buildVars`` reach the app and never come back out, a failing build says why,
credits running out pauses the sandbox and a top-up resumes it, deleting the project destroys it.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
import uuid
import zipfile
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import select

from paddock_gateway.adapters.hosting import SandboxError
from paddock_gateway.adapters.paddock_sandboxes import PaddockSandboxProvider
from paddock_gateway.models import SandboxDeployment
from paddock_hostagent.images import ImageStore
from tests.gateway.conftest import (
    Chain,
    Gateway,
    Wallet,
    b64,
    chain_overrides,
    gateway_settings,
    new_wallet,
    running_gateway,
    unique_name,
)
from tests.hostagent.conftest import guest_binary_dir, image_cache
from tests.live import LivePlatform, plain_http_ingress, start_platform

__all__ = ["guest_binary_dir"]

pytestmark = [pytest.mark.root, pytest.mark.chain, pytest.mark.slow]

ROOTFS = "devbox:1"
ENDPOINT_RE = re.compile(r"^https?://(?P<port>\d+)-(?P<sandbox>sb-[0-9a-z]+)\.[^/]+$")


@pytest.fixture(scope="module")
def devbox_image() -> Path:
    return ImageStore(image_cache()).build(ROOTFS)


@pytest.fixture(scope="module")
def live(devbox_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    """The platform with its ingress proxy on plain HTTP at 127.0.0.1:<free port>, URLs
    ``http://<port>-<sandbox id>.sandbox.localhost:<ingress port>`` as ``paddock serve`` makes them."""
    platform = start_platform(guest_binary_dir, cp_env=plain_http_ingress())
    try:
        yield platform
    finally:
        platform.stop()


@pytest.fixture(scope="module")
def cp_key(live: LivePlatform) -> str:
    return live.api_key(plan="pro", credits=100_000)


@pytest.fixture
async def live_gateway(
    tmp_path: Path, devchains: dict[str, Chain], live: LivePlatform, cp_key: str
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        tmp_path,
        controlplane_url=live.url,
        api_key=cp_key,
        sandbox_rootfs=ROOTFS,
        rate_limit_requests=10_000,  # status is polled every 0.2 s here; the limit has its own tests
        ready_timeout_s=60.0,
        **chain_overrides(devchains),
    )
    provider = PaddockSandboxProvider(
        live.url, cp_key, shape=settings.sandbox_shape, rootfs=ROOTFS, timeout_s=180
    )
    async with running_gateway(settings, tmp_path, chains=devchains, provider=provider) as gw:
        yield gw


def project(name: str, files: dict[str, str], *, port: int = 3000, **settings: Any) -> dict[str, Any]:
    return {
        "uniqueName": name,
        "displayName": "Live " + name,
        "months": 1,
        "settings": {"port": port, **settings},
        "upload": {
            "type": "files",
            "files": [{"path": path, "content": b64(text)} for path, text in files.items()],
        },
    }


def sandbox_of(endpoint: str) -> tuple[str, int]:
    match = ENDPOINT_RE.match(endpoint)
    assert match, f"not an ingress URL: {endpoint}"
    return match["sandbox"], int(match["port"])


def sandbox_view(live: LivePlatform, key: str, sandbox_id: str) -> dict[str, Any]:
    with live.http(key) as http:
        response = http.get(f"/v1/sandboxes/{sandbox_id}")
    if response.status_code == 404:
        return {"status": "gone"}
    assert response.status_code == 200, response.text
    return dict(response.json()["data"])


def sandbox_status(live: LivePlatform, key: str, sandbox_id: str) -> str:
    return str(sandbox_view(live, key, sandbox_id)["status"])


async def wait_destroyed(live: LivePlatform, key: str, sandbox_id: str, timeout_s: float = 60) -> str:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (status := sandbox_status(live, key, sandbox_id)) == "destroying":
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    return status


def through_ingress(endpoint: str, path: str = "/") -> httpx.Response:
    """GET ``endpoint + path`` as a visitor does: the ingress proxy on loopback, the name in ``Host``
    (curl resolves ``*.localhost`` to 127.0.0.1 itself; Python's resolver does not)."""
    parts = urlsplit(endpoint)
    assert parts.scheme in ("http", "https") and parts.hostname and parts.hostname.endswith(".localhost"), (
        endpoint
    )
    tls = parts.scheme == "https"  # paddock serve's local CA: loopback, so the name goes in SNI unverified
    with httpx.Client(timeout=30, verify=not tls) as http:
        return http.get(
            f"{parts.scheme}://127.0.0.1:{parts.port}{path}",
            headers={"Host": parts.netloc},
            extensions={"sni_hostname": parts.hostname} if tls else None,
        )


def fetch(endpoint: str, path: str = "/") -> tuple[int, str]:
    response = through_ingress(endpoint, path)
    return response.status_code, response.text


def fetch_inside(live: LivePlatform, key: str, endpoint: str, path: str = "/") -> tuple[int, str]:
    """GET ``endpoint + path`` as seen from inside the sandbox (curl against 127.0.0.1:port)."""
    sandbox_id, port = sandbox_of(endpoint)
    with live.http(key) as http:
        ran = http.post(
            f"/v1/sandboxes/{sandbox_id}/exec",
            json={
                "cmd": "curl",
                "args": ["-s", "--max-time", "5", "-w", "\n%{http_code}", f"http://127.0.0.1:{port}{path}"],
            },
        )
    if ran.status_code != 200:
        return ran.status_code, ran.text
    body, _, code = ran.json()["data"]["result"]["stdout"].rpartition("\n")
    return int(code or 0), body


def test_the_host_reports_the_devbox_image(live: LivePlatform, cp_key: str) -> None:
    with live.http(cp_key) as http:
        hosts = http.get("/v1/hosts").json()["data"]["data"]
        catalog = http.get("/v1/rootfs").json()["data"]
    assert any(ROOTFS in (host.get("rootfses") or []) for host in hosts)
    assert ROOTFS in catalog["rootfs"]


async def pay_and_deploy(gw: Gateway, wallet: Wallet, body: dict[str, Any]) -> dict[str, Any]:
    """The two calls: the 402 quote, an ERC-20 transfer of the quoted amount, the paid retry."""
    base = gw.chains["base"]
    quote = await gw.deploy(wallet, body)
    assert quote.status_code == 402, quote.text
    tx_hash = await wallet.transfer(base, "usdc", int(quote.json()["amount_token"]))
    paid = await gw.deploy(wallet, body, **{"X-Payment-Tx": tx_hash})
    assert paid.status_code == 200, paid.text
    accepted = dict(paid.json())
    assert accepted["status"] == "deploying"
    return accepted


async def test_paid_deployments_run_on_the_platform_and_serve_the_upload(
    live_gateway: Gateway, paying_wallet: Wallet, live: LivePlatform, cp_key: str
) -> None:
    gw = live_gateway
    static = await pay_and_deploy(
        gw, paying_wallet, project(unique_name("static"), {"index.html": "<h1>static via paddock</h1>"})
    )

    secret = "s3cr3t-" + uuid.uuid4().hex
    python_app = (
        "import http.server, os, pathlib\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = ('greeting=' + os.environ.get('GREETING', '?') + ' built='\n"
        "                + pathlib.Path('built.txt').read_text().strip()\n"
        "                + ' token=' + str(os.environ.get('API_TOKEN') == os.environ.get('EXPECTED'))).encode()\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
        "http.server.HTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()\n"
    )
    python_body = project(
        unique_name("py"),
        {},
        port=8000,
        buildCommand='echo "$BUILD_LABEL" > built.txt',
        buildVars={"BUILD_LABEL": "label-42"},
        runEnvs={"GREETING": "hello python", "API_TOKEN": secret, "EXPECTED": secret},
    )
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("app.py", python_app)
    python_body["upload"] = {"type": "zip", "data": b64(archive.getvalue()), "filename": "py.zip"}
    python = await pay_and_deploy(gw, paying_wallet, python_body)
    node = await pay_and_deploy(
        gw,
        paying_wallet,
        project(
            unique_name("node"),
            {
                "README.md": "a monorepo; the app is under web/",
                "web/package.json": '{"name": "n", "scripts": {"start": "node src/server.js"}}',
                "web/src/server.js": (
                    "require('http').createServer((q, s) => s.end('node says ' + process.env.GREETING))"
                    ".listen(process.env.PORT);\n"
                ),
            },
            port=4000,
            directoryPath="web",
            runEnvs={"GREETING": "hi from node"},
        ),
    )

    finals = {
        kind: await gw.wait_terminal(paying_wallet, started["projectId"], started["deploymentId"], 180)
        for kind, started in (("static", static), ("python", python), ("node", node))
    }
    for kind, final in finals.items():
        assert final["status"] == "ready", (kind, final)
        sandbox_id, _ = sandbox_of(final["endpoint"])
        assert sandbox_status(live, cp_key, sandbox_id) == "running"
    assert sandbox_of(finals["python"]["endpoint"])[1] == 8000
    assert fetch(finals["static"]["endpoint"], "/index.html") == (
        200,
        "<h1>static via paddock</h1>",
    )
    assert fetch(finals["python"]["endpoint"]) == (
        200,
        "greeting=hello python built=label-42 token=True",
    )
    assert fetch(finals["node"]["endpoint"]) == (200, "node says hi from node")
    assert fetch_inside(live, cp_key, finals["node"]["endpoint"]) == (200, "node says hi from node")

    listing = await gw.projects(paying_wallet)
    urls = {item["url"] for item in listing["projects"]}
    assert urls == {final["endpoint"] for final in finals.values()}
    assert all(item["status"] == "active" for item in listing["projects"])

    # runEnvs are sealed at rest and never come back out of the gateway or into a platform log.
    assert secret not in str(listing)
    async with gw.services.sessions() as session:
        rows = list(await session.scalars(select(SandboxDeployment)))
    assert rows and all("sealed_env" in row.plan for row in rows)
    assert secret not in str([row.plan for row in rows])
    assert (tmp_db := Path(gw.settings.database_url.removeprefix("sqlite+aiosqlite:///"))).exists()
    assert secret.encode() not in tmp_db.read_bytes()
    assert secret not in live.controlplane.log_path.read_text(errors="replace")
    assert all(secret not in agent.log_path.read_text(errors="replace") for agent in live.agents)


async def test_a_failing_build_fails_with_the_log_tail(
    live_gateway: Gateway, live: LivePlatform, cp_key: str
) -> None:
    gw = live_gateway
    wallet = new_wallet()
    await gw.grant_credits(wallet, Decimal("20"))
    failing = project(
        unique_name("broken"),
        {
            "package.json": (
                '{"scripts": {"build": "echo compiling-step-1 && echo boom-marker >&2 && exit 3",'
                ' "start": "node x.js"}}'
            )
        },
    )
    started = (await gw.deploy(wallet, failing, **{"X-Use-Existing-Credits": "true"})).json()
    final = await gw.wait_terminal(wallet, started["projectId"], started["deploymentId"], 120)
    assert final["status"] == "failed", final
    assert final["reason"].startswith("build failed (`npm run build` exited with 3)")
    assert "boom-marker" in final["reason"] and "compiling-step-1" in final["reason"]

    crashing = project(unique_name("crash"), {"app.py": "raise SystemExit('crash-marker: no port for you')"})
    started = (await gw.deploy(wallet, crashing, **{"X-Use-Existing-Credits": "true"})).json()
    final = await gw.wait_terminal(wallet, started["projectId"], started["deploymentId"], 120)
    assert final["status"] == "failed", final
    assert "exited on port 3000" in final["reason"] and "crash-marker" in final["reason"]

    # Dockerfile deployments (built into templates): tests/gateway/test_live_dockerfile_deploy.py.


async def test_credits_run_out_pause_the_sandbox_topup_resumes_delete_destroys(
    tmp_path: Path, devchains: dict[str, Chain], live: LivePlatform, cp_key: str
) -> None:
    settings = gateway_settings(
        tmp_path,
        controlplane_url=live.url,
        api_key=cp_key,
        sandbox_rootfs=ROOTFS,
        rate_limit_requests=10_000,  # status is polled every 0.2 s here; the limit has its own tests
        static_monthly_usd=Decimal("7.30"),  # 0.01 USD = 1 credit per hour
        **chain_overrides(devchains),
    )
    provider = PaddockSandboxProvider(live.url, cp_key, shape=settings.sandbox_shape, rootfs=ROOTFS)
    async with running_gateway(settings, tmp_path, chains=devchains, provider=provider) as gw:
        metering = gw.services.metering
        assert metering is not None
        wallet = new_wallet()
        await gw.grant_credits(wallet, Decimal("7.30"))
        body = project(unique_name("meter"), {"index.html": "metered page"})
        started = (await gw.deploy(wallet, body)).json()
        ready = await gw.wait_terminal(wallet, started["projectId"], started["deploymentId"], 120)
        assert ready["status"] == "ready", ready
        sandbox_id, _ = sandbox_of(ready["endpoint"])
        assert fetch(ready["endpoint"]) == (200, "metered page")

        gw.clock.advance(hours=800)
        report = await metering.run_once()
        assert report.paused == [started["projectId"]]
        paused = sandbox_view(live, cp_key, sandbox_id)
        assert paused["status"] == "paused"
        assert paused["ingress_enabled"] is False  # traffic cannot wake a project without credits
        assert fetch_inside(live, cp_key, ready["endpoint"])[0] == 409  # a paused sandbox runs nothing
        visit = through_ingress(ready["endpoint"])  # and a visitor does not wake it
        assert visit.status_code == 404 and visit.headers["X-Paddock-Ingress-Error"]
        assert sandbox_status(live, cp_key, sandbox_id) == "paused"

        await gw.grant_credits(wallet, Decimal("1"))  # a top-up
        report = await metering.run_once()
        assert report.resumed == [started["projectId"]]
        resumed = sandbox_view(live, cp_key, sandbox_id)
        assert resumed["status"] == "running" and resumed["ingress_enabled"] is True
        assert fetch(ready["endpoint"]) == (200, "metered page")

        deleted = await gw.http.delete(f"/agent/projects/{started['projectId']}", headers=gw.auth(wallet))
        assert deleted.status_code == 200, deleted.text
        assert await wait_destroyed(live, cp_key, sandbox_id) in ("destroyed", "gone")
        with httpx.Client(base_url=live.url, headers={"X-API-Key": cp_key}) as http:
            running = http.get("/v1/sandboxes", params={"status": "running"}).json()["data"]["data"]
        assert sandbox_id not in {item["id"] for item in running}


WALKTHROUGH_APP = """\
import http.server, os

class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{os.environ.get('GREETING', 'hello')} from a paid Paddock deployment\\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer(("0.0.0.0", int(os.environ["PORT"])), Hello).serve_forever()
"""


async def democlient(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "paddock_gateway.democlient",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=300)
    return process.returncode or 0, stdout.decode(), stderr.decode()


async def test_the_readme_walkthrough(
    live_gateway: Gateway,
    paying_wallet: Wallet,
    devchains: dict[str, Chain],
    live: LivePlatform,
    cp_key: str,
    tmp_path: Path,
) -> None:
    """README "Deploy through the gateway": the democlient commands, as a person runs them."""
    app_dir = tmp_path / "hello"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(WALKTHROUGH_APP)
    devchain_file = tmp_path / "devchain.json"
    devchain_file.write_text(
        json.dumps(
            {
                "chains": {
                    name: {"chain_id": c.chain_id, "rpc_url": c.rpc_url, "tokens": c.tokens}
                    for name, c in devchains.items()
                },
                "demo_wallet": {"private_key": "0x" + bytes(paying_wallet.account.key).hex()},
            }
        )
    )
    common = ["--gateway", live_gateway.url, "--devchain", str(devchain_file)]
    name = unique_name("hello")
    code, out, err = await democlient(
        *common, "deploy", str(app_dir), "--name", name, "--port", "8000", "--env", "GREETING=hi"
    )
    assert code == 0, out + err
    assert "402 quote: 1.813947 USD" in out and "paid: 0x" in out
    final = json.loads(out[out.index("{") :])
    assert final["status"] == "ready"
    visit = await asyncio.create_subprocess_exec(
        "curl", "-s", final["endpoint"] + "/", stdout=asyncio.subprocess.PIPE
    )
    assert (await visit.communicate())[0] == b"hi from a paid Paddock deployment\n"  # as the README does

    code, out, _ = await democlient(*common, "projects")
    assert code == 0 and json.loads(out)["projects"][0]["url"] == final["endpoint"]
    code, out, _ = await democlient(*common, "delete", final["projectId"])
    assert code == 0 and json.loads(out) == {"projectId": final["projectId"], "status": "deleted"}
    assert await wait_destroyed(live, cp_key, sandbox_of(final["endpoint"])[0]) in ("destroyed", "gone")


class FailingCreates(httpx.AsyncBaseTransport):
    """The real control plane, except that the first ``failures`` creates answer like a failed boot."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.creates = 0
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/sandboxes":
            self.creates += 1
            if self.creates <= self.failures:
                body = {"status": "error", "message": "sandbox failed to boot: internal error"}
                return httpx.Response(500, json=body, request=request)
        return await self.inner.handle_async_request(request)


async def test_a_failed_boot_is_tried_again(live: LivePlatform, cp_key: str) -> None:
    flaky = FailingCreates(failures=1)
    provider = PaddockSandboxProvider(live.url, cp_key, shape="s-1vcpu-256mb", rootfs=ROOTFS, transport=flaky)
    try:
        sandbox = await provider.create(name="retry")
        assert flaky.creates == 2 and sandbox_status(live, cp_key, sandbox.id) == "running"
        await sandbox.destroy()
        broken = PaddockSandboxProvider(
            live.url, cp_key, shape="s-1vcpu-256mb", rootfs=ROOTFS, transport=FailingCreates(9)
        )
        with pytest.raises(SandboxError, match="failed to boot"):
            await broken.create(name="never")
        await broken.aclose()
    finally:
        await provider.aclose()
