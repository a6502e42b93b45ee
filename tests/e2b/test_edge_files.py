"""The unmodified ``e2b`` SDK's filesystem through the sandbox edge (``/files`` and envd's
``filesystem.Filesystem`` on Paddock's guest), a user port, and what the edge answers for a sandbox that
is gone or a caller without the sandbox's token. Configured only by E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY. Every test fails on the code before the edge (nothing listened on E2B_SANDBOX_URL)."""

from __future__ import annotations

import hashlib
import os
import time

import httpx
import pytest

from e2b import (
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)
from tests.e2b.conftest import E2bPlatform
from tests.network.ingress_support import APP

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_write_and_read_5_mib_and_text(sandbox: Sandbox) -> None:
    blob = os.urandom(5 << 20)
    info = sandbox.files.write("/tmp/e2b/deep/blob.bin", blob)  # parents are made, as on E2B
    assert info.path == "/tmp/e2b/deep/blob.bin"
    assert info.type == FileType.FILE
    back = sandbox.files.read("/tmp/e2b/deep/blob.bin", format="bytes")
    assert hashlib.sha256(back).hexdigest() == hashlib.sha256(blob).hexdigest()
    digest = sandbox.commands.run("sha256sum /tmp/e2b/deep/blob.bin").stdout.split()[0]
    assert digest == hashlib.sha256(blob).hexdigest()  # the sandbox holds the same bytes

    sandbox.files.write("/tmp/e2b/hello.txt", "héllo\n")
    assert sandbox.files.read("/tmp/e2b/hello.txt") == "héllo\n"
    many = sandbox.files.write_files(
        [{"path": "/tmp/e2b/a.txt", "data": "a"}, {"path": "/tmp/e2b/b.txt", "data": b"bb"}]
    )
    assert sorted(w.path for w in many) == ["/tmp/e2b/a.txt", "/tmp/e2b/b.txt"]
    assert sandbox.files.read("/tmp/e2b/b.txt") == "bb"
    with pytest.raises(NotFoundException):
        sandbox.files.read("/tmp/e2b/nope.txt")
    # the guest makes the parents (mode 0755); a parent that is a file is the caller's 400, naming it
    assert sandbox.commands.run("stat -c %a /tmp/e2b/deep").stdout.strip() == "755"
    with pytest.raises(InvalidArgumentException, match=r"hello\.txt is not a directory"):
        sandbox.files.write("/tmp/e2b/hello.txt/under.txt", "x")


def test_stat_list_mkdir_rename_remove(sandbox: Sandbox) -> None:
    assert sandbox.files.make_dir("/tmp/fs/sub") is True
    assert sandbox.files.make_dir("/tmp/fs/sub") is False  # already there
    sandbox.files.write("/tmp/fs/sub/x.txt", "12345")
    sandbox.commands.run("ln -s /tmp/fs/sub/x.txt /tmp/fs/link")

    entry = sandbox.files.get_info("/tmp/fs/sub/x.txt")
    assert (entry.name, entry.type, entry.size) == ("x.txt", FileType.FILE, 5)
    assert entry.permissions == "-rw-r--r--"
    assert entry.owner == "root"
    assert abs(entry.modified_time.timestamp() - time.time()) < 120
    assert sandbox.files.get_info("/tmp/fs/sub").type == FileType.DIR
    assert sandbox.files.get_info("/tmp/fs/link").symlink_target == "/tmp/fs/sub/x.txt"

    top = {e.name: e for e in sandbox.files.list("/tmp/fs")}
    assert set(top) == {"sub", "link"}
    deep = {e.path for e in sandbox.files.list("/tmp/fs", depth=2)}
    assert deep == {"/tmp/fs/sub", "/tmp/fs/link", "/tmp/fs/sub/x.txt"}
    with pytest.raises(NotFoundException):
        sandbox.files.list("/tmp/none")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list("/tmp/fs/sub/x.txt")  # not a directory

    moved = sandbox.files.rename("/tmp/fs/sub/x.txt", "/tmp/fs/y.txt")
    assert moved.path == "/tmp/fs/y.txt"
    assert sandbox.files.exists("/tmp/fs/y.txt") is True
    assert sandbox.files.exists("/tmp/fs/sub/x.txt") is False
    sandbox.files.remove("/tmp/fs")
    assert sandbox.files.exists("/tmp/fs") is False
    weird = "/tmp/it's $(echo x > pwned); `id` \"name"
    sandbox.files.write(weird, "ok")
    assert sandbox.files.get_info(weird).name == "it's $(echo x > pwned); `id` \"name"
    assert [e.name for e in sandbox.files.list("/tmp") if "pwned" in e.name] == [weird[5:]]
    assert "pwned" not in sandbox.commands.run("ls -a / /tmp /root").stdout.replace(weird[5:], "")


