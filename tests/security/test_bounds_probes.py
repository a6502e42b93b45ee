"""Probes of what one tenant can make the services hold or wait for (issue #29 items 5, 9, 10, 11).

Against a live control plane and host agent (crun), over HTTP on 127.0.0.1:

- An exec's ``stdin`` over its limit, and a body far past it, are a 413 naming ``stdin``; the
  control plane reads no more than the body's cap (its memory barely moves), and another tenant's
  ``exec true`` stays fast meanwhile, as it does during a big upload.
- An upload that fills the sandbox's disk is a 507 saying the disk is full, and leaves nothing behind.
- Hundreds of parallel execs on one sandbox answer 200, or 503 with Retry-After, never 500.
- A connection that sends half a request line is closed within ``serving.HEADER_TIMEOUT_S``, on the
  control plane's listener, the host agent's and the ingress proxy's, while other requests are served;
  one to the SSH gateway that does not log in is closed within ``sshgate.LOGIN_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from paddock_controlplane.edge import sshgate
from paddock_controlplane.sandboxes import commands
from paddock_core import serving
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform, plain_http_ingress, start_platform
from tests.ports import free_port

__all__ = ["debian_image", "guest_binary_dir"]  # session fixtures, shared with tests/hostagent

pytestmark = pytest.mark.root

MIB = 1 << 20
#: Another tenant's ``exec true`` meanwhile: about 20-70 ms at the median here, spikes to 0.9 s on a
#: shared 2-core machine; 8.7 s on the old code during a 256 MiB stdin.
OTHER_TENANT_MAX_S = 2.5
SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    cp_env = {**plain_http_ingress(), "PADDOCK_CP_SSH_PORT": str(free_port())}
    live = start_platform(guest_binary_dir, cp_env=cp_env, agent_options={"runtime": "crun"})
    try:
        yield live
    finally:
        live.stop()


class Tenant:
    def __init__(self, platform: LivePlatform) -> None:
        self.key = platform.api_key()
        self.url = platform.url
        self.http = platform.http(self.key)
        self.created: list[str] = []

    def create(self) -> str:
        answer = self.http.post("/v1/sandboxes", json={"shape": SHAPE, "disk_mib": DISK_MIB})
        assert answer.status_code == 200, answer.text
        self.created.append(answer.json()["data"]["id"])
        return self.created[-1]

    def sh(self, sandbox_id: str, script: str) -> dict[str, Any]:
        answer = self.http.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}
        )
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["data"]["result"])

    def close(self) -> None:
        for sandbox_id in self.created:
            self.http.delete(f"/v1/sandboxes/{sandbox_id}")
        self.http.close()


@pytest.fixture
def tenants(platform: LivePlatform) -> Iterator[tuple[Tenant, Tenant]]:
    first, second = Tenant(platform), Tenant(platform)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class Latencies:
    """``exec true`` in a loop by another tenant, in a thread, until stopped: each call's seconds."""

    def __init__(self, tenant: Tenant, sandbox_id: str) -> None:
        self.tenant = tenant
        self.sandbox_id = sandbox_id
        self.seconds: list[float] = []
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(
            base_url=self.tenant.url, headers={"X-API-Key": self.tenant.key}, timeout=60
        ) as http:
            while not self._stop.is_set():
                started = time.monotonic()
                answer = http.post(f"/v1/sandboxes/{self.sandbox_id}/exec", json={"cmd": "true"})
                self.seconds.append(time.monotonic() - started)
                self.statuses.append(answer.status_code)
                time.sleep(0.02)

    def __enter__(self) -> Latencies:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def summary(self) -> str:
        ordered = sorted(self.seconds)
        p50 = ordered[len(ordered) // 2] if ordered else float("nan")
        return f"{len(ordered)} execs, p50 {p50 * 1000:.1f} ms, max {max(ordered, default=0) * 1000:.1f} ms"


STDIN_HEAD, STDIN_TAIL = b'{"cmd":"wc","args":["-c"],"stdin":"', b'"}'


def stdin_body(stdin_bytes: int) -> Iterator[bytes]:
    """An exec's JSON body with ``stdin_bytes`` of stdin, produced a MiB at a time (never held whole)."""
    yield STDIN_HEAD
    piece = b"a" * MIB
    for _ in range(stdin_bytes // MIB):
        yield piece
    yield STDIN_TAIL


# -- item 5: stdin and request bodies ----------------------------------------------------------------


def test_stdin_over_its_limit_is_a_413_naming_stdin_and_one_at_it_runs(
    tenants: tuple[Tenant, Tenant],
) -> None:
    tenant, _ = tenants
    sandbox_id = tenant.create()
    limit = commands.MAX_EXEC_STDIN_BYTES
    at_limit = tenant.http.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "wc", "args": ["-c"], "stdin": "a" * limit}
    )
    assert at_limit.status_code == 200, at_limit.text
    assert at_limit.json()["data"]["result"]["stdout"].strip() == str(limit)
    over = tenant.http.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "wc", "args": ["-c"], "stdin": "a" * (limit + 1)}
    )
    assert over.status_code == 413, over.text
    assert "stdin" in over.json()["data"], over.text


