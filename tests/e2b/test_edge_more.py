"""The sandbox edge's input streams, E2B users and gzip, through the unmodified ``e2b`` SDK where it uses
them and raw HTTP where it does not, configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.

- ``process.Process/StreamInput``: the SDK's ``commands.stream_input``/``pty.stream_input`` (sync: an
  iterable; async: a handle kept open) — each message reaches the process as it arrives.
- Users: ``user="root"`` runs as root, no user (the SDK's default) as the image's user, ``user="user"`` as
  the sandbox's ``user`` account, or as the image's user where there is none (docs/e2b.md, Users).
- gzip on ``/files``: ``write(..., gzip=True)`` and ``read(..., gzip=True)``, and a gzip bomb refused (413
  naming the limit) with nothing written.

One sandbox for the module (``debian:13``, whose user is root and which has no ``user`` account)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import os
import struct
import time
import zlib
from collections.abc import Iterator

import httpx
import pytest

from e2b import AsyncSandbox, NotFoundException, PtySize, Sandbox
from paddock_controlplane.edge.e2b.edge import connect, gzip_body
from paddock_controlplane.settings import ControlPlaneSettings
from tests.e2b.conftest import E2bPlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

STREAM = {"Content-Type": "application/connect+json"}


@pytest.fixture(scope="module")
def envd(e2b_env: E2bPlatform, sandbox: Sandbox) -> Iterator[httpx.Client]:
    """A raw client of the sandbox's envd through the edge (what the SDK sends, without the SDK)."""
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox._envd_access_token or "",
    }
    with httpx.Client(base_url=e2b_env.sandbox_url, headers=headers, timeout=60) as client:
        yield client


# --- process.Process/StreamInput ---------------------------------------------------------------------


def test_stream_input_sync_commands_and_pty(sandbox: Sandbox) -> None:
    cat = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(cat.pid, ["one\n", b"two\n", "three\n"])
    sandbox.commands.close_stdin(cat.pid)
    done = cat.wait()
    assert (done.exit_code, done.stdout) == (0, "one\ntwo\nthree\n")

    out = bytearray()
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.stream_input(terminal.pid, [b"echo streamed-$((6*7))\n", b"exit\n"])
    assert terminal.wait(on_pty=out.extend).exit_code == 0
    assert "streamed-42" in bytes(out).decode(errors="replace")

    with pytest.raises(NotFoundException):
        sandbox.commands.stream_input(999_999, ["nobody\n"])


async def test_stream_input_async_handle_delivers_while_open(sandbox: Sandbox) -> None:
    async_sandbox = await AsyncSandbox.connect(sandbox.sandbox_id)
    seen: list[str] = []
    cat = await async_sandbox.commands.run("cat", background=True, stdin=True, on_stdout=seen.append)
    handle = async_sandbox.commands.stream_input(cat.pid)
    await handle.send("ping\n")
    deadline = time.monotonic() + 20
    while "ping\n" not in "".join(seen) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    # The stream is still open: the edge wrote the message when it came, not at the request's end.
    assert "ping\n" in "".join(seen)
    await handle.send(b"pong\n")
    await handle.close()
    await async_sandbox.commands.close_stdin(cat.pid)
    result = await cat.wait()
    assert (result.exit_code, result.stdout) == (0, "ping\npong\n")


def test_stream_input_bad_streams_name_the_field(envd: httpx.Client) -> None:
    def ends_with(body: bytes) -> dict[str, str]:
        answer = envd.post("/process.Process/StreamInput", content=body, headers=STREAM)
        assert answer.status_code == 200  # a stream's error travels in its end envelope
        flags, message = connect.read_envelopes(answer.content)[-1]
        assert flags == 2
        return message.get("error", {})

    data = connect.envelope({"data": {"input": {"stdin": base64.b64encode(b"x").decode()}}})
    assert ends_with(data) == {
        "code": "invalid_argument",
        "message": "start: the first message must name the process",
    }
    start = connect.envelope({"start": {"process": {"pid": 999_999}}})
    assert ends_with(start)["code"] == "not_found"
    assert ends_with(struct.pack(">BI", 1, 2) + b"{}") == {
        "code": "unimplemented",
        "message": "compressed messages are not accepted",
    }
    assert ends_with(connect.envelope({"start": {}})[:-1])["code"] == "invalid_argument"  # cut short


# --- users --------------------------------------------------------------------------------------------


