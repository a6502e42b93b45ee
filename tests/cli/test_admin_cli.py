"""``paddock admin``: the keys it prints work against a real control plane; revoked keys stop working."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.controlplane.conftest import ControlPlane

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
