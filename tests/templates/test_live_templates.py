"""Templates built by the real builder (buildah on the host agent, RUN steps under crun in a sandbox-like
network namespace) and booted as real sandboxes. RUN steps reach only the Debian archive (apt-get) and
addresses these tests create."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

DOCKERFILE = """\
FROM debian:13
ENV GREETING="hello from the template"
RUN apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/app
RUN echo built > /srv/app/marker.txt
CMD ["sleep", "infinity"]
"""


def wait_done(http: httpx.Client, template_id: str, timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    data: dict[str, Any] = {}
    while time.monotonic() < deadline:
        data = http.get(f"/v1/templates/{template_id}").json()["data"]
        if data["status"] in ("ready", "failed"):
            return data
        time.sleep(0.5)
    raise AssertionError(f"template {template_id} did not finish in {timeout_s} s: {data}")


def frames_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sh(http: httpx.Client, sandbox_id: str, script: str) -> dict[str, Any]:
    resp = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "sh", "args": ["-c", script]})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["data"]["result"])


def process_says(http: httpx.Client, sandbox_id: str, script: str) -> list[str]:
    """The lines ``script`` writes when run as a managed process (``/v1/…/processes``, not ``exec``)."""
    base = f"/v1/sandboxes/{sandbox_id}/processes"
    started = http.post(base, json={"cmd": "bash", "args": ["-c", f"{{ {script}; }} > /tmp/said.txt 2>&1"]})
    assert started.status_code == 200, started.text
    done = http.get(f"{base}/{started.json()['data']['process_id']}/wait", params={"timeout_ms": 10000})
    assert done.json()["data"]["exit_code"] == 0, done.text
    return str(sh(http, sandbox_id, "cat /tmp/said.txt")["stdout"]).splitlines()


@pytest.fixture(scope="module")
def http(live: LivePlatform) -> Iterator[httpx.Client]:
    with live.http(live.api_key("pro"), timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def built(http: httpx.Client) -> Iterator[dict[str, Any]]:
    """One template built from DOCKERFILE, its log as followed while it built, and when each frame came."""
    created = http.post("/v1/templates", json={"name": "jq-box", "dockerfile": DOCKERFILE})
    assert created.status_code == 200, created.text
    template = created.json()["data"]
    arrivals: list[tuple[float, dict[str, Any], str]] = []
    with http.stream("GET", f"/v1/templates/{template['id']}/logs", params={"follow": "true"}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.strip():
                frame = json.loads(line)
                status = (
                    ""
                    if frame.get("final")
                    else http.get(f"/v1/templates/{template['id']}").json()["data"]["status"]
                )
                arrivals.append((time.monotonic(), frame, status))
    yield {"template": wait_done(http, template["id"]), "arrivals": arrivals}
    http.delete(f"/v1/templates/{template['id']}")


def test_the_log_streams_while_building_and_ends_with_the_final_frame(built: dict[str, Any]) -> None:
    arrivals = built["arrivals"]
    assert arrivals[-1][1]["final"] is True and arrivals[-1][1]["status"] == "ready"
    # Lines arrived while the template was still building, not all at the end.
    assert any(status == "building" for _, frame, status in arrivals[:-1])
    lines = [frame["line"] for _, frame, _ in arrivals[:-1]]
    assert any("apt-get install" in line for line in lines) and any("jq" in line for line in lines)
    assert all(frame["attempt"] == 1 and isinstance(frame["ts"], str) for _, frame, _ in arrivals)


def test_a_sandbox_from_the_template_has_the_package_the_file_env_and_workdir(
    http: httpx.Client, built: dict[str, Any]
) -> None:
    template = built["template"]
    assert template["status"] == "ready" and template["ext4_size_bytes"] > 50_000_000 and template["built_at"]
    created = http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "jq-box", "disk_mib": 2048})
    assert created.status_code == 200, created.text
    sandbox = created.json()["data"]
    try:
        assert sandbox["rootfs"] == template["id"] and sandbox["status"] == "running"
        out = sh(http, sandbox["id"], 'echo "$GREETING"; pwd; cat marker.txt; echo \'{"a": 7}\' | jq .a')
        assert out["exit_code"] == 0, out
        assert out["stdout"].splitlines() == ["hello from the template", "/srv/app", "built", "7"]
        # A managed process too (as E2B's commands are): before 2026-12-07 it ran without ENV and WORKDIR.
        assert process_says(http, sandbox["id"], 'echo "$GREETING"; pwd') == [
            "hello from the template",
            "/srv/app",
        ]
    finally:
        http.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_user_applies_to_exec_and_template_ids_stay_private(http: httpx.Client, live: LivePlatform) -> None:
    # No WORKDIR: a command starts in the USER's home, with its HOME, as `exec` with a `user` does (before
    # 2026-12-07 it started in /root with HOME=/root, which the account cannot write).
    dockerfile = "FROM debian:13\nRUN useradd --create-home --uid 1234 app\nUSER app\n"
    created = http.post("/v1/templates", json={"name": "as-app", "dockerfile": dockerfile}).json()["data"]
    try:
        assert wait_done(http, created["id"])["status"] == "ready"
        hosts = http.get("/v1/hosts").json()["data"]["data"]
        assert all(not name.startswith("tpl_") for host in hosts for name in host.get("rootfses", []))
        sandbox = http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "as-app"}).json()["data"]
        try:
            out = sh(
                http,
                sandbox["id"],
                'id -un; id -u; pwd; echo "$HOME"; touch /root/x 2>/dev/null || echo denied',
            )
            assert out["stdout"].splitlines() == ["app", "1234", "/home/app", "/home/app", "denied"], out
            assert process_says(http, sandbox["id"], 'id -un; pwd; echo "$HOME $USER"; touch ~/mine') == [
                "app",
                "/home/app",
                "/home/app app",
            ]
            # The process list shows the command that was asked for (it showed setpriv, its wrapper).
            listed = http.get(f"/v1/sandboxes/{sandbox['id']}/processes").json()["data"]["processes"]
            assert [(p["cmd"], p["args"][0]) for p in listed] == [("bash", "-c")], listed
        finally:
            http.delete(f"/v1/sandboxes/{sandbox['id']}")
    finally:
        http.delete(f"/v1/templates/{created['id']}")


def test_a_templates_own_home_wins_over_its_users(http: httpx.Client, live: LivePlatform) -> None:
    """`ENV HOME=…` under a non-root USER is the HOME its commands get, as under Docker (before
    2026-12-07 the guest replaced it with the account's home); USER and LOGNAME are still the account's."""
    dockerfile = (
        "FROM debian:13\nRUN useradd --create-home app && install -d -o app /srv/data\n"
        "USER app\nENV HOME=/srv/data\n"
    )
    created = http.post("/v1/templates", json={"name": "home-data", "dockerfile": dockerfile}).json()["data"]
    try:
        assert wait_done(http, created["id"])["status"] == "ready"
        sandbox = http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "home-data"}).json()[
            "data"
        ]
        try:
            out = sh(http, sandbox["id"], 'echo "$HOME $USER $LOGNAME"; cd && touch mine && pwd')
            assert out["stdout"].splitlines() == ["/srv/data app app", "/srv/data"], out
            assert process_says(http, sandbox["id"], 'echo "$HOME"') == ["/srv/data"]
        finally:
            http.delete(f"/v1/sandboxes/{sandbox['id']}")
        # The caller's own HOME (the sandbox's envs) wins over the template's, as `docker run -e` does.
        body = {"shape": "s-1vcpu-1gb", "rootfs": "home-data", "envs": {"HOME": "/tmp"}}
        sandbox = http.post("/v1/sandboxes", json=body).json()["data"]
        try:
            assert sh(http, sandbox["id"], 'echo "$HOME $USER"')["stdout"] == "/tmp app\n"
        finally:
            http.delete(f"/v1/sandboxes/{sandbox['id']}")
    finally:
        http.delete(f"/v1/templates/{created['id']}")


def test_the_same_dockerfile_again_hits_the_layer_cache(http: httpx.Client, built: dict[str, Any]) -> None:
    started = time.monotonic()
    created = http.post("/v1/templates", json={"name": "jq-box-again", "dockerfile": DOCKERFILE}).json()[
        "data"
    ]
    done = wait_done(http, created["id"])
    took_s = time.monotonic() - started
    try:
        assert done["status"] == "ready"
        lines = [
            frame.get("line", "") for frame in frames_of(http.get(f"/v1/templates/{created['id']}/logs").text)
        ]
        assert sum("Using cache" in line for line in lines) >= 4, lines
        assert not any("Get:" in line for line in lines)  # apt-get did not run again
        assert took_s < 60, took_s
    finally:
        http.delete(f"/v1/templates/{created['id']}")


def test_a_failing_run_fails_with_the_line_and_the_attempt_count(
    http: httpx.Client, live: LivePlatform
) -> None:
    dockerfile = "FROM debian:13\nRUN echo about to fail && exit 3\n"
    created = http.post("/v1/templates", json={"name": "fails", "dockerfile": dockerfile}).json()["data"]
    try:
        assert wait_done(http, created["id"])["status"] == "failed"
        frames = frames_of(http.get(f"/v1/templates/{created['id']}/logs").text)
        assert frames[-1]["final"] is True and frames[-1]["status"] == "failed" and frames[-1]["attempt"] == 2
        assert {frame["attempt"] for frame in frames} == {1, 2}
        for attempt in (1, 2):
            lines = [frame["line"] for frame in frames if frame["attempt"] == attempt and "line" in frame]
            assert any("RUN echo about to fail && exit 3" in line for line in lines), lines
            assert any(line == "about to fail" for line in lines), lines
        assert any("after 2 attempt(s)" in frame.get("line", "") for frame in frames)
        refused = http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "fails"})
        assert refused.status_code == 409
    finally:
        http.delete(f"/v1/templates/{created['id']}")


def test_deleting_a_building_template_cancels_its_run_step(http: httpx.Client, live: LivePlatform) -> None:
    host_tmp_before = set(Path("/var/tmp").glob("buildah*"))
    dockerfile = "FROM debian:13\nRUN echo started && sleep 347\n"
    created = http.post("/v1/templates", json={"name": "slow", "dockerfile": dockerfile}).json()["data"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _running("sleep 347"):
        time.sleep(0.3)
    assert _running("sleep 347"), "the RUN step never started"
    run_dir = live.agents[0].state_dir / "buildah" / "run"
    assert list(run_dir.glob("*/tmp/buildah*")), "the RUN step's files are not in the builder's own TMPDIR"
    assert http.get(f"/v1/templates/{created['id']}").json()["data"]["status"] == "building"
    assert http.delete(f"/v1/templates/{created['id']}").json()["data"] == {"ok": True}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _running("sleep 347"):
        time.sleep(0.2)
    assert not _running("sleep 347"), "the RUN step survived the delete"
    assert http.get(f"/v1/templates/{created['id']}").status_code == 404
    # The killed RUN step's own directory (its config.json, hosts, root mount point) is buildah's
    # TMPDIR in the builder's run directory, removed once the build lets its store go; before, it was
    # left in the host's /var/tmp for good.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and list(run_dir.glob("*/tmp/*")):
        time.sleep(0.3)
    assert not list(run_dir.glob("*/tmp/*")), "the RUN step's files stayed"
    assert set(Path("/var/tmp").glob("buildah*")) <= host_tmp_before, "buildah wrote to the host's /var/tmp"


def test_run_steps_cannot_reach_the_host(http: httpx.Client) -> None:
    """A server on every host address; a RUN step that reaches it would print REACHED and fail."""
    server = http_server()
    host_ip = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()[0]
    port = server.server_address[1]
    dockerfile = (
        "FROM debian:13\n"
        f"RUN if curl -s -m 3 http://{host_ip}:{port}/; then echo REACHED; exit 1; fi; "
        "gw=$(ip route | awk '/default/ {print $3}'); "
        f'if curl -s -m 3 "http://$gw:{port}/"; then echo REACHED; exit 1; fi; echo BLOCKED\n'
    )
    try:
        created = http.post("/v1/templates", json={"name": "probe", "dockerfile": dockerfile}).json()["data"]
        done = wait_done(http, created["id"])
        lines = [
            frame.get("line", "") for frame in frames_of(http.get(f"/v1/templates/{created['id']}/logs").text)
        ]
        assert done["status"] == "ready", lines
        assert "BLOCKED" in lines and "REACHED" not in lines
        assert server.hits == 0
        http.delete(f"/v1/templates/{created['id']}")
    finally:
        server.shutdown()


class _CountingServer(ThreadingHTTPServer):
    hits = 0


def http_server() -> _CountingServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.server.hits += 1  # type: ignore[attr-defined]
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"host\n")

        def log_message(self, *args: object) -> None:
            pass

    server = _CountingServer(("0.0.0.0", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _running(command: str) -> bool:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return any(re.fullmatch(rf"(/usr/bin/)?{command}", line.strip()) for line in listing.splitlines())


def test_sdk_and_cli_build_list_follow_and_remove(
    live: LivePlatform, built: dict[str, Any], tmp_path: Path
) -> None:
    """The SDK (sync twin of the async source) and ``paddock template`` as a user runs them. The
    Dockerfile is the module's, built by another account: this account's build does not come from that
    account's layer cache (each account's builder storage is its own)."""
    key = live.api_key("pro")
    with paddock.Client(live.url, key) as sdk:
        created = sdk.templates.create("sdk-box", DOCKERFILE)
        assert created.status == "pending"
        frames = list(sdk.templates.logs("sdk-box", follow=True))
        assert frames[-1].final and frames[-1].status == "ready" and frames[-1].attempt == 1, [
            frame.line for frame in frames[-30:]
        ]
        assert not any("Using cache" in (frame.line or "") for frame in frames)
        assert sdk.templates.get("sdk-box", include_dockerfile=True).dockerfile == DOCKERFILE
        assert [t.name for t in sdk.templates.list()] == ["sdk-box"]
        assert '"final": true' in sdk.templates.log_text(created.id)
        sdk.templates.delete("sdk-box")
        with pytest.raises(paddock.NotFoundError):
            sdk.templates.get(created.id)

    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update({"PADDOCK_BASE_URL": live.url, "PADDOCK_API_KEY": key})
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(DOCKERFILE)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "paddock_cli.main", "template", *args],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    ran = cli("build", "-f", str(dockerfile), "--name", "cli-box")
    assert ran.returncode == 0, ran.stderr
    assert "STEP 1/" in ran.stdout and "cli-box: ready" in ran.stderr
    listed = json.loads(cli("ls", "--json").stdout)
    assert [item["name"] for item in listed] == ["cli-box"] and listed[0]["status"] == "ready"
    assert "#1 " in cli("logs", "cli-box").stdout
    assert cli("rm", "cli-box").returncode == 0
    assert cli("get", "cli-box").returncode == 4
    bad = tmp_path / "Bad"
    bad.write_text("FROM debian:13\nRUN exit 9\n")
    failed = cli("build", "-f", str(bad), "--name", "cli-bad")
    assert failed.returncode == 5 and "cli-bad: failed" in failed.stderr
    cli("rm", "cli-bad")


def test_copy_and_add_read_the_context_the_cli_sends(
    live: LivePlatform, http: httpx.Client, tmp_path: Path
) -> None:
    """``paddock template build --context DIR``: COPY (with --chown) and ADD of a local tar land in the
    image; the link in DIR is left out, so nothing outside DIR can be copied."""
    context = tmp_path / "ctx"
    (context / "app").mkdir(parents=True)
    (context / "app" / "hello.txt").write_text("hello from the context\n")
    (context / "outside").symlink_to("/etc/shadow")
    subprocess.run(
        ["tar", "-C", str(context / "app"), "-cf", str(context / "bundle.tar"), "hello.txt"], check=True
    )
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM debian:13\n"
        "RUN useradd --uid 1500 app\n"
        "COPY --chown=app:app app/ /srv/app/\n"
        "ADD bundle.tar /srv/unpacked/\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update({"PADDOCK_BASE_URL": live.url, "PADDOCK_API_KEY": str(http.headers["X-Api-Key"])})
    ran = subprocess.run(
        [sys.executable, "-m", "paddock_cli.main", "template", "build", "-f", str(dockerfile),
         "--name", "from-context", "--context", str(context)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    sandbox = http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "from-context"}).json()[
        "data"
    ]
    try:
        out = sh(
            http,
            sandbox["id"],
            "cat /srv/app/hello.txt; stat -c %U /srv/app/hello.txt; cat /srv/unpacked/hello.txt; ls /srv/app",
        )
        assert out["stdout"].splitlines() == [
            "hello from the context",
            "app",
            "hello from the context",
            "hello.txt",
        ], out
    finally:
        http.delete(f"/v1/sandboxes/{sandbox['id']}")
        http.delete("/v1/templates/from-context")


def test_a_rebuild_replaces_the_image_and_a_sandbox_of_the_old_one_keeps_it(
    live: LivePlatform, tmp_path: Path
) -> None:
    """The SDK builds v1, the CLI's ``template build --rebuild`` builds v2 under the same name with
    buildah: while it builds the name still boots v1; once ready it boots v2, and the sandbox booted
    from v1 still reads its files (its image is dropped only once no sandbox boots from it)."""
    key = live.api_key("pro")
    v1 = "FROM debian:13\nRUN echo v1 > /version\n"
    v2 = "FROM debian:13\nRUN sleep 15 && echo v2 > /version\n"
    with paddock.Client(live.url, key) as sdk:
        first = sdk.templates.wait(sdk.templates.create("rebuilt", v1).id, timeout_s=600)
        assert first.status == "ready", first
        old = sdk.sandboxes.create("s-1vcpu-256mb", rootfs="rebuilt", disk_mib=2048)
        try:
            assert old.run("cat", ["/version"]).stdout == "v1\n"
            with pytest.raises(paddock.ConflictError, match="rebuild: true"):
                sdk.templates.create("rebuilt", v2)
            dockerfile = tmp_path / "Dockerfile"
            dockerfile.write_text(v2)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
            env.update({"PADDOCK_BASE_URL": live.url, "PADDOCK_API_KEY": key})
            command = [sys.executable, "-m", "paddock_cli.main", "template", "build", "-f", str(dockerfile),
                       "--name", "rebuilt", "--rebuild", "--no-follow", "--json"]  # fmt: skip
            ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            assert ran.returncode == 0, ran.stderr
            second = json.loads(ran.stdout)
            assert second["id"] != first.id and second["name"] == "rebuilt"
            during = sdk.sandboxes.create("s-1vcpu-256mb", rootfs="rebuilt", disk_mib=2048)
            try:
                assert during.info.rootfs == first.id  # still building: the old image boots
                assert during.run("cat", ["/version"]).stdout == "v1\n"
            finally:
                during.destroy()
            assert sdk.templates.wait(second["id"], timeout_s=600).status == "ready"
            new = sdk.sandboxes.create("s-1vcpu-256mb", rootfs="rebuilt", disk_mib=2048)
            try:
                assert new.info.rootfs == second["id"]
                assert new.run("cat", ["/version"]).stdout == "v2\n"
            finally:
                new.destroy()
            assert old.run("cat", ["/version"]).stdout == "v1\n"  # the running sandbox keeps its image
            with pytest.raises(paddock.NotFoundError):
                sdk.templates.get(first.id)
        finally:
            old.destroy()
            with contextlib.suppress(paddock.NotFoundError):
                sdk.templates.delete("rebuilt")


#: A COPY, then layers that add, link, chmod a base file, and delete or replace what layers below hold
#: (whiteouts, an opaque directory, a directory that becomes a file and a file that becomes a directory).
LAYERED = """\
FROM debian:13
COPY app/ /srv/app/
RUN set -e; useradd --uid 1500 app; chown -R 1500:1501 /srv/app; chmod 0750 /srv/app/run.sh; \
    ln /srv/app/run.sh /srv/app/hard.sh; ln -s run.sh /srv/app/current; ln -s /etc/os-release /srv/os; \
    chmod 4711 /usr/bin/env; mkdir /srv/gone; echo x > /srv/gone/x; echo one > /srv/replaced
