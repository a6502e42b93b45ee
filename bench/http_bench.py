"""HTTP-level sections: control plane read throughput (wrk) and the gateway (quote latency, verifications).

- Throughput: ``wrk`` (Debian package) against ``GET /v1/sandboxes/{id}`` of a running sandbox with a
  valid key, and against the floor (``bench.floor_server``: bare Starlette on uvicorn answering the same
  bytes); the control plane's ``/healthz`` too (its framework and middleware without auth or database). One wrk thread, ``connections`` connections; on this 2-core box wrk shares the CPUs with the
  server, the same for both.
- Gateway quote: ``POST /agent/deploy`` with signed wallet headers and no payment → the 402 quote, one
  request at a time from httpx (headers signed before the clock starts), against a real ``paddock
  gateway`` process on SQLite (rate limit raised for the bench); floor: the same request to the floor
  server, which answers the same 402 bytes.
- Verifications per second per core: ``paddock_gateway.auth.verify_headers`` on pre-signed headers in
  one thread, against the floor of recovering the signer's public key from the same message hash with
  the same ``eth_keys`` backend (what any EIP-191 check must do).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.stats import Samples, summarize


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code < 500:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


@contextlib.contextmanager
def floor_server(bodies: dict[str, str]) -> Iterator[str]:
    work = Path(tempfile.mkdtemp(prefix="pdkbench-floor-"))
    (work / "bodies.json").write_text(json.dumps(bodies))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.floor_server", str(port), str(work / "bodies.json")],
        cwd=Path(__file__).resolve().parent.parent,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/healthz", proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


# -- wrk ---------------------------------------------------------------------------------------------

UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not match:
        return float("nan")
    return float(match.group(1)) * UNITS[match.group(2)]


def wrk(url: str, headers: dict[str, str], seconds: float, connections: int) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed (make bench-deps)")
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "10s"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    out = subprocess.run([*argv, url], capture_output=True, text=True, timeout=seconds + 60).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if rate is None:
        raise RuntimeError(f"wrk printed no rate:\n{out}")
    latency = {f"p{pct}": _ms(value) for pct, value in re.findall(r"^\s+(50|90|99)%\s+(\S+)", out, re.M)}
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    requests = re.search(r"(\d+) requests in", out)
    return {
        "rps": float(rate.group(1)),
        "requests": int(requests.group(1)) if requests else None,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(0) if errors else None,
        "latency_ms": latency,
        "connections": connections,
        "seconds": seconds,
    }


def throughput(
    cp_url: str, api_key: str, sandbox_id: str, seconds: float, connections: int
) -> dict[str, Any]:
    path = f"/v1/sandboxes/{sandbox_id}"
    headers = {"X-API-Key": api_key}
    real = httpx.get(cp_url + path, headers=headers, timeout=30)
    real.raise_for_status()
    with floor_server({"sandbox": real.text}) as floor_url:
        wrk(floor_url + path, {}, 1, connections)  # warm-up
        floor = wrk(floor_url + path, {}, seconds, connections)
    wrk(cp_url + path, headers, 1, connections)
    paddock = wrk(cp_url + path, headers, seconds, connections)
    # Where the time goes: the same process's framework, middleware and request log, without auth or database.
    probe = wrk(cp_url + "/healthz", {}, seconds, connections)
    for name, row in (("sandbox read", paddock), ("/healthz", probe)):
        if row["non_2xx"]:
            raise RuntimeError(f"control plane {name}: {row['non_2xx']} non-2xx responses under load")
    return {
        "paddock": paddock,
        "floor": floor,
        "controlplane_healthz": probe,
        "body_bytes": len(real.content),
    }


# -- the gateway -------------------------------------------------------------------------------------


def signed_headers(account: Any, now_ms: int | None = None) -> dict[str, str]:
    from eth_account.messages import encode_defunct

    address, nonce = str(account.address), str(uuid.uuid4())
    timestamp = str(now_ms if now_ms is not None else int(time.time() * 1000))
    signature = account.sign_message(encode_defunct(text=f"{address}:{timestamp}:{nonce}")).signature
    return {
        "X-Wallet-Address": address,
        "X-Signature": "0x" + bytes(signature).hex(),
        "X-Timestamp": timestamp,
        "X-Nonce": nonce,
    }


def deploy_body() -> dict[str, Any]:
    html = base64.b64encode(b"<h1>bench</h1>").decode()
    return {
        "uniqueName": f"bench-{uuid.uuid4().hex[:10]}",
        "displayName": "Bench Site",
        "months": 1,
        "settings": {"port": 8080},
        "upload": {"type": "files", "files": [{"path": "index.html", "content": html}]},
    }


@contextlib.contextmanager
def gateway_process(controlplane_url: str, api_key: str) -> Iterator[str]:
    """A gateway whose chains are unreachable (a quote needs none) on a real control plane: it checks
    its key there at start and before every quote, so the quote's cost includes that round trip."""
    work = Path(tempfile.mkdtemp(prefix="pdkbench-gw-"))
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_GW_HOST": "127.0.0.1",
            "PADDOCK_GW_PORT": str(port),
            "PADDOCK_GW_DATA_DIR": str(work),
            "PADDOCK_GW_DATABASE_URL": f"sqlite+aiosqlite:///{work / 'gateway.db'}",
            "PADDOCK_GW_RECIPIENT": "0x000000000000000000000000000000000000dEaD",
            "PADDOCK_GW_RPC_URL_BASE": "http://127.0.0.1:9",
            "PADDOCK_GW_RPC_URL_ARBITRUM": "http://127.0.0.1:9",
            "PADDOCK_GW_CONTROLPLANE_URL": controlplane_url,
            "PADDOCK_GW_API_KEY": api_key,
            "PADDOCK_GW_STATIC_MONTHLY_USD": "1.813947",
            "PADDOCK_GW_RATE_LIMIT_REQUESTS": "100000000",
            "PADDOCK_GW_METERING_INTERVAL_S": "3600",
            "PADDOCK_GW_LOG_LEVEL": "warning",
        }
    )
    log = open(work / "gateway.log", "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen([sys.executable, "-m", "paddock_gateway.main"], env=env, stdout=log, stderr=log)
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_http(url + "/health", proc)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc}:\n{(work / 'gateway.log').read_text(errors='replace')[-2000:]}"
            ) from None
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


