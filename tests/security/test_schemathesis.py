"""schemathesis (v4, the CLI a user would run) against both services' served OpenAPI documents.

Each run fails the build on any 5xx but the contract's capacity and busy 503s (schemathesis.toml), a status or content type the document does not list, a body or
header that violates the documented schema, or a wrong method answered without 405 + ``Allow``. The
requests carry real ids (a sandbox on a real host agent, a network, a webhook endpoint; a project and
deployment on the gateway) through ``schemathesis_hooks.py``, which also signs gateway requests.
Bounded: a fixed number of examples per operation and a time budget per run.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import requests
import schemathesis
from eth_account import Account
from fastapi import FastAPI

from paddock_controlplane.app import create_app as create_controlplane
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core import errors
from paddock_gateway.app import create_app as create_gateway
from paddock_hostagent import client as hostclient
from tests.gateway.conftest import (
    Chain,
    chain_overrides,
    devchains,
    gateway_settings,
    new_wallet,
    running_gateway,
    static_site,
    unique_name,
)
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform
from tests.sdk.conftest import live
from tests.security import schemathesis_hooks

__all__ = ["debian_image", "devchains", "guest_binary_dir", "live"]

CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "unsupported_method",
        "a_503_is_a_retryable_capacity_or_busy_answer",  # schemathesis_hooks.py
    )
)
#: Lets the contract's capacity and busy 503s past ``not_a_server_error``; the check above holds them to that.
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
REPO = Path(__file__).resolve().parents[2]


def apps(tmp_path: Path) -> dict[str, FastAPI]:
    """Both services' apps as served (no lifespan: routing, error rendering and the document only)."""
    return {
        "controlplane": create_controlplane(ControlPlaneSettings(host_token="t" * 32, secret_key="s" * 32)),
        "gateway": create_gateway(gateway_settings(tmp_path)),
    }


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test")


async def test_documents_list_the_statuses_sent_each_in_its_envelope(tmp_path: Path) -> None:
    served = {}
    for service, app in apps(tmp_path).items():
        async with client(app) as http:
            served[service] = document = (await http.get("/openapi.json")).json()
        for path, item in document["paths"].items():
            for method, operation in item.items():
                where = f"{service} {method.upper()} {path}"
                statuses = set(operation["responses"])
                assert "422" not in statuses, where  # validation answers 400
                assert "500" in statuses, where
                if "{" in path:
                    assert "404" in statuses, where
                if service == "controlplane":
                    # Any body may be over its cap or too slow (bodylimit); any path parameter holding
                    # NUL is a 400 naming it (BoundaryRoute).
                    if "requestBody" in operation:
                        assert {"408", "413"} <= statuses, where
                    if "{" in path:
                        assert "400" in statuses, where
                for status, response in operation["responses"].items():
                    if int(status) >= 400 and (service, path, status) != ("controlplane", "/readyz", "503"):
                        body = response["content"]["application/json"]["schema"]
                        if service == "controlplane":  # JSend; the gateway's routes name their own bodies
                            assert body["$ref"].endswith("/Error" if int(status) >= 500 else "/Fail"), where
    cp = served["controlplane"]
    exec_op = cp["paths"]["/v1/sandboxes/{sandbox_id}/exec"]["post"]
    assert (
        exec_op["security"] == [{"ApiKey": []}]
        and "application/x-ndjson" in exec_op["responses"]["200"]["content"]
    )
    body_ref = exec_op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert cp["components"]["schemas"][body_ref.rsplit("/", 1)[1]]["required"] == ["cmd"]
    assert "security" not in cp["paths"]["/v1/shapes"]["get"]


def test_the_fuzz_runs_let_past_only_the_contracts_capacity_and_busy_503s() -> None:
    """schemathesis.toml stops counting 503 as a server error; the hooks' check must then refuse every
    503 but the control plane's retryable "no host with capacity" and its busy sandbox, each with
    Retry-After."""

    def answer(
        status: int, body: Mapping[str, object], headers: dict[str, list[str]]
    ) -> schemathesis.Response:
        request = requests.Request("POST", "http://test/v1/sandboxes/x/resize").prepare()
        content = json.dumps(body).encode()
        return schemathesis.Response(
            status, {"content-type": ["application/json"], **headers}, content, request, 0.01, True
        )

    def judged(response: schemathesis.Response) -> str:
        try:
            schemathesis_hooks.a_503_is_a_retryable_capacity_or_busy_answer(None, response, None)  # type: ignore[arg-type]
        except AssertionError as exc:
            return f"refused: {exc}"
        return "passed"

    capacity = {
        "status": "error",
        "message": "no host with capacity: host h1: 1596 MiB requested",
        "code": 503,
    }
    assert judged(answer(503, capacity, {"retry-after": ["2"]})) == "passed"
    assert judged(answer(503, capacity, {})).startswith("refused: a capacity or busy 503 without Retry-After")
    # The busy sandbox as the control plane renders it (hostlink's mapping of the host's 503 busy).
    busy_error = hostlink.domain_error(hostclient.HostBusyError("busy"))
    assert isinstance(busy_error, errors.Unavailable) and busy_error.retry_after_s
    busy = {"status": "error", "message": busy_error.message, "code": 503}
    assert judged(answer(503, busy, {"retry-after": ["1"]})) == "passed"
    assert judged(answer(503, busy, {})).startswith("refused: a capacity or busy 503 without Retry-After")
    for message in ("database unavailable", f"{busy_error.message} later", "the sandbox is busy"):
        other = {"status": "error", "message": message, "code": 503}
        assert judged(answer(503, other, {"retry-after": ["2"]})).startswith(
            "refused: a 503 that is neither capacity nor busy"
        ), message
    gateway = {"error": "rpc unavailable"}
    assert judged(answer(503, gateway, {"retry-after": ["2"]})).startswith(
        "refused: 503 outside the error envelope"
    )
    assert judged(answer(500, other, {})) == "passed", "a 500 is not_a_server_error's to refuse"
    config = tomllib.loads(CONFIG.read_text())
    assert config["checks"]["not_a_server_error"]["expected-statuses"] == ["2xx", "3xx", "4xx", "503"]