RUN set -e; rm -rf /srv/gone /etc/apt /usr/share/common-licenses; mkdir /etc/apt; echo only > /etc/apt/only; \
    rm /srv/replaced; mkdir /srv/replaced; echo two > /srv/replaced/now; echo lic > /usr/share/common-licenses
"""
#: What a sandbox of LAYERED shows: one line per check.
LAYERED_CHECK = (
    "stat -c '%a %u:%g %h' /srv/app/run.sh; cat /srv/app/hard.sh; "
    "[ $(stat -c %i /srv/app/run.sh) = $(stat -c %i /srv/app/hard.sh) ] && echo same-inode; "
    "readlink /srv/app/current; readlink /srv/os; grep -c '^ID=debian' /srv/os; stat -c '%a %U' /usr/bin/env; "
    "ls /etc/apt; ls -d /srv/gone 2>/dev/null || echo no-gone; cat /usr/share/common-licenses; "
    "cat /srv/replaced/now; id -un 1500"
)
LAYERED_SEEN = [
    "750 1500:1501 2", "echo from the context", "same-inode", "run.sh", "/etc/os-release", "1",
    "4711 root", "only", "no-gone", "lic", "two", "app",
]  # fmt: skip


def _context(files: dict[str, str]) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o644
            archive.addfile(member, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


def _boot_and_check(http: httpx.Client, rootfs: str, script: str) -> list[str]:
    created = http.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": rootfs})
    assert created.status_code == 200, created.text
    try:
        out = sh(http, created.json()["data"]["id"], script)
        assert out["exit_code"] == 0, out
        return list(out["stdout"].splitlines())
    finally:
        http.delete(f"/v1/sandboxes/{created.json()['data']['id']}")


def test_a_layered_build_boots_with_its_files_links_and_deletions_and_leaves_the_base_alone(
    http: httpx.Client, debian_image: Path
) -> None:
    """The export links the base's files and copies only the build's layers onto them: what a sandbox
    sees is the Dockerfile's result (modes, owners, hard and symbolic links, whiteouts, an opaque
    directory), the catalog image the files were linked from is unchanged (its ``/usr/bin/env`` was
    chmodded only in the template), and a rebuild that hits the cache boots the same image."""
    body = {"dockerfile": LAYERED, "context": _context({"app/run.sh": "echo from the context\n"})}
    ids = []
    try:
        for name in ("layered", "layered-again"):
            created = http.post("/v1/templates", json={"name": name, **body})
            assert created.status_code == 200, created.text
            ids.append(created.json()["data"]["id"])
            assert wait_done(http, ids[-1])["status"] == "ready"
            lines = [f.get("line", "") for f in frames_of(http.get(f"/v1/templates/{ids[-1]}/logs").text)]
            assert any(line.startswith("linked the files of debian:13") for line in lines), lines[-20:]
        assert any("Using cache" in line for line in lines)  # the second build: every step cached
        for name in ("layered", "layered-again"):
            assert _boot_and_check(http, name, LAYERED_CHECK) == LAYERED_SEEN
        assert _boot_and_check(http, "debian:13", "stat -c '%a %U' /usr/bin/env; ls /etc/apt | wc -l") == [
            "755 root",
            str(len(os.listdir(debian_image / "etc" / "apt"))),
        ]
    finally:
        for template_id in ids:
            http.delete(f"/v1/templates/{template_id}")


def _ext4_used_bytes(image: Path) -> int:
    """The blocks an (unmounted) ext4 image has in use, as its superblock counts them."""
    fields = dict(
        line.split(":", 1)
        for line in subprocess.run(
            ["dumpe2fs", "-h", str(image)], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        if ":" in line
    )
    return (int(fields["Block count"]) - int(fields["Free blocks"])) * int(fields["Block size"])


def _fresh_ext4_used_bytes(size: int, scratch: Path) -> int:
    """The same for a new filesystem of ``size`` bytes, made as the builder makes a store's."""
    image = scratch / "fresh.ext4"
    with open(image, "wb") as handle:
        handle.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(image)], check=True)
    return _ext4_used_bytes(image)


