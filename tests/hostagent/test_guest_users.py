"""The guest agent runs a command as another user (EXEC_AS, PROC START_AS), outside any container
(``--listen PATH``, as root, so the users are this machine's /etc/passwd); and a guest agent built
before those requests existed refuses them without running anything, while its plain EXEC still works
(a sandbox started before the host agent was upgraded)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.guest import (
    ExecRequest,
    Exited,
    GuestClient,
    GuestTooOldError,
    GuestUserError,
    Output,
)
from paddock_hostagent.guest.build import BINARY_NAME
from paddock_hostagent.guest.process_client import GuestProcesses, ProcessExit, ProcessOutput, StartRequest
from tests.hostagent import guestbin

pytestmark = pytest.mark.root  # setuid needs root

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root"}
#: What the host agent sends with a user when neither the image nor the caller set HOME: no HOME, for
#: the guest to set the account's (images.ImageConfig.command).
USER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
#: The last commit whose guest agent had no EXEC_AS or START_AS.
OLD_GUEST_COMMIT = "da90f4a"


@pytest.fixture
def guest(guest_binary_dir: Path, tmp_path: Path) -> Iterator[GuestClient]:
    yield from guestbin.serve(guest_binary_dir / BINARY_NAME, tmp_path / "g.sock")


@pytest.fixture
def old_guest(tmp_path: Path) -> Iterator[GuestClient]:
    yield from guestbin.serve(guestbin.build_old(OLD_GUEST_COMMIT, tmp_path), tmp_path / "old.sock")


async def _run(client: GuestClient, request: ExecRequest) -> tuple[bytes, bytes, int]:
    stdout, stderr, code = b"", b"", None
    async with client.exec(request) as session:
        async for event in session:
            if isinstance(event, Output):
                if event.stream == "stdout":
                    stdout += event.data
                else:
                    stderr += event.data
            elif isinstance(event, Exited):
                code = event.exit_code
    assert code is not None, (stdout, stderr)
    return stdout, stderr, code


async def _output(processes: GuestProcesses, process_id: str) -> bytes:
    data = b""
    async with asyncio.timeout(10), processes.connect(process_id, after=0) as stream:
        async for event in stream:
            if isinstance(event, ProcessOutput):
                data += event.data
            elif isinstance(event, ProcessExit):
                return data
    raise AssertionError(f"no exit after {data!r}")


async def test_exec_and_start_as_a_user(guest: GuestClient, tmp_path: Path) -> None:
    script = 'id -un; id -u; id -G; echo "$HOME $USER $LOGNAME"; pwd'
    out, _, code = await _run(guest, ExecRequest("/bin/sh", ["-c", script], USER_ENV, "", user="nobody"))
    assert code == 0
    home = subprocess.run(["getent", "passwd", "nobody"], capture_output=True, text=True).stdout.split(":")[5]
    lines = out.decode().splitlines()
    assert lines[:3] == ["nobody", "65534", "65534"]
    assert lines[3] == f"{home} nobody nobody"
    assert lines[4] == (home if Path(home).is_dir() else "/")  # its home, or / when it has none
    # A HOME in the request (the image's ENV or the caller's) is kept; USER and LOGNAME are the account's.
    given = {**USER_ENV, "HOME": "/srv/given", "USER": "root", "LOGNAME": "root"}
    out, _, _ = await _run(guest, ExecRequest("/bin/sh", ["-c", script], given, "", user="nobody"))
    assert out.decode().splitlines()[3] == "/srv/given nobody nobody"
    out, _, _ = await _run(guest, ExecRequest("/bin/sh", ["-c", "id -u; id -g"], ENV, "/", user="65534"))
    assert out == b"65534\n65534\n"
    with pytest.raises(GuestUserError, match="no-such-user"):
        await _run(guest, ExecRequest("touch", [str(tmp_path / "ran")], ENV, "/", user="no-such-user"))
    assert not (tmp_path / "ran").exists()
    # The kept connection of a plain exec still runs as root after all that.
    out, _, _ = await _run(guest, ExecRequest("id", ["-un"], ENV, "/"))
    assert out == b"root\n"

    processes = GuestProcesses(guest)
    started = await processes.start(
        StartRequest("/bin/sh", ["-c", 'id -un; tty; echo "$HOME"'], USER_ENV, "/", (24, 80), "nobody")
    )
    pty_out = await _output(processes, started["process_id"])
    assert pty_out.startswith(b"nobody\r\n/dev/pts/") and pty_out.endswith(f"\r\n{home}\r\n".encode())
    given_home = await processes.start(
        StartRequest("/bin/sh", ["-c", 'echo "$HOME $USER"'], given, "/", None, "nobody")
    )
    assert await _output(processes, given_home["process_id"]) == b"/srv/given nobody\n"
    with pytest.raises(GuestUserError, match="no-such-user"):
        await processes.start(StartRequest("true", [], ENV, "/", None, "no-such-user"))


async def test_an_old_guest_refuses_a_user_and_runs_nothing(old_guest: GuestClient, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    with pytest.raises(GuestTooOldError, match="create the sandbox anew"):
        await _run(old_guest, ExecRequest("touch", [str(ran)], ENV, "/", user="nobody"))
    with pytest.raises(GuestTooOldError):
        await GuestProcesses(old_guest).start(StartRequest("touch", [str(ran)], ENV, "/", None, "nobody"))
    assert not ran.exists()
    out, _, code = await _run(old_guest, ExecRequest("id", ["-un"], ENV, "/"))
    assert (out, code) == (b"root\n", 0)
