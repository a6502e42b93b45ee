"""Prometheus metrics for a Paddock service: the families, the request middleware and ``GET /metrics``.

Each service (control plane, host agent, gateway) makes one ``ServiceMetrics`` in its app factory
(``from_env``) and wraps its app in ``MetricsMiddleware`` (``install``), outermost, so that every
request is counted and timed, the fast lane's too. The middleware serves ``GET /metrics`` itself,
outside FastAPI's routing, so the endpoint is in no OpenAPI document.

- Every request: ``paddock_http_requests_total{service,route,method,status}`` and
  ``paddock_http_request_duration_seconds{service,route,method}``. ``route`` is the route's template
  (``/v1/sandboxes/{sandbox_id}``), never the raw path: a path holds ids, and a label per id would grow
  without bound. A request no route matched counts under ``route="<unmatched>"``. The fast lane's routes
  are tagged with their template once (``tag_fast_routes``); the counters for a (route, method, status)
  are made on first use and kept in a dict, so a request costs one dict lookup, one ``inc`` and one
  ``observe``.
- Gauges a service can only read from its state (sandboxes by state, a host's capacity) are set by
  *refreshers*, async functions the service registers, run just before each scrape answers.
- Operations whose latency is the latency of one API call (a create, a fork, a pause) are observed
  from the request itself into ``paddock_sandbox_operation_duration_seconds{op}`` (``ops``: the
  (method, route template) of each, counted when it succeeds).

Access: ``/metrics`` answers any request from loopback (where ``make run`` binds every service). From
anywhere else it needs ``Authorization: Bearer <PADDOCK_METRICS_TOKEN>`` (a 401 without it); with no
token configured a non-loopback request gets a 403 that says so. ``PADDOCK_METRICS=0`` turns all of it
off (no middleware, no ``/metrics``; ``bench/metrics_bench.py`` measures the difference).

No label ever carries a secret, a key, a tenant's env, an id or a raw path: routes are templates,
methods and statuses are bounded, and the gauges' labels are states the service defines.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import re
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from paddock_core.fastlane import ASGIApp, FastRoute, Handler, Receive, Scope, Send
from paddock_core.logging import get_logger

log = get_logger("paddock.metrics")

#: The scope key a fast-lane route's template is put under (``tag_fast_routes``).
ROUTE_KEY = "paddock.route"
UNMATCHED = "<unmatched>"
#: Request latency buckets, in seconds: a cached read takes ~1 ms, an exec a few, a create seconds.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Sandbox operation buckets: a warm create is a fraction of a second, a cold VM create tens.
OPERATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: A refresher that takes longer is abandoned for this scrape (its gauges keep their last values).
REFRESH_TIMEOUT_S = 5.0
LOOPBACK = ("127.", "::1", "::ffff:127.")
#: Methods counted under their own name; any other counts as ``OTHER`` (a label a client cannot grow).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

Refresher = Callable[[], Awaitable[None]]


def enabled() -> bool:
    """``PADDOCK_METRICS=0`` (or ``false``/``off``) turns the metrics off."""
    return os.environ.get("PADDOCK_METRICS", "1").strip().lower() not in {"0", "false", "off", "no"}


class RequestCollector(Collector):
    """``paddock_http_requests_total`` and ``paddock_http_request_duration_seconds``, kept as plain
    numbers per (route, method, status) and turned into families only when scraped.

    prometheus_client's own Counter and Histogram take a lock per increment and walk the buckets in
    Python: ~3 µs per request, a share of a fast-lane read a p50 shows. Here a request is a dict lookup,
    two additions and a bisect (~0.5 µs). No lock is needed: the event loop's thread is the only writer,
    and the scrape reads in that thread too (``exposition`` runs in the loop, without awaiting while it
    reads)."""

    def __init__(self, service: str) -> None:
        self.service = service
        #: (route, method, status) → [count, sum of seconds, count per bucket (not cumulative; +Inf last)]
        self.series: dict[tuple[str, str, int], list[Any]] = {}

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "paddock_http_requests",
            "HTTP requests answered, by route template, method and status.",
            labels=["service", "route", "method", "status"],
        )
        durations = HistogramMetricFamily(
            "paddock_http_request_duration_seconds",
            "Time from a request's arrival to the end of its answer, by route template and method.",
            labels=["service", "route", "method"],
        )
        merged: dict[tuple[str, str], list[Any]] = {}
        for (route, method, status), (count, total, buckets) in list(self.series.items()):
            requests.add_metric([self.service, route, method, str(status)], count)
            into = merged.setdefault((route, method), [0.0, [0] * len(buckets)])
            into[0] += total
            into[1] = [a + b for a, b in zip(into[1], buckets, strict=True)]
        for (route, method), (total, buckets) in merged.items():
            cumulative, running = [], 0
            for bound, count in zip((*(repr(b) for b in REQUEST_BUCKETS), "+Inf"), buckets, strict=True):
                running += count
                cumulative.append((bound, running))
            durations.add_metric([self.service, route, method], cumulative, total)
        yield requests
        yield durations


class ServiceMetrics:
    """One service's registry and families. ``ops`` maps a (method, route template) to the sandbox
    operation its successful requests time, e.g. ``{("POST", "/v1/sandboxes"): "create"}``."""

    def __init__(
        self, service: str, *, token: str = "", ops: Mapping[tuple[str, str], str] | None = None
    ) -> None:
        self.service = service
        self.token = token.encode()
        self.ops = dict(ops or {})
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = RequestCollector(service)
        self.registry.register(self.requests)
        self.operation_duration = (
            Histogram(
                "paddock_sandbox_operation_duration_seconds",
                "Latency of successful sandbox operations (create, fork, pause, resume, destroy) as the "
                "API answered them.",
                ["op"],
                buckets=OPERATION_BUCKETS,
                registry=self.registry,
            )
            if self.ops
            else None
        )
        if self.operation_duration is not None:
            for op in set(self.ops.values()):  # exported at 0 from the start, so rate() sees the first ones
                self.operation_duration.labels(op)
        self._ops: dict[tuple[str, str, int], Any] = {}  # (route, method, status) → the op's histogram
        self._refreshers: list[Refresher] = []

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge in this service's registry (set by a refresher)."""
        return Gauge(name, documentation, list(labels), registry=self.registry)

    def add_refresher(self, refresher: Refresher) -> None:
        self._refreshers.append(refresher)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        if method not in METHODS:
            method = "OTHER"
        key = (route, method, status)
        series = self.requests.series.get(key)
        if series is None:
            series = self.requests.series[key] = [0, 0.0, [0] * (len(REQUEST_BUCKETS) + 1)]
            op = self.ops.get((method, route))
            if op and self.operation_duration is not None and status < 400:
                self._ops[key] = self.operation_duration.labels(op)
        series[0] += 1
        series[1] += seconds
        series[2][bisect_left(REQUEST_BUCKETS, seconds)] += 1
        if self._ops and key in self._ops:
            self._ops[key].observe(seconds)

    async def exposition(self) -> bytes:
        """The text format, after the refreshers have run (each bounded; a failing one is logged and
        its gauges keep their last values)."""
        for refresher in self._refreshers:
            try:
                await asyncio.wait_for(refresher(), REFRESH_TIMEOUT_S)
            except Exception as exc:  # a scrape still answers with what it has
                log.warning("metrics_refresh_failed", service=self.service, error=repr(exc))
        return generate_latest(self.registry)

    def allows(self, scope: Scope) -> int:
        """200 if this request may read the metrics, else the status that refuses it."""
        client = scope.get("client")
        host = str(client[0]) if client else ""
        if host.startswith(LOOPBACK) or host == "localhost":
            return 200
        if not self.token:
            return 403
        scheme, _, presented = _header(scope, b"authorization").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), self.token):
            return 200
        return 401