def _catalog_store_state(storage: Path) -> tuple[bytes, bytes, list[str]]:
    """What the host's catalog store holds: its image and layer records, and its layers' directories."""
    return (
        (storage / "overlay-images" / "images.json").read_bytes(),
        (storage / "overlay-layers" / "layers.json").read_bytes(),
        sorted(entry.name for entry in (storage / "overlay").iterdir()),
    )


def test_a_new_accounts_first_build_reads_the_hosts_catalog_import_and_writes_nothing_there(
    live: LivePlatform, built: dict[str, Any], tmp_path: Path
) -> None:
    """Catalog bases are imported once per host into a store every account's builds read and none
    writes (``drivers/build/basestore.py``): a new account's first build ``FROM debian:13`` imports
    nothing, its own store holds only its layer, the host's store is byte for byte as it was, and the
    template boots with the base's files and the build's."""
    from tests.hostagent.conftest import image_cache

    assert built["template"]["status"] == "ready"  # the module's account built FROM debian:13 first
    catalog = image_cache() / ".builder-base" / "storage"
    before = _catalog_store_state(catalog)
    stores = live.agents[0].state_dir / "buildah" / "stores"
    stores_before = set(stores.glob("*.ext4"))
    with live.http(live.api_key("pro"), timeout=600) as other:
        dockerfile = "FROM debian:13\nRUN echo mine > /mine.txt\n"
        created = other.post("/v1/templates", json={"name": "second-account", "dockerfile": dockerfile})
        assert created.status_code == 200, created.text
        template = created.json()["data"]
        try:
            assert wait_done(other, template["id"])["status"] == "ready"
            lines = [
                frame.get("line", "")
                for frame in frames_of(other.get(f"/v1/templates/{template['id']}/logs").text)
            ]
            assert not any("importing base image" in line for line in lines), lines
            assert any("localhost/paddock-base/debian_13:" in line for line in lines), lines
            (store,) = set(stores.glob("*.ext4")) - stores_before  # the new account's own store
            # debian:13's tree alone is ~140 MB; the store holds the build's layer and buildah's records
            grown = _ext4_used_bytes(store) - _fresh_ext4_used_bytes(store.stat().st_size, tmp_path)
            assert grown < 32 << 20, grown
            assert _catalog_store_state(catalog) == before
            out = _boot_and_check(other, template["name"], "cat /mine.txt /etc/debian_version")
            assert out[0] == "mine" and out[1].startswith("13"), out
        finally:
            other.delete(f"/v1/templates/{template['id']}")
