"""The SSH gateway with Debian's OpenSSH client (/usr/bin/ssh) against a live platform on 127.0.0.1.

Keys are checked against the sandbox named by the SSH user (its id or its name), sessions are real
managed processes in the sandbox, ``-L`` reaches a server listening in the sandbox, and a paused
sandbox is resumed by the connection.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live import LivePlatform, start_platform
from tests.ports import free_port

pytestmark = pytest.mark.root

# A tiny server for -L: greets, then echoes one line. Compiled static, so any image can run it.
SERVER_C = r"""
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_port = htons(8123); a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 8)) return 1;
    puts("listening"); fflush(stdout);
    for (;;) {
        int c = accept(s, 0, 0);
        char buf[256];
        write(c, "hello from the sandbox\n", 23);
        ssize_t n = read(c, buf, sizeof buf);
        if (n > 0) write(c, buf, (size_t)n);
        close(c);
    }
}
"""


@pytest.fixture(scope="module")
def ssh_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def live(debian_image: Path, guest_binary_dir: Path, ssh_port: int) -> Iterator[LivePlatform]:
    platform = start_platform(guest_binary_dir, cp_env={"PADDOCK_CP_SSH_PORT": str(ssh_port)})
    try:
        yield platform
    finally:
        platform.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("sshkeys")
    made = {}
    for name in ("good", "wrong", "later", "agent", "owner", "rotated"):
        path = directory / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        made[name] = path
    return made


@pytest.fixture(scope="module")
def api(live: LivePlatform) -> Iterator[httpx.Client]:
    with live.http(live.api_key(), timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def sandbox(api: httpx.Client, keys: dict[str, Path]) -> Iterator[dict[str, str]]:
    pub = keys["good"].with_suffix(".pub").read_text().strip()
    created = api.post(
        "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "debian:13", "ssh_pubkeys": [pub]}
    )
    assert created.status_code == 200, created.text
    doc = created.json()["data"]
    try:
        yield {"id": doc["id"], "name": doc["name"]}
    finally:
        api.delete(f"/v1/sandboxes/{doc['id']}")


def ssh_args(port: int, key: Path, user: str, *extra: str) -> list[str]:
    return [
        "/usr/bin/ssh", "-p", str(port), "-i", str(key),
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
        *extra, f"{user}@127.0.0.1",
    ]  # fmt: skip


def ssh(
    port: int, key: Path, user: str, command: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*ssh_args(port, key, user), command], input=stdin, capture_output=True, timeout=60)


def test_a_remote_command_keeps_its_streams_and_exit_code(
    ssh_port: int, keys: dict[str, Path], sandbox: dict[str, str]
) -> None:
    done = ssh(ssh_port, keys["good"], sandbox["id"], "echo out; echo err >&2; cat; exit 7", stdin=b"piped\n")
    assert done.returncode == 7, done
    assert done.stdout == b"out\npiped\n" and done.stderr == b"err\n"
    by_name = ssh(ssh_port, keys["good"], sandbox["name"], "hostname")
    assert by_name.returncode == 0 and by_name.stdout.strip() == sandbox["name"].encode()


def test_a_wrong_key_or_sandbox_is_refused_and_a_key_added_later_works(
    api: httpx.Client, ssh_port: int, keys: dict[str, Path], sandbox: dict[str, str]
) -> None:
    wrong = ssh(ssh_port, keys["wrong"], sandbox["id"], "true")
    assert wrong.returncode == 255 and b"Permission denied" in wrong.stderr
    nowhere = ssh(ssh_port, keys["good"], "sb-not-a-sandbox", "true")
    assert nowhere.returncode == 255 and b"Permission denied" in nowhere.stderr
    assert ssh(ssh_port, keys["later"], sandbox["id"], "true").returncode == 255
    pub = keys["later"].with_suffix(".pub").read_text().strip()
    added = api.post(f"/v1/sandboxes/{sandbox['id']}/ssh-pubkeys", json={"keys": [pub]})
    assert added.status_code == 200, added.text
    assert ssh(ssh_port, keys["later"], sandbox["id"], "true").returncode == 0


def test_a_key_added_through_an_access_token_stops_with_the_token(
    live: LivePlatform, api: httpx.Client, ssh_port: int, keys: dict[str, Path], sandbox: dict[str, str]
) -> None:
    """Keys added with a sandbox's access token belong to it: disabling or rotating the token stops them
    at the gateway (OpenSSH sees "Permission denied"); keys added with the account's key stay."""
    sandbox_id = sandbox["id"]

    def pub(name: str) -> str:
        return keys[name].with_suffix(".pub").read_text().strip()

    def add_keys(key: str, name: str) -> None:
        with live.http(key) as client:
            added = client.post(f"/v1/sandboxes/{sandbox_id}/ssh-pubkeys", json={"keys": [pub(name)]})
        assert added.status_code == 200, added.text

    def refused(name: str) -> bool:
        done = ssh(ssh_port, keys[name], sandbox_id, "true")
        return done.returncode == 255 and b"Permission denied" in done.stderr

    token = api.post(f"/v1/sandboxes/{sandbox_id}/access-token").json()["data"]["token"]
    try:
        add_keys(token, "agent")
        add_keys(api.headers["X-API-Key"], "owner")
        assert not refused("agent") and not refused("owner")
        in_sandbox = ssh(ssh_port, keys["agent"], sandbox_id, "echo agent in")
        assert in_sandbox.stdout == b"agent in\n", in_sandbox

        assert api.delete(f"/v1/sandboxes/{sandbox_id}/access-token").status_code == 200
        assert refused("agent")
        assert not refused("owner") and not refused("good")  # the account's keys are the account's
        # The owner still sees which keys the disabled token had added; the sandbox's list lacks them.
        shown = api.get(f"/v1/sandboxes/{sandbox_id}/access-token").json()["data"]
        assert shown["ssh_pubkeys"] == [pub("agent")]
        assert pub("agent") not in (
            api.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]["ssh_pubkeys"] or []
        )

        token = api.post(f"/v1/sandboxes/{sandbox_id}/access-token").json()["data"]["token"]
        assert refused("agent")  # a new token starts with no keys
        add_keys(token, "rotated")
        assert not refused("rotated")
        rotated = api.post(f"/v1/sandboxes/{sandbox_id}/access-token/rotate")
        assert rotated.status_code == 200, rotated.text
        assert refused("rotated")
    finally:
        api.delete(f"/v1/sandboxes/{sandbox_id}/access-token")


