"""Prometheus metrics (issue 35): a real Prometheus server (Debian's ``prometheus``) scrapes the control
plane, a host agent and the gateway, and PromQL answers the sandbox count and the create latency after
sandboxes are created; ``/metrics`` refuses a non-loopback scraper without the token; no label carries
an id or a key."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from paddock_core import metrics
from paddock_hostagent.app import api_app
from tests.gateway.conftest import Gateway, gateway
from tests.hostagent.conftest import TOKEN, debian_image, guest_binary_dir
from tests.live import LivePlatform, start_platform
from tests.ports import free_port

__all__ = ["debian_image", "gateway", "guest_binary_dir"]

SHAPE = "s-1vcpu-256mb"
OUTSIDE = ("203.0.113.7", 40000)  # TEST-NET-3: an address that is not loopback


# -- access and labels, in process ----------------------------------------------------------------


def tiny_app(telemetry: metrics.ServiceMetrics) -> Starlette:
    async def thing(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/things/{thing_id}", thing)])
    metrics.install(app, telemetry)
    return app


async def get_metrics(app: Any, client: tuple[str, int], **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=client)
    async with httpx.AsyncClient(transport=transport, base_url="http://paddock.test") as http:
        return await http.get("/metrics", headers=headers)


async def test_metrics_refuse_a_non_loopback_scraper_without_the_token() -> None:
    app = tiny_app(metrics.ServiceMetrics("test", token="scrape-token-123"))
    assert (await get_metrics(app, ("127.0.0.1", 5000))).status_code == 200
    refused = await get_metrics(app, OUTSIDE)
    assert refused.status_code == 401
    assert "PADDOCK_METRICS_TOKEN" in refused.text
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert (await get_metrics(app, OUTSIDE, authorization="Bearer wrong-token")).status_code == 401
    allowed = await get_metrics(app, OUTSIDE, authorization="Bearer scrape-token-123")
    assert allowed.status_code == 200
    assert "paddock_http_requests_total" in allowed.text


async def test_metrics_without_a_token_are_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PADDOCK_METRICS_TOKEN", raising=False)
    app = api_app(lambda header: header == f"Bearer {TOKEN}")  # the host agent's API, no lifespan
    refused = await get_metrics(app, OUTSIDE, authorization=f"Bearer {TOKEN}")  # the API token is not it
    assert refused.status_code == 403
    assert "loopback" in refused.text
    assert (await get_metrics(app, ("127.0.0.1", 5000))).status_code == 200


async def test_metrics_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PADDOCK_METRICS_TOKEN", "env-scrape-token")
    app = api_app(lambda header: False)
    assert (await get_metrics(app, OUTSIDE)).status_code == 401
    assert (await get_metrics(app, OUTSIDE, authorization="Bearer env-scrape-token")).status_code == 200


async def test_paddock_metrics_0_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PADDOCK_METRICS", "0")
    app = api_app(lambda header: False)
    assert (await get_metrics(app, ("127.0.0.1", 5000))).status_code == 404


async def test_routes_are_counted_by_template_never_by_path() -> None:
    telemetry = metrics.ServiceMetrics("test")
    app = tiny_app(telemetry)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://paddock.test") as http:
        for thing_id in ("sb_secretish_1", "sb_secretish_2"):
            assert (await http.get(f"/v1/things/{thing_id}")).status_code == 200
        assert (await http.get("/no/such/sb_unrouted")).status_code == 404
        assert (await http.request("PROPFIND", "/v1/things/sb_secretish_3")).status_code == 405
        text = (await http.get("/metrics")).text
    assert "sb_" not in text
    line = 'paddock_http_requests_total{method="GET",route="/v1/things/{thing_id}",service="test",status="200"} 2.0'
    assert line in text
    assert 'route="<unmatched>"' in text
    assert 'method="OTHER",route="/v1/things/{thing_id}",service="test",status="405"' in text


def test_fast_route_templates() -> None:
    assert (
        metrics.route_template(r"/v1/sandboxes/(?P<sandbox_id>[^/]+)/exec")
        == "/v1/sandboxes/{sandbox_id}/exec"
    )


# -- a real Prometheus server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    live = start_platform(guest_binary_dir)
    try:
        yield live
    finally:
        live.stop()


@contextlib.asynccontextmanager
async def prometheus(tmp_path: Path, targets: dict[str, str]) -> AsyncIterator[str]:
    """Debian's ``prometheus`` with its own config and storage under ``tmp_path`` on a free loopback
    port, scraping each ``/metrics`` URL every second; stopped (and its storage removed) on exit."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: scripts/setup-host.sh --test installs it"
    jobs = "".join(
        f"  - job_name: {job}\n    metrics_path: /metrics\n    static_configs:\n      - targets: ['{address}']\n"
        for job, address in targets.items()
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}")
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            for _ in range(300):
                assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{url}/-/ready")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("prometheus did not become ready in 30 s")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)


