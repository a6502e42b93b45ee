"""Placement across machines: by free memory, ``host_id`` pins, ``node_selector``, draining, and a
machine that dies and comes back."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from tests.hostagent.conftest import TOKEN
from tests.multihost.harness import Cluster
from tests.multihost.support import (
    create,
    create_many,
    create_ok,
    destroy_many,
    exec_ok,
    host_of,
    machines,
    placement,
    wait_status,
)


def test_thirty_sandboxes_spread_over_three_hosts_by_free_memory(cluster: Cluster) -> None:
    key = cluster.api_key(plan="enterprise", credits=5000)
    first, second, third = (m.host_id for m in machines(cluster))
    created = create_many(cluster, key, 30)
    try:
        # 6144/3072/3072 MiB offered, 30 × 256 MiB placed on the most free host each time: host 1
        # takes 12 until it is level with the others, then all three share the other 18.
        spread = placement(cluster, created)
        assert sum(spread.values()) == 30, spread
        assert abs(spread[first] - 18) <= 1 and abs(spread[second] - 6) <= 1 and abs(spread[third] - 6) <= 1
        with cluster.http(key, cp=1) as http:
            free = {h["id"]: h["free_mib"] for h in http.get("/v1/hosts").json()["data"]["data"]}
        assert max(free[h] for h in spread) - min(free[h] for h in spread) <= 512, free
    finally:
        destroy_many(cluster, key, created)


def test_host_id_pins_and_node_selector_filters(cluster: Cluster) -> None:
    key = cluster.api_key()
    first, second, third = (m.host_id for m in machines(cluster))
    made: list[str] = []
    try:
        with cluster.http(key) as http:
            for host_id in (third, second, third):
                made.append(create_ok(http, host_id=host_id)["id"])
                assert host_of(cluster, made[-1]) == host_id
            made.append(create_ok(http, node_selector={"disk": "ssd"})["id"])
            assert host_of(cluster, made[-1]) == third
            for _ in range(2):
                made.append(create_ok(http, node_selector={"zone": "b"})["id"])
                assert host_of(cluster, made[-1]) in (second, third)
            made.append(create_ok(http, node_selector={"zone": "a"})["id"])
            assert host_of(cluster, made[-1]) == first

            nowhere = create(http, node_selector={"zone": "c"})
            assert nowhere.status_code == 503 and "node_selector" in nowhere.text, nowhere.text
            unknown = create(http, host_id="no-such-host")
            assert unknown.status_code == 400, unknown.text
            both = create(http, host_id=first, node_selector={"zone": "b"})
            assert both.status_code == 503, both.text
    finally:
        destroy_many(cluster, key, made)


def admin_cli(cluster: Cluster, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        PADDOCK_CP_DATABASE_URL=cluster.controlplane.database_url,
        PADDOCK_CP_SECRET_KEY="live-test-secret-key-0123456789",
        PADDOCK_CP_DATA_DIR=str(cluster.controlplane.state_dir),
    )
    done = subprocess.run(
        [sys.executable, "-m", "paddock_cli.main", "admin", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_drained_host_gets_no_new_sandboxes_and_keeps_its_own(cluster: Cluster) -> None:
    key = cluster.api_key()
    first = machines(cluster)[0].host_id
    made: list[str] = []
    try:
        with cluster.http(key, cp=1) as http:
            resident = create_ok(http, host_id=first)["id"]
            made.append(resident)
            assert f"host {first} is now draining" in admin_cli(cluster, "host", "drain", first)
            time.sleep(1)  # heartbeats keep coming; the host stays draining
            assert cluster.host_statuses(key, cp=0)[first] == "draining"
            for _ in range(4):  # host 1 has the most free memory, yet gets none
                made.append(create_ok(http)["id"])
                assert host_of(cluster, made[-1]) != first
            pinned = create(http, host_id=first)
            assert pinned.status_code == 503 and "not active" in pinned.text, pinned.text
            assert exec_ok(http, resident, "echo still here") == "still here\n"

            undrain = httpx.delete(
                f"{cluster.cp_url(1)}/internal/v1/hosts/{first}/drain",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert undrain.status_code == 200 and undrain.json()["status"] == "active", undrain.text
            made.append(create_ok(http)["id"])
            assert host_of(cluster, made[-1]) == first
    finally:
        destroy_many(cluster, key, made)


def test_a_killed_host_errors_its_sandboxes_and_they_return_with_it(cluster: Cluster) -> None:
    key = cluster.api_key()
    victim = machines(cluster)[1]
    made: list[str] = []
    try:
        with cluster.http(key, cp=0) as a, cluster.http(key, cp=1) as b:
            on_victim = [create_ok(a, host_id=victim.host_id)["id"] for _ in range(2)]
            made += on_victim
            victim.kill()
            for sandbox_id in on_victim:
                view = wait_status(b, sandbox_id, "error", timeout_s=30)
                assert "host" in (view.get("status_reason") or ""), view
            assert cluster.host_statuses(key, cp=1)[victim.host_id] == "dead"
            for _ in range(3):
                made.append(create_ok(b)["id"])
                assert host_of(cluster, made[-1]) != victim.host_id
            victim.start()
            for sandbox_id in on_victim:
                wait_status(a, sandbox_id, "running", timeout_s=60)
                assert exec_ok(b, sandbox_id, "echo back") == "back\n"
            assert cluster.host_statuses(key, cp=0)[victim.host_id] == "active"
    finally:
        destroy_many(cluster, key, made)