def test_a_1_gib_stdin_is_refused_unread_and_another_tenants_exec_stays_fast(
    platform: LivePlatform, tenants: tuple[Tenant, Tenant]
) -> None:
    """The control plane refuses the body at its cap and closes the connection: its memory grows by
    far less than the body (it took 5 GiB for this before), and tenant B's ``exec true`` meanwhile
    stays under OTHER_TENANT_MAX_S (4 s before)."""
    tenant, other = tenants
    sandbox_id, other_id = tenant.create(), other.create()
    assert platform.controlplane.process is not None
    pid = platform.controlplane.process.pid
    before_mib = rss_mib(pid)
    for declared in (True, False):  # with a Content-Length over the cap, and chunked
        size = 1 << 30
        with Latencies(other, other_id) as latencies:
            time.sleep(0.3)
            headers = {"Content-Type": "application/json"}
            if declared:
                headers["Content-Length"] = str(len(STDIN_HEAD) + size + len(STDIN_TAIL))
            started = time.monotonic()
            answer = tenant.http.post(
                f"/v1/sandboxes/{sandbox_id}/exec", content=stdin_body(size), headers=headers
            )
            refused_s = time.monotonic() - started
            time.sleep(0.3)
        after_mib = rss_mib(pid)
        print(
            f"declared={declared}: {answer.status_code} in {refused_s:.2f} s; control plane RSS "
            f"{before_mib:.0f} -> {after_mib:.0f} MiB; other tenant: {latencies.summary()}"
        )
        assert answer.status_code == 413, answer.text
        assert answer.headers.get("connection") == "close"
        assert "stdin" in answer.json()["data"], answer.text
        assert after_mib - before_mib < 256, (before_mib, after_mib)
        assert latencies.seconds and set(latencies.statuses) == {200}, latencies.statuses
        assert max(latencies.seconds) < OTHER_TENANT_MAX_S, latencies.summary()