async def query(http: httpx.AsyncClient, url: str, promql: str) -> list[dict[str, Any]]:
    response = await http.get(f"{url}/api/v1/query", params={"query": promql})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


async def until(http: httpx.AsyncClient, url: str, promql: str, ok: Any, timeout_s: float = 60) -> list[Any]:
    """Polls ``promql`` until ``ok(result)``; fails naming the query and its last answer."""
    result: list[Any] = []
    for _ in range(int(timeout_s * 2)):
        result = await query(http, url, promql)
        if ok(result):
            return result
        await asyncio.sleep(0.5)
    raise AssertionError(f"{promql} never satisfied the test in {timeout_s} s; last answer: {result}")


def value(result: list[dict[str, Any]]) -> float:
    return float(result[0]["value"][1]) if result else float("nan")


@pytest.mark.root
@pytest.mark.slow
async def test_prometheus_scrapes_every_service(
    platform: LivePlatform, gateway: Gateway, tmp_path: Path
) -> None:
    key = await asyncio.to_thread(platform.api_key)
    targets = {
        "controlplane": platform.url.removeprefix("http://"),
        "hostagent": platform.agents[0].url.removeprefix("http://"),
        "gateway": gateway.url.removeprefix("http://"),
    }
    async with (
        prometheus(tmp_path, targets) as prom,
        httpx.AsyncClient(base_url=platform.url, headers={"X-API-Key": key}, timeout=120) as api,
        httpx.AsyncClient(timeout=10) as http,
    ):
        # Every target scraped once before the creates, so that rate() sees them as an increase.
        up = await until(http, prom, "up", lambda r: len(r) == 3 and all(value([s]) == 1 for s in r))
        assert {sample["metric"]["job"] for sample in up} == set(targets)
        ids = []
        for _ in range(2):
            created = await api.post("/v1/sandboxes", json={"shape": SHAPE})
            assert created.status_code == 200 and created.json()["data"]["status"] == "running", created.text
            ids.append(created.json()["data"]["id"])
        try:
            for sandbox_id in ids:  # a fast-lane read of each, counted under its template
                got = await api.get(f"/v1/sandboxes/{sandbox_id}")
                assert got.status_code == 200 and got.json()["data"]["status"] == "running", got.text
            assert (await gateway.http.get("/agent/projects")).status_code == 401  # a gateway request

            running = await until(
                http, prom, 'paddock_sandboxes{state="running"}', lambda r: r and value(r) >= 2
            )
            assert value(running) >= 2
            creates = await until(
                http,
                prom,
                'sum(paddock_sandbox_operation_duration_seconds_count{op="create"})',
                lambda r: r and value(r) >= 2,
            )
            assert value(creates) >= 2
            p50 = await until(
                http,
                prom,
                "histogram_quantile(0.5, sum by (le) "
                '(rate(paddock_sandbox_operation_duration_seconds_bucket{op="create"}[1m])))',
                lambda r: r and 0 < value(r) < 120,
            )
            assert 0 < value(p50) < 120  # seconds: a create's latency, not NaN
            fast = await until(
                http,
                prom,
                'sum(paddock_http_requests_total{job="controlplane",route="/v1/sandboxes/{sandbox_id}",'
                'method="GET",status="200"})',
                lambda r: r and value(r) >= 2,
            )
            assert value(fast) >= 2
            request_p50 = await until(
                http,
                prom,
                "histogram_quantile(0.5, sum by (le) "
                '(rate(paddock_http_request_duration_seconds_bucket{job="controlplane"}[1m])))',
                lambda r: r and 0 < value(r) < 30,
            )
            assert 0 < value(request_p50) < 30  # the control plane's request latency, in seconds
            memory = await until(
                http,
                prom,
                "paddock_host_memory_promised_bytes",
                lambda r: r and value(r) >= 2 * 256 * (1 << 20),
            )
            assert value(memory) >= 2 * 256 * (1 << 20)  # both sandboxes' 256 MiB limits are promised
            gateway_requests = await until(
                http, prom, 'sum(paddock_http_requests_total{job="gateway"})', lambda r: r and value(r) >= 1
            )
            assert value(gateway_requests) >= 1

            # No label anywhere holds a sandbox id, the API key or the host token.
            for url in (platform.url, platform.agents[0].url, gateway.url):
                text = (await http.get(f"{url}/metrics")).text
                assert "paddock_http_requests_total" in text
                for secret in (*ids, key, TOKEN):
                    assert secret not in text, f"{url}/metrics holds {secret[:6]}…"
        finally:
            for sandbox_id in ids:
                await api.delete(f"/v1/sandboxes/{sandbox_id}")
