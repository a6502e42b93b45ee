"""Credentials a service depends on are checked before they can cost anyone money (issue #12).

The case that was found: a data directory first served on SQLite, then pointed at PostgreSQL, kept a
bootstrap key the new database never issued; the gateway started with it and every paid deploy verified
the payment, topped up and then failed upstream (401). Here: ``paddock serve``'s key check provisions a
key the running control plane knows, the gateway refuses to start with a key the control plane refuses,
and a key that stops working later makes the gateway refuse deploys before quoting or taking a payment —
the payment made meanwhile is still good once the key works again.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from paddock_cli import serve
from paddock_controlplane.records.models import ApiKey
from paddock_core.db import make_engine, make_sessionmaker, transaction
from paddock_core.timeutil import utcnow
from paddock_gateway import credits
from paddock_gateway.adapters.paddock_sandboxes import PaddockSandboxProvider
from paddock_gateway.models import Payment
from tests.conftest import LiveServer, fresh_database
from tests.controlplane.conftest import HOST_TOKEN, ControlPlane, controlplane, cp_settings
from tests.gateway.conftest import (
    RECIPIENT,
    UNREACHABLE_RPC,
    Chain,
    Gateway,
    Wallet,
    chain_overrides,
    devchains,
    gateway_settings,
    new_wallet,
    paying_wallet,
    running_gateway,
    static_site,
    unique_name,
)
from tests.gateway.test_live_deploy import through_ingress
from tests.hostagent.conftest import debian_image, image_cache, private_subnet
from tests.ports import free_port
from tests.security.fakeagent_support import FakeAgent

__all__ = ["controlplane", "cp_settings", "debian_image", "devchains", "paying_wallet"]

pytestmark = pytest.mark.db

#: A well-formed key that no database issued (what a data dir carries over to a new database).
FOREIGN_KEY = "pdk_" + "x" * 43
#: The API key's auth cache lives this long (``hot_cache_ttl_s``); a revocation is seen after it.
AUTH_CACHE_S = 1.2


def admin_env(cp: ControlPlane) -> dict[str, str]:
    return {**os.environ, "PADDOCK_CP_DATABASE_URL": cp.settings.database_url}


async def whoami(cp: ControlPlane, key: str) -> int:
    resp = await cp.http.get("/v1/whoami", headers={"X-Api-Key": key})
    return resp.status_code


async def test_serve_replaces_a_saved_key_the_database_does_not_know(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    saved = tmp_path / "bootstrap-api-key"
    saved.write_text(FOREIGN_KEY + "\n")
    key = await asyncio.to_thread(serve.bootstrap_key, tmp_path, admin_env(controlplane), controlplane.url)
    assert key != FOREIGN_KEY
    assert await whoami(controlplane, key) == 200
    assert saved.read_text().strip() == key and stat.S_IMODE(saved.stat().st_mode) == 0o600
    # The next start keeps the key the database knows.
    again = await asyncio.to_thread(serve.bootstrap_key, tmp_path, admin_env(controlplane), controlplane.url)
    assert again == key


async def run_gateway(cp: ControlPlane, key: str, data_dir: Path) -> tuple[asyncio.subprocess.Process, int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_GW_PORT": str(port),
            "PADDOCK_GW_DATA_DIR": str(data_dir),
            "PADDOCK_GW_RECIPIENT": RECIPIENT,
            "PADDOCK_GW_RPC_URL_BASE": UNREACHABLE_RPC,
            "PADDOCK_GW_RPC_URL_ARBITRUM": UNREACHABLE_RPC,
            "PADDOCK_GW_RPC_TIMEOUT_S": "1",
            "PADDOCK_GW_CONTROLPLANE_URL": cp.url,
            "PADDOCK_GW_API_KEY": key,
        }
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "paddock_cli.main",
        "gateway",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    return process, port


async def test_the_gateway_refuses_to_start_with_a_key_the_control_plane_refuses(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    process, _ = await run_gateway(controlplane, FOREIGN_KEY, tmp_path / "refused")
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode != 0
    text = output.decode(errors="replace")
    assert "refuses the gateway's API key (PADDOCK_GW_API_KEY)" in text, text[-3000:]
    assert FOREIGN_KEY not in text  # the key itself is never printed

    _, key = await controlplane.new_user("pro")
    process, port = await run_gateway(controlplane, key, tmp_path / "accepted")
    try:
        assert await healthy(process, f"http://127.0.0.1:{port}/health"), "the gateway did not start"
    finally:
        process.terminate()
        await process.wait()


async def healthy(process: asyncio.subprocess.Process, url: str, timeout_s: float = 60) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient(timeout=2) as http:
        while asyncio.get_running_loop().time() < deadline and process.returncode is None:
            try:
                if (await http.get(url)).status_code == 200:
                    return True
            except httpx.TransportError:
                pass  # not listening yet
            await asyncio.sleep(0.2)
    return False


@pytest.fixture
async def agent() -> AsyncIterator[FakeAgent]:
    fake = FakeAgent("host-a")
    async with LiveServer(fake.app()) as server:
        fake.url = server.url
        yield fake


async def set_revoked(cp: ControlPlane, user_id: str, revoked: bool) -> None:
    engine = make_engine(cp.settings.database_url)
    try:
        async with transaction(make_sessionmaker(engine)) as session:
            await session.execute(
                update(ApiKey)
                .where(ApiKey.user_id == user_id)
                .values(revoked_at=utcnow() if revoked else None)
            )
    finally:
        await engine.dispose()
    await asyncio.sleep(AUTH_CACHE_S)


@pytest.mark.chain
async def test_a_key_that_stops_working_blocks_quotes_and_payments_and_the_payment_stays_good(
    controlplane: ControlPlane,
    agent: FakeAgent,
    tmp_path: Path,
    devchains: dict[str, Chain],
    paying_wallet: Wallet,
) -> None:
    beat = await controlplane.http.post(
        "/internal/v1/hosts/heartbeat", json=agent.beat(), headers={"Authorization": f"Bearer {HOST_TOKEN}"}
    )
    assert beat.status_code == 200
    user_id, key = await controlplane.new_user("pro", credits=100_000)
    settings = gateway_settings(
        tmp_path, controlplane_url=controlplane.url, api_key=key, **chain_overrides(devchains)
    )
    provider = PaddockSandboxProvider(controlplane.url, key, shape=settings.sandbox_shape, rootfs="devbox:1")
    async with running_gateway(settings, tmp_path, chains=devchains, provider=provider) as gw:
        body = static_site(unique_name("cred"), "<h1>hi</h1>", port=3000)
        quote = await gw.deploy(paying_wallet, body)
        assert quote.status_code == 402, quote.text

        await set_revoked(controlplane, user_id, True)
        refused_quote = await gw.deploy(paying_wallet, body)
        assert refused_quote.status_code == 502, refused_quote.text
        assert refused_quote.json()["code"] == "upstream_unavailable"
        tx_hash = await paying_wallet.transfer(devchains["base"], "usdc", int(quote.json()["amount_token"]))
        refused = await gw.deploy(paying_wallet, body, **{"X-Payment-Tx": tx_hash})
        assert refused.status_code == 502, refused.text
        assert refused.json()["code"] == "upstream_unavailable"
        assert await payment_of(gw, tx_hash) is None  # not verified, not recorded, not credited
        assert await balance(gw, paying_wallet) == 0
        assert agent.created() == []

        await set_revoked(controlplane, user_id, False)
        paid = await gw.deploy(paying_wallet, body, **{"X-Payment-Tx": tx_hash})
        assert paid.status_code == 200, paid.text
        assert paid.json()["status"] == "deploying"
        payment = await payment_of(gw, tx_hash)
        assert payment is not None and payment.state == "deployed"
        assert len(agent.created()) == 1


async def payment_of(gw: Gateway, tx_hash: str) -> Payment | None:
    async with gw.services.sessions() as session:
        return await session.get(Payment, tx_hash.lower())


async def balance(gw: Gateway, wallet: Wallet) -> int:
    async with gw.services.sessions() as session:
        return await credits.balance_micro(session, wallet.address.lower())


async def destroy_all(cp_url: str, key: str, timeout_s: float = 60) -> None:
    """Destroy every sandbox of ``key``'s user and wait until each is ``destroyed``."""
    async with httpx.AsyncClient(base_url=cp_url, headers={"X-Api-Key": key}, timeout=30) as http:
        listed = await http.get("/v1/sandboxes", params={"limit": 100})
        assert listed.status_code == 200, listed.text
        ids = [sb["id"] for sb in listed.json()["data"]["data"] if sb["status"] != "destroyed"]
        for sandbox_id in ids:
            gone = await http.delete(f"/v1/sandboxes/{sandbox_id}")
            assert gone.status_code in (200, 202, 404), gone.text
        deadline = time.monotonic() + timeout_s
        for sandbox_id in ids:
            while True:
                view = await http.get(f"/v1/sandboxes/{sandbox_id}")
                if view.status_code == 404 or view.json()["data"]["status"] == "destroyed":
                    break
                assert time.monotonic() < deadline, f"{sandbox_id} not destroyed: {view.text}"
                await asyncio.sleep(0.2)


