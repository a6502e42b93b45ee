"""E2B's volumes on Paddock's local volumes, through the unmodified ``e2b`` SDK (``Volume``,
``Sandbox.create(volume_mounts=…)``) configured only by the three variables: a volume made, mounted into
a sandbox that writes a file and is killed, mounted into a second sandbox that reads the file back, then
deleted; the SDK's own answers for a missing volume; and the refusals in E2B's ``{code, message}``
naming E2B's fields. ``@e2b``'s JS SDK does the same under Node (``js/volumes.mjs``)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from e2b import Sandbox, SandboxException, Volume, VolumeNotFoundException
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

        # the content API (files inside a volume, with the volume's token) is not served
        content = api.get("/volumecontent/vol_nothing/dir", params={"path": "/"})
        assert content.status_code == 501 and content.json()["code"] == 501, content.text


def test_the_js_sdk_volume_round_trip(e2b_platform: E2bPlatform) -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed (scripts/setup-host.sh installs it)"
    assert (JS / "node_modules" / "e2b").is_dir(), "run make setup-test (npm ci in tests/e2b/js)"
    env = {key: value for key, value in os.environ.items() if not key.startswith("E2B_")} | e2b_platform.env
    env["PADDOCK_E2B_VOLUME"] = f"e2b-js-{secrets.token_hex(3)}"
    done = subprocess.run(
        [node, "volumes.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "listed": True,
        "mounts": [{"name": env["PADDOCK_E2B_VOLUME"], "path": "/data"}],
        "read": "from js\n",
        "destroyed": True,
        "destroyedAgain": False,
    }