def _until_gone(sandbox: Sandbox, path: str, failure: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while sandbox.commands.run(f"test -e {path} && echo there || echo gone").stdout.strip() != "gone":
        assert time.monotonic() < deadline, failure
        time.sleep(0.2)


def test_a_listing_the_caller_gave_up_on_ends_and_a_removal_finishes(e2b_env: E2bPlatform) -> None:
    """The listing runs ``find`` in the sandbox, which is the tenant's to replace. A caller whose request
    times out takes that command with it. A removal is not cut short, as envd's is not: it finishes
    after its caller has gone. (A sandbox of its own: the module's shared one keeps its tools.)"""
    sandbox = Sandbox.create(timeout=120)
    try:
        stuck = "#!/bin/sh\necho $$ > /tmp/find.pid\nexec sleep 300\n"
        placed = sandbox.commands.run(
            f"printf '{stuck}' > /usr/local/bin/find && chmod +x /usr/local/bin/find"
        )
        assert placed.exit_code == 0
        with pytest.raises(TimeoutException):
            sandbox.files.list("/tmp", request_timeout=2)
        pid = sandbox.files.read("/tmp/find.pid").strip()
        assert pid.isdigit(), "the listing did not run the tenant's find"
        _until_gone(sandbox, f"/proc/{pid}", f"the listing's find (pid {pid}) outlived its caller", 10)

        slow = '#!/bin/sh\nsleep 3\nexec /usr/bin/rm "$@"\n'
        placed = sandbox.commands.run(
            f"printf '{slow}' > /usr/local/bin/rm && chmod +x /usr/local/bin/rm && mkdir -p /srv/tree/a/b"
        )
        assert placed.exit_code == 0
        with pytest.raises(TimeoutException):
            sandbox.files.remove("/srv/tree", request_timeout=1)
        _until_gone(sandbox, "/srv/tree", "the removal stopped when its caller left", 15)
    finally:
        sandbox.kill()


def test_watch_dir_reports_create_write_remove(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/tmp/watched")
    sandbox.files.write("/tmp/watched/old.txt", "old")
    handle = sandbox.files.watch_dir("/tmp/watched")
    try:
        sandbox.files.write("/tmp/watched/new.txt", "new")
        sandbox.commands.run("echo more >> /tmp/watched/old.txt")
        sandbox.files.remove("/tmp/watched/old.txt")
        events = handle.get_new_events()
        seen = {(e.name, e.type) for e in events}
        assert ("new.txt", FilesystemEventType.CREATE) in seen
        assert ("old.txt", FilesystemEventType.REMOVE) in seen
        sandbox.commands.run("sleep 1.1; echo x >> /tmp/watched/new.txt")
        assert {(e.name, e.type) for e in handle.get_new_events()} == {("new.txt", FilesystemEventType.WRITE)}
        assert handle.get_new_events() == []
    finally:
        handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()


def test_user_port_and_sandbox_gone(e2b_env: E2bPlatform, sandbox: Sandbox) -> None:
    sandbox.files.write("/srv/app.pl", APP.read_bytes())
    server = sandbox.commands.run("exec perl /srv/app.pl 8080", background=True)
    plain = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8080"}
    token = {"X-Access-Token": sandbox._envd_access_token or ""}
    headers = {**plain, **token}
    deadline = time.monotonic() + 30
    answer = httpx.get(f"{e2b_env.sandbox_url}/hello", headers=headers)
    while answer.status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.3)
        answer = httpx.get(f"{e2b_env.sandbox_url}/hello", headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.text.startswith("hello from ")  # the app in the sandbox answered
    host = f"8080-{sandbox.sandbox_id}.{sandbox.sandbox_domain}"  # the ingress's name, no E2B headers
    by_host = httpx.get(f"{e2b_env.sandbox_url}/hello", headers={"Host": host, **token})
    assert by_host.status_code == 200 and by_host.text.startswith("hello from "), (host, by_host.text)
    # Paddock's ingress is off for this sandbox: without its token nobody reaches the port
    refused_port = httpx.get(f"{e2b_env.sandbox_url}/hello", headers=plain)
    assert refused_port.status_code == 403 and "ingress is off" in refused_port.json()["message"]
    assert httpx.get(f"{e2b_env.sandbox_url}/hello", headers={"Host": host}).status_code == 403
    closed = httpx.get(f"{e2b_env.sandbox_url}/", headers={**headers, "E2b-Sandbox-Port": "8099"})
    assert closed.status_code == 502 and "port is not open" in closed.json()["message"]
    server.kill()

    envd = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"}
    refused = httpx.get(f"{e2b_env.sandbox_url}/files", params={"path": "/etc/hostname"}, headers=envd)
    assert refused.status_code == 401  # no X-Access-Token: another tenant cannot read the files
    wrong = httpx.get(
        f"{e2b_env.sandbox_url}/files",
        params={"path": "/etc/hostname"},
        headers={**envd, "X-Access-Token": "ea_" + "0" * 64},
    )
    assert wrong.status_code == 401
    missing = httpx.get(f"{e2b_env.sandbox_url}/health", headers={**envd, "E2b-Sandbox-Id": "sb-nope"})
    assert missing.status_code == 502 and "was not found" in missing.text


def test_killed_sandbox_reads_as_not_running(e2b_env: E2bPlatform) -> None:
    from e2b import SandboxNotRunningException

    gone = Sandbox.create(timeout=120)
    assert gone.commands.run("echo up").stdout == "up\n"
    gone.kill()
    with pytest.raises(SandboxNotRunningException):
        gone.commands.run("echo again")
    with pytest.raises(SandboxNotRunningException):
        gone.files.read("/etc/hostname")
    assert gone.is_running() is False