def serve_chain(data_dir: Path, name: str) -> Chain:
    """The chain ``paddock serve`` started for its gateway (``<data dir>/devchain/devchain.json``)."""
    info = json.loads((data_dir / "devchain" / "devchain.json").read_text())["chains"][name]
    return Chain(name=name, chain_id=info["chain_id"], rpc_url=info["rpc_url"], tokens=info["tokens"])


async def deployment_outcome(
    http: httpx.AsyncClient, gw_url: str, wallet: Wallet, started: dict[str, Any], *, timeout_s: float
) -> dict[str, Any]:
    """The deployment's status once it is no longer ``deploying``; fails the test if it never gets there."""
    url = f"{gw_url}/agent/deploy/{started['projectId']}/{started['deploymentId']}/status"
    deadline = time.monotonic() + timeout_s
    while True:
        resp = await http.get(url, headers=wallet.auth(int(time.time() * 1000)))
        if resp.status_code == 429:  # the gateway's per-wallet rate limit: wait as it says, as a client would
            assert time.monotonic() < deadline, f"still rate limited after {timeout_s} s: {resp.text}"
            await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))
            continue
        assert resp.status_code == 200, resp.text
        body = dict(resp.json())
        if body["status"] != "deploying":
            return body
        assert time.monotonic() < deadline, f"still deploying after {timeout_s} s: {body}"
        await asyncio.sleep(0.5)


