"""E2B's volumes on Paddock's local volumes, through the unmodified ``e2b`` SDK (``Volume``,
``Sandbox.create(volume_mounts=…)``) configured only by the three variables: a volume made, mounted into
a sandbox that writes a file and is killed, mounted into a second sandbox that reads the file back, then
deleted; the SDK's own answers for a missing volume; and the refusals in E2B's ``{code, message}``
naming E2B's fields. ``@e2b``'s JS SDK does the same under Node (``js/volumes.mjs``). A volume's files
through the volume content API (``Volume``'s instance methods, ``E2B_VOLUME_API_URL`` pointed at the
same listener), beside a sandbox that mounts it, and never through a symlink the tenant made."""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from e2b import (
    Sandbox,
    SandboxException,
    Volume,
    VolumeException,
    VolumeFileType,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)
from tests.e2b.conftest import E2bPlatform

pytestmark = pytest.mark.root

JS = Path(__file__).with_name("js")


@pytest.fixture(autouse=True)
def container_tier(e2b_platform: E2bPlatform) -> None:
    """Volumes live on the container tier (docs/volumes.md): an agent on gVisor refuses them."""
    runtime = e2b_platform.platform.agents[0].runtime
    if runtime not in ("auto", "crun", "runc"):
        pytest.skip(f"volumes need the container tier; the agent runs {runtime}")


def test_a_volume_outlives_its_sandbox_and_mounts_in_the_next(e2b_env: E2bPlatform) -> None:
    name = f"e2b-vol-{secrets.token_hex(3)}"
    volume = Volume.create(name)
    try:
        assert volume.name == name and volume.volume_id.startswith("vol_")
        assert Volume.get_info(volume.volume_id).name == name
        assert any(v.volume_id == volume.volume_id for v in Volume.list())

        first = Sandbox.create(volume_mounts={"/data": volume}, timeout=300)
        try:
            assert first.get_info().volume_mounts == [{"name": name, "path": "/data"}]
            first.files.write("/data/note.txt", "written by the first sandbox\n")
            assert first.commands.run("findmnt -n -o FSTYPE /data").stdout.strip() == "xfs"
            # one writer at a time (Paddock's rule; E2B shares a volume): a second mount while the first
            # sandbox runs is refused in E2B's shape, naming the holder
            with pytest.raises(SandboxException) as held:
                Sandbox.create(volume_mounts={"/data": name}, timeout=60)
            assert first.sandbox_id in str(held.value), held.value
        finally:
            first.kill()

        second = Sandbox.create(
            volume_mounts={"/mnt/shared": name}, timeout=300
        )  # by name, as the SDK allows
        try:
            assert second.files.read("/mnt/shared/note.txt") == "written by the first sandbox\n"
        finally:
            second.kill()

        assert Volume.destroy(volume.volume_id) is True
        assert Volume.destroy(volume.volume_id) is False  # the SDK's answer for a 404
        with pytest.raises(VolumeNotFoundException):
            Volume.get_info(volume.volume_id)
    finally:
        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as api:
            api.delete(f"/volumes/{volume.volume_id}")


def test_volume_refusals_are_e2b_shaped(e2b_env: E2bPlatform) -> None:
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}, timeout=60) as api:
        bad = api.post("/volumes", json={"name": "not a name!"})
        assert bad.status_code == 400 and bad.json()["code"] == 400, bad.text
        assert bad.json()["message"].startswith("name:"), bad.text

        missing = api.get("/volumes/vol_nothing")
        assert missing.status_code == 404 and missing.json() == {"code": 404, "message": "volume not found"}
        assert api.delete("/volumes/vol_nothing").status_code == 404

        unknown = api.post(
            "/v2/sandboxes", json={"templateID": "base", "volumeMounts": [{"name": "nope", "path": "/d"}]}
        )
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["message"].startswith("volumeMounts[0].name:"), unknown.text
        typed = api.post("/v2/sandboxes", json={"templateID": "base", "volumeMounts": [{"name": "x"}]})
        assert typed.status_code == 400 and "volumeMounts" in typed.json()["message"], typed.text

        # the content API takes the volume's token, not the API key: without it, or with another's, 401
        # (before 404, so that an id alone tells nothing)
        content = api.get("/volumecontent/vol_nothing/dir", params={"path": "/"})
        assert content.status_code == 401 and content.json()["code"] == 401, content.text
        forged = api.get(
            "/volumecontent/vol_nothing/dir", params={"path": "/"}, headers={"Authorization": "Bearer vt_0"}
        )
        assert forged.status_code == 401, forged.text