def test_users_map_to_the_sandbox_accounts(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("id -u", user="root").stdout == "0\n"
    # No user (the SDK's default since envd 0.4.0) is the image's user: root in debian:13.
    assert sandbox.commands.run("id -u").stdout == "0\n"
    # E2B's "user" where the sandbox has no such account: the image's user, as with no user.
    assert sandbox.commands.run("getent passwd user || echo none", user="root").stdout == "none\n"
    assert sandbox.commands.run("id -u", user="user").stdout == "0\n"

    sandbox.commands.run("useradd --create-home --shell /bin/bash user", user="root")
    as_user = sandbox.commands.run('id -un; echo "$HOME"; pwd', user="user")
    assert as_user.stdout == "user\n/home/user\n/home/user\n"
    terminal_out = bytearray()
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80), user="user")
    sandbox.pty.send_stdin(terminal.pid, b"echo pty-as-$(id -un)\nexit\n")
    assert terminal.wait(on_pty=terminal_out.extend).exit_code == 0
    assert "pty-as-user" in bytes(terminal_out).decode(errors="replace")
    assert sandbox.commands.run("id -u").stdout == "0\n"  # the default is still the image's user

    # Files: a relative path is in the user's home; Paddock's file calls write as root (docs/e2b.md).
    assert sandbox.files.write("as-user.txt", "u", user="user").path == "/home/user/as-user.txt"
    assert sandbox.files.write("as-root.txt", "r", user="root").path == "/root/as-root.txt"
    owners = sandbox.commands.run("stat -c %U /home/user/as-user.txt /root/as-root.txt", user="root")
    assert owners.stdout == "root\nroot\n"
    assert sandbox.files.read("as-user.txt", user="user") == "u"


# --- gzip on /files -----------------------------------------------------------------------------------


def test_gzip_write_and_read_through_the_sdk(sandbox: Sandbox, envd: httpx.Client) -> None:
    text = "gzip me\n" * 50_000
    info = sandbox.files.write("/tmp/gz/text.txt", text, gzip=True)  # octet-stream, Content-Encoding: gzip
    assert info.path == "/tmp/gz/text.txt"
    assert sandbox.commands.run("wc -c < /tmp/gz/text.txt").stdout == f"{len(text)}\n"  # stored inflated
    assert sandbox.files.read("/tmp/gz/text.txt", gzip=True) == text

    params = {"path": "/tmp/gz/text.txt"}
    with envd.stream("GET", "/files", params=params, headers={"Accept-Encoding": "gzip"}) as raw:
        assert raw.headers["content-encoding"] == "gzip"
        wire = b"".join(raw.iter_raw())
    assert len(wire) < len(text) // 10
    assert gzip.decompress(wire) == text.encode()
    plain = envd.get("/files", params=params, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert plain.headers["content-length"] == str(len(text))

    blob = os.urandom(300_000)
    multipart = envd.post(
        "/files",
        params={"path": "/tmp/gz/multi.bin"},
        content=gzip.compress(_multipart(blob)),
        headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}", "Content-Encoding": "gzip"},
    )
    assert multipart.status_code == 200, multipart.text
    assert sandbox.files.read("/tmp/gz/multi.bin", format="bytes") == blob


def test_gzip_bomb_and_bad_gzip_are_refused(sandbox: Sandbox, envd: httpx.Client) -> None:
    limit = ControlPlaneSettings.model_fields[
        "max_upload_bytes"
    ].default  # the platform's: not overridden in tests
    member = _zeros_member(64 << 20)
    bomb = member * (limit // (64 << 20) + 1)  # ~1 MiB on the wire, just over the limit inflated
    assert len(bomb) < 2 << 20
    started = time.monotonic()
    refused = envd.post(
        "/files",
        params={"path": "/tmp/gz/bomb.bin"},
        content=bomb,
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert refused.status_code == 413
    assert refused.json() == {
        "code": 413,
        "message": f"upload is over the {limit}-byte limit once decompressed (Content-Encoding: gzip)",
    }
    assert time.monotonic() - started < 60
    assert not sandbox.files.exists("/tmp/gz/bomb.bin")  # checked whole before anything was written

    def post(body: bytes, encoding: str = "gzip") -> httpx.Response:
        return envd.post(
            "/files",
            params={"path": "/tmp/gz/bad.bin"},
            content=body,
            headers={"Content-Type": "application/octet-stream", "Content-Encoding": encoding},
        )

    not_gzip = post(b"plainly not gzip")
    assert not_gzip.status_code == 400 and not_gzip.json()["message"].startswith("Content-Encoding: gzip:")
    cut = post(gzip.compress(b"cut short" * 100)[:-10])
    assert cut.status_code == 400
    assert cut.json()["message"] == "Content-Encoding: gzip: the body ends inside the compressed stream"
    brotli = post(b"x", "br")
    assert (
        brotli.status_code == 400
        and brotli.json()["message"] == "Content-Encoding: br is not gzip or identity"
    )
    assert not sandbox.files.exists("/tmp/gz/bad.bin")


BOUNDARY = "paddock-e2b-boundary"


def _multipart(data: bytes) -> bytes:
    return (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="multi.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )


def _zeros_member(size: int) -> bytes:
    """One gzip member of ``size`` zero bytes, made without holding them all."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join(compressor.compress(zeros) for _ in range(size >> 20)) + compressor.flush()


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [
        ("gzip", True),  # the SDKs' read(..., gzip=True)
        ("gzip;q=1.0, identity;q=0.5", True),
        ("identity;q=0, gzip", True),
        ("gzip, deflate", False),  # httpx's default on every request: the bytes as they are
        ("gzip, deflate, br, zstd", False),
        ("*", False),
        ("identity", False),
        ("gzip;q=0", False),
        ("", False),
    ],
)
def test_a_read_is_gzipped_only_when_gzip_is_asked_for_alone(header: str, gzipped: bool) -> None:
    assert gzip_body.accepts_gzip(header) is gzipped