def test_another_tenants_exec_stays_fast_during_a_big_upload(tenants: tuple[Tenant, Tenant]) -> None:
    tenant, other = tenants
    sandbox_id, other_id = tenant.create(), other.create()
    size = 512 * MIB

    def body() -> Iterator[bytes]:
        piece = b"\0" * MIB
        for _ in range(size // MIB):
            yield piece

    with Latencies(other, other_id) as latencies:
        time.sleep(0.3)
        answer = tenant.http.put(
            f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/tmp/big.bin"}, content=body()
        )
        time.sleep(0.3)
    print(f"upload of {size // MIB} MiB: {answer.status_code}; other tenant: {latencies.summary()}")
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"]["size"] == size
    assert latencies.seconds and set(latencies.statuses) == {200}, latencies.statuses
    assert max(latencies.seconds) < OTHER_TENANT_MAX_S, latencies.summary()


def test_any_other_body_past_its_cap_is_a_413_before_it_is_read(tenants: tuple[Tenant, Tenant]) -> None:
    tenant, _ = tenants
    answer = tenant.http.post(
        "/v1/sandboxes",
        content=b"{" + b" " * (16 * MIB) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 413, answer.text
    assert answer.json()["data"]["body"] == f"is over the {8 * MIB}-byte limit", answer.text


# -- item 9: a full disk -----------------------------------------------------------------------------


def test_an_upload_onto_a_full_disk_is_507_and_leaves_nothing(tenants: tuple[Tenant, Tenant]) -> None:
    tenant, _ = tenants
    sandbox_id = tenant.create()
    # Leave about 4 MiB free on the sandbox's root filesystem, then upload 32 MiB there.
    filled = tenant.sh(
        sandbox_id,
        "free=$(df --output=avail -B1 /root | tail -1); fallocate -l $((free - 4*1024*1024)) /root/fill"
        " && sync && df --output=avail -B1M /root | tail -1",
    )
    assert filled["exit_code"] == 0, filled
    answer = tenant.http.put(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/root/big.bin"}, content=b"x" * (32 * MIB)
    )
    assert answer.status_code == 507, answer.text
    assert "disk is full" in answer.json()["message"], answer.text
    listing = tenant.sh(sandbox_id, "ls -A /root; test ! -e /root/big.bin")
    assert listing["exit_code"] == 0, listing
    assert ".paddock-up" not in listing["stdout"], listing
    # Once room is made, the same upload succeeds.
    assert tenant.sh(sandbox_id, "rm /root/fill")["exit_code"] == 0
    again = tenant.http.put(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/root/big.bin"}, content=b"x" * (32 * MIB)
    )
    assert again.status_code == 200, again.text


# -- item 10: parallel execs -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gvisor_platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    """Under gVisor the guest agent accepts connections slower than a burst of execs makes them: its
    listen backlog (128) overflows and connects meet EAGAIN (239 of 400 execs answered 500 before)."""
    if shutil.which("runsc") is None:
        pytest.skip("runsc is not installed")
    live = start_platform(guest_binary_dir, agent_options={"runtime": "runsc"})
    try:
        yield live
    finally:
        live.stop()


def test_hundreds_of_parallel_execs_answer_200_or_503_with_retry_after(gvisor_platform: LivePlatform) -> None:
    tenant = Tenant(gvisor_platform)
    try:
        burst_of_execs(tenant, parallel=400)
    finally:
        tenant.close()


def burst_of_execs(tenant: Tenant, parallel: int) -> None:
    sandbox_id = tenant.create()
    # The sandbox is busy computing, as a tenant's often is, so its guest agent accepts connections
    # slower than a burst makes them (this burst met a full backlog 239 times out of 400 before).
    hogs = tenant.sh(
        sandbox_id, "for i in 1 2; do setsid sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!; done"
    )
    assert hogs["exit_code"] == 0, hogs
    try:
        burst_on(tenant, sandbox_id, parallel)
    finally:
        tenant.sh(sandbox_id, "kill -9 " + " ".join(hogs["stdout"].split()))


def burst_on(tenant: Tenant, sandbox_id: str, parallel: int) -> None:
    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)
        async with httpx.AsyncClient(
            base_url=tenant.url, headers={"X-API-Key": tenant.key}, timeout=120, limits=limits
        ) as http:
            return await asyncio.gather(
                *(
                    http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "true"})
                    for _ in range(parallel)
                )
            )

    answers = asyncio.run(burst())
    statuses = [answer.status_code for answer in answers]
    counts = {status: statuses.count(status) for status in set(statuses)}
    print(f"{parallel} parallel execs: {counts}")
    assert set(statuses) <= {200, 429, 503}, [
        a.text for a in answers if a.status_code not in (200, 429, 503)
    ][:3]
    for answer in answers:
        if answer.status_code in (429, 503):
            assert answer.headers.get("retry-after", "").isdigit(), answer.headers
    assert counts.get(200, 0) >= parallel * 0.6, counts
    assert all(a.json()["data"]["result"]["exit_code"] == 0 for a in answers if a.status_code == 200)


# -- item 11: slow clients ---------------------------------------------------------------------------


def _half_requests(port: int, count: int) -> list[socket.socket]:
    """``count`` connections: one with half a request line, the rest with nothing sent."""
    held = []
    for index in range(count):
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        if index == 0:
            conn.sendall(b"GET /readyz HT")
        held.append(conn)
    return held


def _closed_within(held: list[socket.socket], deadline_s: float) -> list[float]:
    """Seconds until each connection was closed by the server (inf: still open at the deadline)."""
    started = time.monotonic()
    closed_at = [float("inf")] * len(held)
    for index, conn in enumerate(held):
        remaining = deadline_s - (time.monotonic() - started)
        if remaining <= 0:
            break
        conn.settimeout(remaining)
        try:
            if conn.recv(1) == b"":
                closed_at[index] = time.monotonic() - started
        except ConnectionResetError:
            closed_at[index] = time.monotonic() - started
        except TimeoutError:
            break  # still open at the deadline
    return closed_at


@pytest.mark.parametrize("listener", ["controlplane", "hostagent", "ingress"])
def test_a_half_sent_request_is_closed_within_the_header_timeout(
    platform: LivePlatform, listener: str
) -> None:
    expected = 200
    if listener == "controlplane":
        port, probe_url, headers = platform.controlplane.port, platform.url + "/readyz", {}
    elif listener == "ingress":  # the ingress proxy's own HTTP/1.1 (it had kept such a connection ~75 s)
        port = int(platform.controlplane.extra_env["PADDOCK_CP_INGRESS_PORT"])
        probe_url, expected = f"http://127.0.0.1:{port}/", 404  # answered by the proxy: no such sandbox
        headers = {
            "host": f"8000-sb-nosuchsandboxnosuchsandbox.{platform.controlplane.extra_env['PADDOCK_CP_INGRESS_DOMAIN']}"
        }
    else:
        agent = platform.agents[0]
        port = int(agent.url.rsplit(":", 1)[1])
        probe_url, headers = agent.url + "/healthz", {}
    held = _half_requests(port, 50)
    try:
        served_s = []
        with httpx.Client(timeout=10) as http:
            for _ in range(3):
                started = time.monotonic()
                assert http.get(probe_url, headers=headers).status_code == expected
                served_s.append(time.monotonic() - started)
        closed_after = _closed_within(held, serving.HEADER_TIMEOUT_S + 5)
    finally:
        for conn in held:
            conn.close()
    print(
        f"{listener}: served in {max(served_s) * 1000:.1f} ms; closed after up to {max(closed_after):.1f} s"
    )
    assert max(served_s) < 2, served_s
    assert max(closed_after) <= serving.HEADER_TIMEOUT_S + 5, closed_after


def test_a_connection_that_never_logs_in_to_the_ssh_gateway_is_closed_within_its_login_timeout(
    platform: LivePlatform,
) -> None:
    """asyncssh's own default kept such a connection 120 s."""
    port = int(platform.controlplane.extra_env["PADDOCK_CP_SSH_PORT"])
    held = []
    for index in range(20):
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        if index == 0:
            conn.sendall(b"SSH-2.0-probe\r\n")  # a version line, then nothing
        held.append(conn)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as fresh:
            assert fresh.recv(64).startswith(b"SSH-2.0-"), "the gateway stopped answering new connections"
        started, deadline_s = time.monotonic(), sshgate.LOGIN_TIMEOUT_S + 5
        closed_after = []
        for conn in held:  # the gateway speaks first (its version line, its key exchange offer): read on
            conn.settimeout(max(0.1, deadline_s - (time.monotonic() - started)))
            try:
                while conn.recv(65536):
                    pass
            except TimeoutError:
                closed_after.append(float("inf"))  # still open at the deadline
                continue
            except ConnectionResetError:
                pass
            closed_after.append(time.monotonic() - started)
    finally:
        for conn in held:
            conn.close()
    print(f"ssh gateway: closed after up to {max(closed_after):.1f} s")
    assert max(closed_after) <= sshgate.LOGIN_TIMEOUT_S + 5, closed_after