def test_the_js_sdk_volume_round_trip(e2b_platform: E2bPlatform) -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed (scripts/setup-host.sh installs it)"
    assert (JS / "node_modules" / "e2b").is_dir(), "run make setup-test (npm ci in tests/e2b/js)"
    env = {key: value for key, value in os.environ.items() if not key.startswith("E2B_")} | e2b_platform.env
    env["PADDOCK_E2B_VOLUME"] = f"e2b-js-{secrets.token_hex(3)}"
    env["E2B_VOLUME_API_URL"] = e2b_platform.api_url
    done = subprocess.run(
        [node, "volumes.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "listed": True,
        "mounts": [{"name": env["PADDOCK_E2B_VOLUME"], "path": "/data"}],
        "sameToken": True,
        "apiReadsSandbox": "from js\n",
        "apiList": [
            "/dir/api.txt:file",
            "/dir:directory",
            "/js.txt:file",
            "/made/deep:directory",
            "/made:directory",
        ],
        "apiInfo": {"name": "api.txt", "type": "file", "size": 20, "mode": 0o640},
        "apiRemoved": True,
        "read": "from js\n",
        "readApi": "via the content api\n",
        "destroyed": True,
        "destroyedAgain": False,
    }


def test_a_volumes_files_through_the_content_api_beside_a_sandbox_that_mounts_it(
    e2b_env: E2bPlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2B_VOLUME_API_URL", e2b_env.api_url)  # E2B's fourth variable (docs/e2b.md)
    volume = Volume.create(f"e2b-content-{secrets.token_hex(3)}")
    try:
        assert volume.token and volume.token.startswith("vt_")
        assert Volume.connect(volume.volume_id).token == volume.token  # the same from any connect

        written = volume.write_file("/notes/hello.txt", "hi from the content api\n")  # its parent made
        assert written.type == VolumeFileType.FILE and written.path == "/notes/hello.txt"
        assert written.size == len("hi from the content api\n")
        assert volume.read_file("/notes/hello.txt") == "hi from the content api\n"
        assert volume.read_file("/notes/hello.txt", format="bytes") == b"hi from the content api\n"
        blob = bytes(range(256)) * (12 << 10)  # 3 MiB, streamed from a file object in chunks
        assert volume.write_file("/blob.bin", io.BytesIO(blob)).size == len(blob)
        assert volume.read_file("/blob.bin", format="bytes") == blob
        volume.remove("/blob.bin")

        made = volume.make_dir("/a/b/c", force=True)
        assert made.type == VolumeFileType.DIRECTORY and made.path == "/a/b/c"
        with pytest.raises(VolumePathNotFoundException):
            volume.make_dir("/x/y")  # a missing parent without force
        top = {entry.path: entry.type for entry in volume.list("/")}
        assert top == {"/notes": VolumeFileType.DIRECTORY, "/a": VolumeFileType.DIRECTORY}, top
        two = {entry.path for entry in volume.list("/", depth=2)}
        assert two == {"/notes", "/notes/hello.txt", "/a", "/a/b"}, two

        updated = volume.update_metadata("/notes/hello.txt", uid=1000, gid=1000, mode=0o600)
        assert (updated.uid, updated.gid, updated.mode) == (1000, 1000, 0o600)
        assert volume.get_info("/notes/hello.txt").mode == 0o600
        assert volume.exists("/notes/hello.txt") and not volume.exists("/notes/nope.txt")
        with pytest.raises(VolumePathNotFoundException):
            volume.read_file("/notes/nope.txt")

        sandbox = Sandbox.create(volume_mounts={"/data": volume}, timeout=300)
        try:
            # The same files, both ways, while the sandbox runs.
            assert sandbox.files.read("/data/notes/hello.txt") == "hi from the content api\n"
            stat = sandbox.commands.run("stat -c '%u:%g %a' /data/notes/hello.txt").stdout.strip()
            assert stat == "1000:1000 600", stat
            sandbox.commands.run("echo from the sandbox > /data/s.txt && ln -s /etc /data/etc-link")
            assert volume.read_file("/s.txt") == "from the sandbox\n"
            volume.write_file("/from-api.txt", "while it runs\n")
            assert sandbox.files.read("/data/from-api.txt") == "while it runs\n"

            # The tenant's symlink is shown, never followed by the host (whose /etc it names).
            link = volume.get_info("/etc-link")
            assert link.type == VolumeFileType.SYMLINK and link.target == "/etc", link
            with pytest.raises(VolumeException, match="symlink"):
                volume.read_file("/etc-link/passwd")
            with pytest.raises(VolumeException, match="symlink"):
                volume.write_file("/etc-link/paddock-probe", "x")
            assert not Path("/etc/paddock-probe").exists()
            volume.remove("/etc-link")  # the link goes, not what it names
            assert Path("/etc/passwd").is_file() and not volume.exists("/etc-link")
        finally:
            sandbox.kill()

        volume.remove("/a")  # a directory with all it holds
        assert not volume.exists("/a/b/c") and not volume.exists("/a")
        with pytest.raises(VolumePathNotFoundException):
            volume.remove("/a")
        # The volume mounts again in a new sandbox with what the API wrote (it was let go each time).
        again = Sandbox.create(volume_mounts={"/data": volume}, timeout=300)
        try:
            listed = again.commands.run("cd /data && ls -A | sort | tr '\\n' ' '").stdout.strip()
            assert listed == "from-api.txt notes s.txt", listed
        finally:
            again.kill()
    finally:
        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as api:
            api.delete(f"/volumes/{volume.volume_id}")


def test_the_content_api_refuses_in_e2b_shape(e2b_env: E2bPlatform) -> None:
    volume = Volume.create(f"e2b-refuse-{secrets.token_hex(3)}")
    headers = {"Authorization": f"Bearer {volume.token}"}
    try:
        with httpx.Client(base_url=e2b_env.api_url, headers=headers, timeout=60) as api:
            base = f"/volumecontent/{volume.volume_id}"
            for call, field in (
                (lambda: api.get(f"{base}/dir", params={"path": "/", "depth": 0}), "depth"),
                (lambda: api.get(f"{base}/dir", params={"path": "/", "depth": "x"}), "depth"),
                (lambda: api.get(f"{base}/dir"), "path"),
                (lambda: api.post(f"{base}/dir", params={"path": "/d", "mode": 0o10000}), "mode"),
                (lambda: api.patch(f"{base}/path", params={"path": "/"}, json={"uid": -1}), "uid"),
                (lambda: api.get(f"{base}/path", params={"path": "/a/../../etc"}), "path"),
            ):
                answer = call()
                assert answer.status_code == 400 and answer.json()["code"] == 400, answer.text
                assert answer.json()["message"].startswith(field), (field, answer.text)
            # A token opens its own volume only.
            other = Volume.create(f"e2b-other-{secrets.token_hex(3)}")
            try:
                crossed = api.get(f"/volumecontent/{other.volume_id}/dir", params={"path": "/"})
                assert crossed.status_code == 401, crossed.text
            finally:
                Volume.destroy(other.volume_id)
            # The root is a directory: neither a file nor removable.
            assert api.put(f"{base}/file", params={"path": "/"}, content=b"x").status_code == 400
            assert api.delete(f"{base}/path", params={"path": "/"}).status_code == 400
        Volume.destroy(volume.volume_id)
        with httpx.Client(base_url=e2b_env.api_url, headers=headers, timeout=60) as api:
            gone = api.get(f"/volumecontent/{volume.volume_id}/dir", params={"path": "/"})
            assert gone.status_code == 404 and gone.json()["code"] == 404, gone.text
    finally:
        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as api:
            api.delete(f"/volumes/{volume.volume_id}")
