"""E2B's own command-line tool (``@e2b/cli`` from npm, pinned by tests/e2b/js/package-lock.json), unmodified,
against a live Paddock configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY: a user who
manages E2B sandboxes from a shell keeps doing so. It lists, shows, runs a command in (its output and
exit code), pauses, resumes, snapshots and kills a sandbox and shows its metrics and logs; builds a template from a
Dockerfile, lists and deletes it; and opens a terminal in a sandbox through a pseudo-terminal, as a
person at a keyboard does. Before, ``template list`` was a 501."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import secrets
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from e2b.api import ApiClient
from e2b.api.client.api.sandboxes import get_v_2_sandboxes_sandbox_id_logs
from e2b.api.client.models import Error

from e2b import ConnectionConfig, Sandbox
from tests.e2b.conftest import E2bPlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

CLI = Path(__file__).with_name("js") / "node_modules" / "@e2b" / "cli" / "dist" / "index.js"


@pytest.fixture(scope="module")
def e2b() -> list[str]:
    """The command that runs the CLI."""
    node = shutil.which("node")
    assert node is not None, "node is needed (scripts/setup-host.sh installs it)"
    assert CLI.is_file(), "run make setup-test (npm ci in tests/e2b/js)"
    return [node, str(CLI)]


def _env(platform: E2bPlatform, home: Path) -> dict[str, str]:
    """The user's three variables, and a home of the test's own (the CLI keeps its login there).
    ``NO_UPDATE_NOTIFIER``: on a terminal (``connect``'s) the CLI asks registry.npmjs.org for a newer
    version of itself, and no test sends traffic off this machine."""
    kept = {key: value for key, value in os.environ.items() if not key.startswith("E2B_")}
    quiet = {"HOME": str(home), "NO_COLOR": "1", "FORCE_COLOR": "0", "NO_UPDATE_NOTIFIER": "1"}
    return kept | platform.env | quiet


def run(
    e2b: list[str], platform: E2bPlatform, home: Path, *args: str, check: bool = True, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*e2b, *args],
        env=_env(platform, home),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check:
        assert done.returncode == 0, (args, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return done


def _json(text: str) -> object:
    """The JSON the CLI printed (it may print a blank line before it)."""
    return json.loads(text.strip())


def test_the_cli_manages_a_sandbox(e2b: list[str], e2b_env: E2bPlatform, tmp_path: Path) -> None:
    sandbox = Sandbox.create(metadata={"made-by": "cli-test"}, timeout=300)
    try:
        sandbox_id = sandbox.sandbox_id
        listed = _json(
            run(e2b, e2b_env, tmp_path, "sandbox", "list", "-m", "made-by=cli-test", "-f", "json").stdout
        )
        assert isinstance(listed, list)
        assert [entry["sandboxId"] for entry in listed] == [sandbox_id]
        assert listed[0]["metadata"] == {"made-by": "cli-test"} and listed[0]["state"] == "running"

        info = _json(run(e2b, e2b_env, tmp_path, "sandbox", "info", sandbox_id, "-f", "json").stdout)
        assert isinstance(info, dict)
        assert info["sandboxId"] == sandbox_id and info["templateId"] == "base"

        ran = run(
            e2b, e2b_env, tmp_path, "sandbox", "exec", "-e", "WHO=cli", sandbox_id,
            "sh", "-c", "echo hello $WHO; echo oops >&2; exit 3", check=False,
        )  # fmt: skip
        assert ran.returncode == 3, (ran.stdout, ran.stderr)
        assert "hello cli" in ran.stdout and "oops" in ran.stderr

        # A Paddock sandbox's log is its boot log: the host agent's lines about the boot among them.
        printed = run(e2b, e2b_env, tmp_path, "sandbox", "logs", sandbox_id, "--format", "json").stdout
        shown = [json.loads(line) for line in printed.splitlines() if line.strip()]
        assert any("the guest agent answered" in json.dumps(line) for line in shown), printed
        entries = get_v_2_sandboxes_sandbox_id_logs.sync(
            sandbox_id, client=ApiClient(ConnectionConfig()), search="guest agent", limit=5
        )
        assert entries is not None and not isinstance(entries, Error)
        assert [entry.fields.additional_properties for entry in entries.logs] == [{"logger": "paddock-boot"}]
        assert "booted in" in entries.logs[0].message

        run(e2b, e2b_env, tmp_path, "sandbox", "pause", sandbox_id)
        paused = _json(run(e2b, e2b_env, tmp_path, "sandbox", "list", "-s", "paused", "-f", "json").stdout)
        assert isinstance(paused, list) and sandbox_id in [entry["sandboxId"] for entry in paused]
        run(e2b, e2b_env, tmp_path, "sandbox", "resume", sandbox_id)
        again = run(e2b, e2b_env, tmp_path, "sandbox", "exec", sandbox_id, "cat", "/proc/1/comm")
        assert again.stdout.strip()

        # The metrics worker samples every 10 s: the CLI shows the samples once there is one.
        shown: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while not shown and time.monotonic() < deadline:
            printed = run(e2b, e2b_env, tmp_path, "sandbox", "metrics", sandbox_id, "--format", "json").stdout
            shown = [json.loads(line) for line in printed.splitlines() if line.strip()]
            if not shown:
                time.sleep(1)
        assert shown, "the CLI showed no metrics in 30 s"
        assert shown[-1]["cpuCount"] == 2 and shown[-1]["memTotal"] == 2048 * 1024 * 1024

        snap = f"cli-snap-{secrets.token_hex(3)}"
        run(e2b, e2b_env, tmp_path, "sandbox", "snapshot", "create", "-n", snap, sandbox_id, timeout_s=300)
        snapshots = _json(
            run(e2b, e2b_env, tmp_path, "sandbox", "snapshot", "list", "-n", snap, "-f", "json").stdout
        )
        assert isinstance(snapshots, list) and [entry["names"] for entry in snapshots] == [[snap]], snapshots
        run(e2b, e2b_env, tmp_path, "sandbox", "snapshot", "delete", snapshots[0]["snapshotId"])
        gone_snapshots = _json(
            run(e2b, e2b_env, tmp_path, "sandbox", "snapshot", "list", "-n", snap, "-f", "json").stdout
        )
        assert gone_snapshots == []

        run(e2b, e2b_env, tmp_path, "sandbox", "kill", sandbox_id)
        gone = _json(
            run(e2b, e2b_env, tmp_path, "sandbox", "list", "-m", "made-by=cli-test", "-f", "json").stdout
        )
        assert gone == []
        missing = run(e2b, e2b_env, tmp_path, "sandbox", "info", sandbox_id, check=False)
        assert missing.returncode != 0
        # Its logs (its audit trail's entries) and metrics outlive it, as E2B's do.
        printed = run(e2b, e2b_env, tmp_path, "sandbox", "logs", sandbox_id, "--format", "json").stdout
        after = [json.loads(line) for line in printed.splitlines() if line.strip()]
        assert any("started:" in json.dumps(line) and "echo hello $WHO" in json.dumps(line) for line in after)
        assert any("DELETE /sandboxes/{sandbox_id} answered 204" in json.dumps(line) for line in after)
        printed = run(e2b, e2b_env, tmp_path, "sandbox", "metrics", sandbox_id, "--format", "json").stdout
        kept = [json.loads(line) for line in printed.splitlines() if line.strip()]
        assert kept and kept[-1]["cpuCount"] == 2, printed
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_the_cli_builds_lists_and_deletes_a_template(
    e2b: list[str], e2b_env: E2bPlatform, tmp_path: Path
) -> None:
    """``e2b template create`` reads a Dockerfile and builds it through E2B's build API, with its
    ``--cmd`` and ``--ready-cmd``; the template boots with what its steps made and its start command
    serving, ``template list`` shows it and ``template delete`` removes it."""
    name = f"cli-tpl-{secrets.token_hex(3)}"
    context = tmp_path / "context"
    context.mkdir()
    (context / "hello.txt").write_text("from the cli\n")
    (context / "Dockerfile").write_text(
        "FROM e2bdev/base\nCOPY hello.txt /srv/hello.txt\nRUN wc -c < /srv/hello.txt > /srv/size.txt\n"
    )
    try:
        start = ("--cmd", "python3 -m http.server 8123 --directory /srv")
        ready = ("--ready-cmd", "curl -sf http://127.0.0.1:8123/size.txt")
        run(
            e2b,
            e2b_env,
            tmp_path,
            "template",
            "create",
            name,
            "-p",
            str(context),
            *start,
            *ready,
            timeout_s=600,
        )
        listed = _json(run(e2b, e2b_env, tmp_path, "template", "list", "-f", "json").stdout)
        assert isinstance(listed, list)
        mine = [entry for entry in listed if entry["templateID"] == name]
        assert len(mine) == 1, listed
        assert mine[0]["buildStatus"] == "ready" and mine[0]["public"] is False

        booted = Sandbox.create(name, timeout=120)
        try:
            assert booted.files.read("/srv/hello.txt") == "from the cli\n"
            assert booted.files.read("/srv/size.txt").strip() == "13"
            # --cmd is the template's start command, running (and ready) when the create answers, as
            # E2B's account, which every E2B template has.
            served = booted.commands.run("curl -s http://127.0.0.1:8123/hello.txt; id -un")
            assert served.stdout == "from the cli\nuser\n", served
        finally:
            booted.kill()

        run(e2b, e2b_env, tmp_path, "template", "delete", name, "-y")
        after = _json(run(e2b, e2b_env, tmp_path, "template", "list", "-f", "json").stdout)
        assert isinstance(after, list) and name not in [entry["templateID"] for entry in after]
    finally:
        httpx.delete(f"{e2b_env.api_url}/templates/{name}", headers={"X-API-Key": e2b_env.api_key})


def test_the_cli_opens_a_terminal_in_a_sandbox(e2b: list[str], e2b_env: E2bPlatform, tmp_path: Path) -> None:
    """``e2b sandbox connect`` wants a terminal: it runs on a pseudo-terminal here, reads what is typed
    and shows what the sandbox's shell answers; ``exit`` ends the shell and the CLI with it."""
    sandbox = Sandbox.create(timeout=300)
    try:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the CLI on the terminal
            os.execve(e2b[0], [*e2b, "sandbox", "connect", sandbox.sandbox_id], _env(e2b_env, tmp_path))
        seen = _read_until(fd, b"answer=42", typing=b"echo answer=$((6*7))\r", timeout_s=60)
        assert b"answer=42" in seen, seen[-2000:]
        os.write(fd, b"exit\r")
        status = _wait_exit(pid, fd, timeout_s=20)
        os.close(fd)
        assert status == 0, f"the CLI did not end with the shell: {status}"
    finally:
        sandbox.kill()


def _read_until(fd: int, wanted: bytes, typing: bytes, timeout_s: float) -> bytes:
    """What the terminal shows until ``wanted``; ``typing`` is typed again every few seconds until then,
    since what is typed before the CLI has opened the sandbox's terminal may be dropped."""
    seen = b""
    typed_at = 0.0
    deadline = time.monotonic() + timeout_s
    while wanted not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the CLI ended
                break
        if time.monotonic() - typed_at > 3 and (b"#" in seen or b"$" in seen):
            os.write(fd, typing)
            typed_at = time.monotonic()
    return seen


def _wait_exit(pid: int, fd: int, timeout_s: float) -> int | None:
    """The CLI's exit code once it ends (draining the terminal meanwhile), or None if it did not."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if select.select([fd], [], [], 0.2)[0]:
            with contextlib.suppress(OSError):
                os.read(fd, 65536)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None
