"""What the audit trail costs the exec hot path: buffered exec p50/p90 with it on and off, in one run.

    .venv/bin/python -m bench.audit_overhead [--requests 400] [--rounds 6]

A control plane (in this process, on a SQLite file) whose host is the tests' fake (tests/controlplane/
fakehost.py), so what is timed is the control plane's own work per exec: the API event, the command
event and their queueing, with the writer flushing every 0.5 s as deployed. "Off" swaps the middleware
for a pass-through and ``AuditLog.record`` for a no-op; rounds alternate so both see the same machine.
Prints p50 / p90 in ms per mode and the difference; never fails on a time. On a loaded box the
wall times swing by more than the difference, so it also prints the CPU each part costs, measured
alone: the middleware per request (against a bare app), and the writer's digest per API event.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from pydantic import SecretStr
from tests.conftest import LiveServer
from tests.controlplane.fakehost import HOST_BEAT, FakeHostLink

from paddock_controlplane.app import create_app, migrate
from paddock_controlplane.edge import auditing
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import audit
from paddock_controlplane.resources import accounts
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.db import make_engine, make_sessionmaker, transaction
from paddock_core.timeutil import utcnow

TOKEN = "bench-host-token-0123456789"
ON_CALL, ON_RECORD = auditing.AuditMiddleware.__call__, audit.AuditLog.record


async def passthrough(self: Any, scope: Any, receive: Any, send: Any) -> None:
    await self.app(scope, receive, send)


def no_record(self: Any, *args: Any, **kwargs: Any) -> None:
    return None


def switch(on: bool) -> None:
    auditing.AuditMiddleware.__call__ = ON_CALL if on else passthrough  # type: ignore[method-assign]
    audit.AuditLog.record = ON_RECORD if on else no_record  # type: ignore[method-assign]


async def run(requests: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="pdk-audit-bench-") as tmp:
        settings = ControlPlaneSettings(
            database_url=f"sqlite+aiosqlite:///{tmp}/cp.db",
            data_dir=Path(tmp) / "cp",
            host_token=SecretStr(TOKEN),
            secret_key=SecretStr("bench-secret-key-0123456789"),
            host_dead_after_s=10**9,  # the fake host sends no heartbeats after the first
        )
        await migrate(settings)
        engine = make_engine(settings.database_url)
        async with transaction(make_sessionmaker(engine)) as session:
            user = await accounts.create_user(session, plan_id="pro", signup_credits=500)
            key = (await accounts.create_key(session, user.id)).plaintext
        await engine.dispose()
        link = FakeHostLink()

        async def for_host(services: object, host_id: str | None) -> FakeHostLink:
            return link

        hostlink.for_host = for_host  # type: ignore[assignment]
        app = create_app(settings)
        async with LiveServer(app) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            await http.post(
                "/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers={"Authorization": f"Bearer {TOKEN}"}
            )
            http.headers["X-Api-Key"] = key
            created = await http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
            sid = created.json()["data"]["id"]
            body = {"cmd": "true", "args": ["--flag", "value"], "env": {}}
            samples: dict[bool, list[float]] = {True: [], False: []}
            medians: dict[bool, list[float]] = {True: [], False: []}
            for index in range(rounds * 2):
                on = index % 4 in (1, 2)  # off, on, on, off, …: neither always goes first
                switch(on)
                for n in range(requests + 50):
                    started = time.perf_counter()
                    resp = await http.post(f"/v1/sandboxes/{sid}/exec", json=body)
                    elapsed = (time.perf_counter() - started) * 1000
                    if resp.status_code != 200:
                        raise RuntimeError(resp.text)
                    if n >= 50:
                        samples[on].append(elapsed)
                medians[on].append(statistics.median(samples[on][-requests:]))
            switch(True)
            recorded = (
                await http.get(f"/v1/sandboxes/{sid}/audit", params={"kind": "command", "limit": 1})
            ).json()
            assert recorded["data"]["items"], "the audit trail recorded the commands"
        for on in (False, True):
            values = sorted(samples[on])
            p50, p90 = statistics.median(values), values[int(len(values) * 0.9)]
            print(
                f"audit {'on ' if on else 'off'}: exec p50 {p50:6.3f} ms  p90 {p90:6.3f} ms  ({len(values)} requests)"
            )
        off, on_ = statistics.median(samples[False]), statistics.median(samples[True])
        print(f"difference at p50: {on_ - off:+.3f} ms ({(on_ - off) / off * 100:+.1f}%)")
        best_off, best_on = min(medians[False]), min(medians[True])
        print(
            f"quietest round's p50: off {best_off:.3f} ms, on {best_on:.3f} ms ({best_on - best_off:+.3f} ms)"
        )


async def cpu_costs(n: int = 20000) -> None:
    """CPU per request of the middleware on a bare app, and per event of the writer's digest."""
    log = audit.AuditLog(capacity=10**9)
    app_state = SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(audit=log)))
    body = b'{"cmd":"true","args":["--flag","value"],"env":{}}'
    headers = [(b"content-type", b"application/json"), (b"x-api-key", b"pdk_x")]

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        scope.setdefault("state", {}).update(user_id="usr_x", key_id="key_x")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        return None

    costs = {}
    for name, app in (("bare", bare), ("audited", auditing.AuditMiddleware(bare))):
        started = time.process_time()
        for _ in range(n):
            scope = {
                "type": "http",
                "path": "/v1/sandboxes/sb-1/exec",
                "method": "POST",
                "headers": headers,
                "query_string": b"",
                "app": app_state,
            }
            await app(scope, receive, send)
            if len(log) > 5000:
                log.take()
        costs[name] = (time.process_time() - started) / n * 1e6
    print(f"middleware CPU per request: {costs['audited'] - costs['bare']:.1f} µs (on the request's path)")
    event = audit.Pending("sb-1", "usr_x", utcnow(), "api", {})
    started = time.process_time()
    for _ in range(n):
        event.inputs = (b"", body, len(body), True)
        event.row()
    print(f"writer's digest per API event: {(time.process_time() - started) / n * 1e6:.1f} µs (off the path)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    asyncio.run(cpu_costs())
    asyncio.run(run(args.requests, args.rounds))


if __name__ == "__main__":
    main()