def quote_latency(requests: int, warmup: int, controlplane_url: str, api_key: str) -> dict[str, Any]:
    from eth_account import Account

    account = Account.create()

    def run(url: str) -> Samples:
        samples = Samples()
        with httpx.Client(base_url=url, timeout=30) as http:
            for index in range(warmup + requests):
                samples.recording = index >= warmup
                body, headers = deploy_body(), signed_headers(account)
                with samples.time("quote"):
                    response = http.post("/agent/deploy", json=body, headers=headers)
                if response.status_code != 402:
                    raise RuntimeError(f"gateway quote: {response.status_code} {response.text[:300]}")
        return samples

    with gateway_process(controlplane_url, api_key) as gateway_url:
        with httpx.Client(timeout=30) as http:
            real = http.post(
                gateway_url + "/agent/deploy", json=deploy_body(), headers=signed_headers(account)
            )
        if real.status_code != 402:
            raise RuntimeError(f"gateway quote: {real.status_code} {real.text[:300]}")
        paddock = run(gateway_url)
    with floor_server({"quote": real.text}) as floor_url:
        floor = run(floor_url)
    return {
        "paddock": paddock.summary()["quote"],
        "floor": floor.summary()["quote"],
        "quote_fields": sorted(real.json()),
    }


def verifications(seconds: float) -> dict[str, Any]:
    from eth_account import Account
    from eth_account.messages import _hash_eip191_message, encode_defunct
    from eth_keys import keys

    from paddock_gateway.auth import signed_message, verify_headers

    account = Account.create()
    now_ms = int(time.time() * 1000)
    pool = [signed_headers(account, now_ms) for _ in range(20)]
    lowered = [{k.lower(): v for k, v in h.items()} for h in pool]
    for headers in lowered:  # correctness first: each one verifies as this wallet
        caller, _ = verify_headers(headers, now_ms, 60_000)
        if caller.wallet != account.address.lower():
            raise RuntimeError("verify_headers recovered another wallet")

    def rate(check: Any) -> dict[str, Any]:
        done, started = 0, time.perf_counter()
        per_call: list[float] = []
        while time.perf_counter() - started < seconds or done < 3:
            one = time.perf_counter()
            check(done % len(pool))
            per_call.append((time.perf_counter() - one) * 1000)
            done += 1
        elapsed = time.perf_counter() - started
        return {"per_second": done / elapsed, "n": done, "ms": summarize(per_call)}

    hashes = [
        _hash_eip191_message(
            encode_defunct(text=signed_message(h["X-Wallet-Address"], h["X-Timestamp"], h["X-Nonce"]))
        )
        for h in pool
    ]
    raw_sigs = []
    for h in pool:
        sig = bytearray(bytes.fromhex(h["X-Signature"][2:]))
        sig[64] -= 27
        raw_sigs.append(keys.Signature(signature_bytes=bytes(sig)))

    def floor_check(i: int) -> None:
        raw_sigs[i].recover_public_key_from_msg_hash(hashes[i])

    from eth_keys.backends import get_backend

    return {
        "paddock": rate(lambda i: verify_headers(lowered[i], now_ms, 60_000)),
        "floor": rate(floor_check),
        "backend": type(get_backend()).__name__,
    }