async def test_a_wrong_method_gets_405_with_allow(tmp_path: Path) -> None:
    services = apps(tmp_path)
    async with client(services["controlplane"]) as http:
        cp = await http.put("/v1/shapes")
    assert cp.status_code == 405 and cp.headers["allow"] == "GET"
    assert cp.json()["data"]["code"] == "METHOD_NOT_ALLOWED"
    async with client(services["gateway"]) as http:
        gw = await http.put("/agent/chains")
    assert gw.status_code == 405 and gw.headers["allow"] == "GET"
    assert gw.json()["code"] == "method_not_allowed"


def schemathesis_command(
    url: str, *, max_examples: int, max_time_s: int, headers: dict[str, str]
) -> list[str]:
    argv = [
        str(SCHEMATHESIS),
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/openapi.json",
        "--checks",
        CHECKS,
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        str(max_examples),
        "--max-time",
        str(max_time_s),
        "--workers",
        "1",
        "--seed",
        "12",
        "--request-timeout",
        "60",
        "--suppress-health-check",
        "all",
        "--no-color",
    ]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    return argv


def hook_env(ids: dict[str, str], wallet_key: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "SCHEMATHESIS_HOOKS": "tests.security.schemathesis_hooks",
            "PYTHONPATH": str(REPO),
            "PDK_ST_IDS": json.dumps(ids),
        }
    )
    if wallet_key:
        env["PDK_ST_WALLET_KEY"] = wallet_key
    return env


def assert_clean(ran: subprocess.CompletedProcess[str], elapsed_s: float) -> None:
    report = ran.stdout + ran.stderr
    print(f"schemathesis took {elapsed_s:.0f} s\n{report[-6000:]}")
    assert ran.returncode == 0, report[-20000:]


@pytest.mark.slow
def test_controlplane_conforms_to_its_openapi(live: LivePlatform, tmp_path: Path) -> None:
    key = live.api_key(plan="pro", credits=10_000)
    with live.http(key) as http:

        def data(response: httpx.Response) -> dict[str, str]:
            assert response.status_code == 200, response.text
            return dict(response.json()["data"])

        small = {"shape": "s-1vcpu-256mb", "disk_mib": 2048}
        sandbox = data(http.post("/v1/sandboxes", json={**small, "name": "st-main"}))
        victim = data(http.post("/v1/sandboxes", json={**small, "name": "st-victim"}))
        network = data(http.post("/v1/networks", json={"name": "st-net"}))
        data(http.post(f"/v1/sandboxes/{sandbox['id']}/networks", json={"id": network["id"]}))
        endpoint = data(http.post("/v1/webhook-endpoints", json={"url": "https://hooks.example.com/st"}))
        # The tree the file operations' paths are put under (schemathesis_hooks.FILES_ROOT).
        tree = f"mkdir -p {schemathesis_hooks.FILES_ROOT}/d && echo hi > {schemathesis_hooks.FILES_ROOT}/d/f"
        made = http.post(f"/v1/sandboxes/{sandbox['id']}/exec", json={"cmd": "sh", "args": ["-c", tree]})
        assert made.status_code == 200 and made.json()["data"]["result"]["exit_code"] == 0, made.text
    ids = {
        "sandbox_id": sandbox["id"],
        "victim_sandbox_id": victim["id"],
        "network_id": network["id"],
        "endpoint_id": endpoint["id"],
        "ip": sandbox["ip"],
    }
    started = time.monotonic()
    ran = subprocess.run(
        schemathesis_command(live.url, max_examples=20, max_time_s=120, headers={"X-Api-Key": key}),
        env=hook_env(ids),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert_clean(ran, time.monotonic() - started)


@pytest.mark.slow
async def test_gateway_conforms_to_its_openapi(tmp_path: Path, devchains: dict[str, Chain]) -> None:
    wallet = new_wallet()
    # Real anvil chains, so a balance read is not a 502; and the contract's 30 requests a minute would
    # turn most of the run into (documented) 429s.
    settings = gateway_settings(tmp_path, rate_limit_requests=1_000_000, **chain_overrides(devchains))
    async with running_gateway(settings, tmp_path, chains=devchains) as gateway:
        await gateway.grant_credits(wallet, Decimal("50"))
        deployed = await gateway.deploy(
            wallet,
            static_site(unique_name("st"), "<h1>hi</h1>", port=8000),
            **{"X-Use-Existing-Credits": "true"},
        )
        assert deployed.status_code == 200, deployed.text
        body = deployed.json()
        ids = {
            "projectId": body["projectId"],
            "deploymentId": body["deploymentId"],
            "address": wallet.address,
        }
        key = "0x" + bytes(wallet.account.key).hex()
        assert Account.from_key(key).address == wallet.address
        argv = schemathesis_command(gateway.url, max_examples=20, max_time_s=60, headers={})
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=hook_env(ids, key),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=600)
    ran = subprocess.CompletedProcess(argv, process.returncode or 0, out.decode(), err.decode())
    assert_clean(ran, time.monotonic() - started)