def from_env(service: str, *, ops: Mapping[tuple[str, str], str] | None = None) -> ServiceMetrics | None:
    """The service's metrics, or None when ``PADDOCK_METRICS=0``; the scrape token from
    ``PADDOCK_METRICS_TOKEN``."""
    if not enabled():
        return None
    return ServiceMetrics(service, token=os.environ.get("PADDOCK_METRICS_TOKEN", ""), ops=ops)


def route_template(pattern: str) -> str:
    """A fast route's regex as a route template: ``/v1/sandboxes/(?P<sandbox_id>[^/]+)`` →
    ``/v1/sandboxes/{sandbox_id}``."""
    return re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern)


def tag_fast_routes(metrics: ServiceMetrics | None, routes: Iterable[FastRoute]) -> list[FastRoute]:
    """The fast lane's routes, each putting its template in the scope before it answers, so the
    middleware counts it under the template without matching the path again. Unchanged without metrics."""
    if metrics is None:
        return list(routes)
    return [
        FastRoute(route.method, route.path, _tagged(route.handler, route_template(route.path)))
        for route in routes
    ]


def _tagged(handler: Handler, template: str) -> Handler:
    async def tagged(scope: Scope, params: dict[str, str], body: bytes, receive: Receive) -> ASGIApp | None:
        scope[ROUTE_KEY] = template
        return await handler(scope, params, body, receive)

    return tagged


class MetricsMiddleware:
    """Counts and times every HTTP request (``ServiceMetrics.observe``) and answers ``GET /metrics``."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/metrics":
            await self.serve(scope, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get(ROUTE_KEY)
            if route is None:
                matched = scope.get("route")
                route = getattr(matched, "path", None) or UNMATCHED
            self.metrics.observe(route, scope["method"], status, time.perf_counter() - started)

    async def serve(self, scope: Scope, send: Send) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            await _answer(
                send, 405, b"method not allowed: /metrics answers GET\n", [(b"allow", b"GET, HEAD")]
            )
            return
        allowed = self.metrics.allows(scope)
        if allowed == 401:
            await _answer(
                send,
                401,
                b"/metrics needs Authorization: Bearer <PADDOCK_METRICS_TOKEN> from a non-loopback address\n",
                [(b"www-authenticate", b'Bearer realm="metrics"')],
            )
            return
        if allowed == 403:
            await _answer(
                send,
                403,
                b"/metrics is served to loopback only: set PADDOCK_METRICS_TOKEN to scrape from elsewhere\n",
            )
            return
        body = await self.metrics.exposition()
        await _answer(send, 200, b"" if scope["method"] == "HEAD" else body, content_type=CONTENT_TYPE_LATEST)


def install(app: Any, metrics: ServiceMetrics | None) -> None:
    """Wraps ``app`` (a Starlette/FastAPI app) in the metrics middleware: call it after every other
    ``add_middleware`` so that it is outermost. Nothing without metrics."""
    if metrics is not None:
        app.state.metrics = metrics
        app.add_middleware(MetricsMiddleware, metrics=metrics)


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    content_type: str = "text/plain; charset=utf-8",
) -> None:
    head = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return ""
