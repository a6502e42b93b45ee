"""``paddock admin``: the keys it prints work against a real control plane; revoked keys stop working."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.controlplane.conftest import HOST_TOKEN, ControlPlane
from tests.controlplane.fakehost import HOST_BEAT

pytestmark = pytest.mark.db


def admin(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PADDOCK_CP_DATABASE_URL": cp.settings.database_url}
    return subprocess.run(
        [sys.executable, "-m", "paddock_cli.main", "admin", *args], env=env, capture_output=True, text=True
    )


async def test_user_create_key_list_revoke_set_plan(controlplane: ControlPlane) -> None:
    made = await asyncio.to_thread(admin, controlplane, "user", "create", "--plan", "beginner", "--json")
    assert made.returncode == 0, made.stderr
    user = json.loads(made.stdout)
    assert user["plan"] == "beginner" and user["api_key"].startswith("pdk_")
    who = await controlplane.http.get("/v1/whoami", headers={"X-Api-Key": user["api_key"]})
    assert who.status_code == 200 and who.json()["data"]["user_id"] == user["user_id"]

    listed = json.loads((await asyncio.to_thread(admin, controlplane, "key", "list", "--json")).stdout)
    assert [k["id"] for k in listed] == [user["key_id"]]
    assert user["api_key"] not in json.dumps(listed)  # the key itself is never shown again

    revoked = await asyncio.to_thread(admin, controlplane, "key", "revoke", user["key_id"])
    assert revoked.returncode == 0
    await asyncio.sleep(controlplane.settings.hot_cache_ttl_s + 0.1)
    denied = await controlplane.http.get("/v1/whoami", headers={"X-Api-Key": user["api_key"]})
    assert denied.status_code == 401 and denied.json()["data"]["code"] == "UNAUTHORIZED"

    moved = await asyncio.to_thread(admin, controlplane, "user", "set-plan", user["user_id"], "enterprise")
    assert moved.returncode == 0 and "enterprise" in moved.stdout
    wrong = await asyncio.to_thread(admin, controlplane, "user", "set-plan", user["user_id"], "platinum")
    assert wrong.returncode == 2 and "unknown plan" in wrong.stderr


async def test_host_list_drain_undrain(controlplane: ControlPlane) -> None:
    """An operator drains a host from the CLI: it lists as draining (heartbeats do not undo it) and
    ``/v1/hosts`` shows it; undrain puts it back; an unknown host is exit 2."""
    headers = {"Authorization": f"Bearer {HOST_TOKEN}"}
    beat = await controlplane.http.post("/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers=headers)
    assert beat.status_code == 200
    host_id = HOST_BEAT["id"]

    async def keep_beating() -> None:  # the host stays alive however slowly the CLI starts
        while True:
            await asyncio.sleep(0.5)
            await controlplane.http.post("/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers=headers)

    beating = asyncio.create_task(keep_beating())
    drained = await asyncio.to_thread(admin, controlplane, "host", "drain", host_id)
    assert drained.returncode == 0 and f"host {host_id} is now draining" in drained.stdout, drained.stderr
    await controlplane.http.post("/internal/v1/hosts/heartbeat", json=HOST_BEAT, headers=headers)
    listed = json.loads((await asyncio.to_thread(admin, controlplane, "host", "list", "--json")).stdout)
    assert [(h["id"], h["status"], h["url"]) for h in listed] == [(host_id, "draining", HOST_BEAT["url"])]
    back = await asyncio.to_thread(admin, controlplane, "host", "undrain", host_id)
    beating.cancel()
    assert back.returncode == 0 and "is now active" in back.stdout, back.stdout
    beating = asyncio.create_task(keep_beating())
    for command, status in (("drain", "draining"), ("undrain", "active")):  # the same, as JSON
        done = await asyncio.to_thread(admin, controlplane, "host", command, host_id, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"id": host_id, "status": status}
    beating.cancel()
    unknown = await asyncio.to_thread(admin, controlplane, "host", "drain", "no-such-host")
    assert unknown.returncode == 2 and "no host" in unknown.stderr


def test_admin_reads_the_data_dir_serve_uses(tmp_path: object) -> None:
    """``PADDOCK_DATA_DIR=X paddock admin user create`` writes where ``paddock serve`` (which hands X to
    its control plane) reads: X/controlplane.db. It had written the default /var/lib/paddock's database,
    so the operator's new key was refused."""
    from pathlib import Path

    data = Path(str(tmp_path)) / "data"
    data.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env["PADDOCK_DATA_DIR"] = str(data)
    made = subprocess.run(
        [sys.executable, "-m", "paddock_cli.main", "admin", "user", "create", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    user = json.loads(made.stdout)
    listed = subprocess.run(
        [sys.executable, "-m", "paddock_cli.main", "admin", "key", "list", "--json"],
        env={**env, "PADDOCK_CP_DATABASE_URL": f"sqlite+aiosqlite:///{data / 'controlplane.db'}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert [k["id"] for k in json.loads(listed.stdout)] == [user["key_id"]]