def test_an_interactive_session_runs_under_a_pty(
    ssh_port: int, keys: dict[str, Path], sandbox: dict[str, str]
) -> None:
    leader, follower = os.openpty()
    os.set_blocking(leader, False)
    args = ssh_args(ssh_port, keys["good"], sandbox["id"], "-tt")
    client = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    seen = b""

    def read_until(needle: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 20
        while needle not in seen:
            assert time.monotonic() < deadline, seen
            if select.select([leader], [], [], 0.5)[0]:
                with contextlib.suppress(BlockingIOError):
                    seen += os.read(leader, 65536)

    try:
        os.write(leader, b"tty; echo typed-$((20+22))\n")
        read_until(b"typed-42")
        assert b"/dev/pts/" in seen
        os.write(leader, b"exit 3\n")
        assert client.wait(timeout=20) == 3
    finally:
        client.kill()
        client.wait()
        os.close(leader)


def wait_for_output(api: httpx.Client, url: str, needle: bytes) -> None:
    """Reads the process's output (``connect``, NDJSON, from its start) until ``needle`` shows up."""
    seen = b""
    deadline = time.monotonic() + 30
    with api.stream("GET", f"{url}/connect", params={"after": 0}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            frame = json.loads(line)
            if frame["type"] == "data":
                seen += base64.b64decode(frame["data_base64"])
                if needle in seen:
                    return
            if frame["type"] == "exit" or time.monotonic() > deadline:
                break
    raise AssertionError(f"{needle!r} not in the process's output {seen!r}")


def test_local_forwarding_reaches_a_server_in_the_sandbox(
    api: httpx.Client, tmp_path: Path, ssh_port: int, keys: dict[str, Path], sandbox: dict[str, str]
) -> None:
    """A connection through ``ssh -L`` to a port nothing listens on is refused the way OpenSSH's sshd
    refuses it (the client says why and closes it); once the server listens, the next one reaches it."""
    source = tmp_path / "server.c"
    source.write_text(SERVER_C)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(tmp_path / "server"), str(source)], check=True)
    put = api.put(
        f"/v1/sandboxes/{sandbox['id']}/files",
        params={"path": "/root/server"},
        content=(tmp_path / "server").read_bytes(),
    )
    assert put.status_code == 200, put.text
    assert ssh(ssh_port, keys["good"], sandbox["id"], "chmod +x /root/server").returncode == 0
    local = free_port()
    # LogLevel=INFO (OpenSSH takes an option's first value): a failed channel open is logged at INFO.
    args = [
        "LogLevel=INFO" if arg == "LogLevel=ERROR" else arg
        for arg in ssh_args(
            ssh_port, keys["good"], sandbox["id"], "-N", "-L", f"127.0.0.1:{local}:localhost:8123"
        )
    ]
    stderr_path = tmp_path / "tunnel.stderr"
    with stderr_path.open("wb") as stderr:
        tunnel = subprocess.Popen(args, stderr=stderr)

    def said() -> str:
        return stderr_path.read_text(errors="replace")

    def through_the_tunnel() -> socket.socket:
        """A connection to the local end, once ssh listens there (it does after logging in)."""
        deadline = time.monotonic() + 30
        while True:
            assert tunnel.poll() is None, f"ssh exited with {tunnel.returncode}: {said()}"
            try:
                conn = socket.create_connection(("127.0.0.1", local), timeout=5)
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, f"ssh never listened on {local}: {said()}"
                time.sleep(0.1)
                continue
            conn.settimeout(30)
            return conn

    try:
        with through_the_tunnel() as conn:  # nothing listens on 8123 yet
            assert conn.recv(100) == b"", "a connection to a closed port was not closed"
        deadline = time.monotonic() + 30
        while "open failed: connect failed: Connection refused" not in said():
            assert time.monotonic() < deadline, f"ssh did not say why: {said()!r}"
            time.sleep(0.1)

        started = api.post(f"/v1/sandboxes/{sandbox['id']}/processes", json={"cmd": "/root/server"})
        assert started.status_code == 200, started.text
        wait_for_output(
            api,
            f"/v1/sandboxes/{sandbox['id']}/processes/{started.json()['data']['process_id']}",
            b"listening",
        )
        with through_the_tunnel() as conn:
            greeting = conn.recv(100)
            assert greeting == b"hello from the sandbox\n", f"{greeting!r}; ssh said: {said()}"
            conn.sendall(b"ping\n")
            assert conn.recv(100) == b"ping\n"
    finally:
        tunnel.terminate()
        tunnel.wait()