def start_serve(env: dict[str, str], out_path: Path) -> subprocess.Popen[bytes]:
    with open(out_path, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "paddock_cli.main", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 300
    while "Stop with Ctrl-C." not in out_path.read_text(errors="replace"):
        assert process.poll() is None, out_path.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "serve did not start"
        time.sleep(0.5)
    return process


def stop_serve(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.root
@pytest.mark.slow
async def test_serve_first_on_sqlite_then_on_postgresql_runs_with_a_key_the_new_database_knows(
    debian_image: Path, tmp_path: Path
) -> None:
    # Every listener serve opens gets a port of its own: its defaults (8443 for the ingress's TLS, 2222
    # for SSH) would meet another serve on this machine, a developer's or another test's.
    names = ("CP", "HOST", "GW", "CP_INGRESS", "CP_INGRESS_TLS", "CP_SSH", "CP_E2B", "CP_E2B_EDGE")
    # A short data dir: the sandboxes' unix sockets live under it, and a socket's path holds at most 107
    # bytes (pytest's tmp_path, numbered per run, grew past that on the CI machine).
    data_dir = Path(tempfile.mkdtemp(prefix="pdkc-", dir="/tmp"))
    ports = {name: free_port() for name in names}
    nft_table = f"pdkcred{secrets.token_hex(3)}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PADDOCK_")}
    env.update({f"PADDOCK_{name}_PORT": str(port) for name, port in ports.items()})
    env.update(
        {
            "PADDOCK_DATA_DIR": str(data_dir),
            "PADDOCK_HOST_SUBNET": private_subnet(),
            "PADDOCK_HOST_NFT_TABLE": nft_table,
            "PADDOCK_HOST_IMAGE_DIR": str(image_cache()),
            "PADDOCK_HOST_POOL_SIZE": "0",
        }
    )
    cp_url, gw_url = f"http://127.0.0.1:{ports['CP']}", f"http://127.0.0.1:{ports['GW']}"
    key_file = data_dir / "bootstrap-api-key"
    try:
        first = await asyncio.to_thread(start_serve, env, tmp_path / "sqlite.out")
        try:
            sqlite_key = key_file.read_text().strip()
            async with httpx.AsyncClient(timeout=30) as http:
                resp = await http.get(f"{cp_url}/v1/whoami", headers={"X-Api-Key": sqlite_key})
                assert resp.status_code == 200
        finally:
            await asyncio.to_thread(stop_serve, first)
        for name in ("controlplane.db", "gateway.db"):
            assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE((data_dir).stat().st_mode) == 0o700

        async with (
            fresh_database("postgresql", tmp_path) as cp_db,
            fresh_database("postgresql", tmp_path) as gw_db,
        ):
            switched = {**env, "PADDOCK_CP_DATABASE_URL": cp_db, "PADDOCK_GW_DATABASE_URL": gw_db}
            second = await asyncio.to_thread(start_serve, switched, tmp_path / "pg.out")
            try:
                pg_key = key_file.read_text().strip()
                assert pg_key != sqlite_key
                assert "saved bootstrap key is unknown" in (tmp_path / "pg.out").read_text()
                async with httpx.AsyncClient(timeout=30) as http:
                    resp = await http.get(f"{cp_url}/v1/whoami", headers={"X-Api-Key": pg_key})
                    assert resp.status_code == 200
                    # The gateway runs (it would have refused to start on a key the control plane
                    # refuses), and a deploy gets its quote rather than a 502 before payment.
                    wallet = new_wallet()
                    site = static_site(unique_name("switch"), "<h1>switched</h1>", port=3000)
                    deploy = await http.post(
                        f"{gw_url}/agent/deploy", json=site, headers=wallet.auth(int(time.time() * 1000))
                    )
                    assert deploy.status_code == 402, deploy.text
                    # What the issue found broken: a paid deploy, end to end, on the switched databases.
                    quote = deploy.json()
                    chain = serve_chain(data_dir, quote["payment_chain"])
                    await wallet.fund(chain)
                    tx_hash = await wallet.transfer(
                        chain, "usdc", int(quote["amount_token"]), to=quote["pay_to"]
                    )
                    paid = await http.post(
                        f"{gw_url}/agent/deploy",
                        json=site,
                        headers={**wallet.auth(int(time.time() * 1000)), "X-Payment-Tx": tx_hash},
                    )
                    assert paid.status_code == 200, paid.text
                    final = await deployment_outcome(http, gw_url, wallet, paid.json(), timeout_s=180)
                    assert final["status"] == "ready", final
                    served = await asyncio.to_thread(through_ingress, final["endpoint"], "/index.html")
                    assert (served.status_code, served.text) == (200, "<h1>switched</h1>")
            finally:
                # Sandboxes outlive serve by design (a restarted agent adopts them): end the deploy's.
                try:
                    await destroy_all(cp_url, key_file.read_text().strip())
                finally:
                    await asyncio.to_thread(stop_serve, second)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        subprocess.run(["nft", "delete", "table", "ip", nft_table], check=False, capture_output=True)
        subprocess.run(
            ["nft", "delete", "table", "ip", f"{nft_table}_egress"], check=False, capture_output=True
        )
