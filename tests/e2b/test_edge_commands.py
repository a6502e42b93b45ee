"""The unmodified ``e2b`` SDK's commands and PTY through the sandbox edge (envd's ``process.Process`` on
Paddock's process manager), configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. Every test
fails on the code before the edge (nothing listened on E2B_SANDBOX_URL)."""

from __future__ import annotations

import time

import pytest

from e2b import CommandExitException, NotFoundException, PtySize, Sandbox, TimeoutException

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_run_streams_output_and_exit_codes(sandbox: Sandbox) -> None:
    seen: list[str] = []
    result = sandbox.commands.run(
        "echo one; sleep 1; echo two >&2; echo three", on_stdout=seen.append, envs={"GREETING": "hi"}
    )
    assert result.exit_code == 0
    assert result.stdout == "one\nthree\n"
    assert result.stderr == "two\n"
    assert seen == ["one\n", "three\n"]
    assert sandbox.commands.run("echo $GREETING", envs={"GREETING": "hi"}).stdout == "hi\n"
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo bad >&2; exit 3")
    assert failed.value.exit_code == 3
    assert failed.value.stderr == "bad\n"


def test_stdin_background_list_and_kill(sandbox: Sandbox) -> None:
    cat = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(cat.pid, "hello\n")
    sandbox.commands.close_stdin(cat.pid)
    done = cat.wait()
    assert done.stdout == "hello\n"
    assert done.exit_code == 0

    sleeper = sandbox.commands.run("sleep 600", background=True)
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert sleeper.pid in listed
    assert listed[sleeper.pid].args[-1] == "sleep 600"
    assert sandbox.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException) as killed:
        sleeper.wait()
    assert killed.value.exit_code == -1
    # Ended (its output may still be listed, draining): nothing to kill. Asked before the guest has
    # reaped it, on a loaded CI box, a second SIGKILL is still delivered, as envd's would be.
    assert sandbox.commands.kill(sleeper.pid) is False
    assert sleeper.pid not in {p.pid for p in sandbox.commands.list()}
    assert sandbox.commands.kill(sleeper.pid) is False  # NotFound, as the SDK expects
    assert sandbox.commands.kill(999_999) is False


def test_connect_to_a_running_command(sandbox: Sandbox) -> None:
    ticker = sandbox.commands.run("for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.5; done", background=True)
    time.sleep(1.2)
    again = sandbox.commands.connect(ticker.pid)
    result = again.wait()
    assert result.exit_code == 0
    assert "tick6\n" in result.stdout
    assert not result.stdout.startswith("tick1\n")  # only what came after the connect
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999_999)


def test_command_timeout_ends_the_wait(sandbox: Sandbox) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=2)
    assert time.monotonic() - started < 15


def test_pty_runs_a_shell(sandbox: Sandbox) -> None:
    out = bytearray()
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(terminal.pid, b"stty size; echo pty-$((6*7)); exit\n")
    result = terminal.wait(on_pty=out.extend)
    text = bytes(out).decode(errors="replace")
    assert "pty-42" in text
    assert "24 80" in text
    assert result.exit_code == 0


def test_run_with_a_shell_of_the_callers_choice(sandbox: Sandbox) -> None:
    """SDK 2.64's ``shell``: the command runs as the last argument of the executable and arguments given
    (``["/bin/bash", "-l", "-c"]`` when none), and the process list shows them as started."""
    assert sandbox.commands.run("echo $0", shell=["/bin/sh", "-c"]).stdout == "/bin/sh\n"
    assert sandbox.commands.run("echo $0").stdout == "/bin/bash\n"
    python = sandbox.commands.run("import sys; print(sys.argv[1:], 6 * 7)", shell=["python3", "-c"])
    assert python.stdout == "[] 42\n"
    waiting = sandbox.commands.run("sleep 30", shell=["/bin/sh", "-c"], background=True)
    try:
        (listed,) = [process for process in sandbox.commands.list() if process.pid == waiting.pid]
        assert (listed.cmd, listed.args) == ("/bin/sh", ["-c", "sleep 30"])
    finally:
        waiting.kill()
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("exit 4", shell=["/bin/sh", "-c"])
    assert failed.value.exit_code == 4