def test_a_paused_sandbox_is_resumed_by_the_connection(
    api: httpx.Client, ssh_port: int, keys: dict[str, Path], sandbox: dict[str, str]
) -> None:
    paused = api.post(f"/v1/sandboxes/{sandbox['id']}/pause")
    assert paused.status_code == 200, paused.text
    waited = api.get(f"/v1/sandboxes/{sandbox['id']}", params={"wait_for": "paused", "wait_ms": 20000})
    assert waited.json()["data"]["status"] == "paused"
    done = ssh(ssh_port, keys["good"], sandbox["id"], "echo awake")
    assert done.returncode == 0 and done.stdout == b"awake\n", done
    assert api.get(f"/v1/sandboxes/{sandbox['id']}").json()["data"]["status"] == "running"


def test_scp_both_ways_byte_exact_and_sftp(
    tmp_path: Path, ssh_port: int, keys: dict[str, Path], sandbox: dict[str, str]
) -> None:
    options = [
        "-P", str(ssh_port), "-i", str(keys["good"]), "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip
    payload = os.urandom(3 << 20) + bytes(range(256))
    (tmp_path / "up.bin").write_bytes(payload)
    remote = f"{sandbox['id']}@127.0.0.1"
    up = subprocess.run(
        ["/usr/bin/scp", *options, str(tmp_path / "up.bin"), f"{remote}:/root/up.bin"],
        capture_output=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stderr
    summed = ssh(ssh_port, keys["good"], sandbox["id"], "sha256sum /root/up.bin")
    assert summed.stdout.split()[0].decode() == hashlib.sha256(payload).hexdigest()
    down = subprocess.run(
        ["/usr/bin/scp", *options, f"{remote}:/root/up.bin", str(tmp_path / "down.bin")],
        capture_output=True,
        timeout=120,
    )
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "down.bin").read_bytes() == payload
    batch = "mkdir /root/viasftp\ncd /root/viasftp\nput " + str(tmp_path / "up.bin") + " copy.bin\nls -l\n"
    sftp_options = [o if o != "-P" else "-P" for o in options]
    listed = subprocess.run(
        ["/usr/bin/sftp", *sftp_options, "-b", "-", remote],
        input=batch.encode(),
        capture_output=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert b"copy.bin" in listed.stdout
    size = ssh(ssh_port, keys["good"], sandbox["id"], "stat -c %s /root/viasftp/copy.bin")
    assert int(size.stdout) == len(payload)
