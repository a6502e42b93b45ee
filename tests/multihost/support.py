"""What the multi-host tests do as users and operators: create sandboxes, find the machine one runs
on, wait for a status."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.hostagent.conftest import TOKEN
from tests.multihost.harness import Cluster, HostMachine

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048


def create(http: httpx.Client, **fields: Any) -> httpx.Response:
    return http.post("/v1/sandboxes", json={"shape": SHAPE, "disk_mib": DISK_MIB, **fields})


def create_ok(http: httpx.Client, **fields: Any) -> dict[str, Any]:
    answer = create(http, **fields)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"])


def create_many(cluster: Cluster, key: str, count: int, workers: int = 6, **fields: Any) -> list[str]:
    def one(index: int) -> str:
        with cluster.http(key, cp=index % 2) as http:
            return str(create_ok(http, **fields)["id"])

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, range(count)))


def destroy_many(cluster: Cluster, key: str, sandbox_ids: list[str], workers: int = 6) -> None:
    def one(sandbox_id: str) -> None:
        with cluster.http(key) as http:
            answer = http.delete(f"/v1/sandboxes/{sandbox_id}")
            assert answer.status_code in (200, 204, 404), answer.text

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, sandbox_ids))


def machines(cluster: Cluster) -> list[HostMachine]:
    return [agent for agent in cluster.agents if isinstance(agent, HostMachine)]


def running_on(machine: HostMachine) -> set[str]:
    """The sandboxes the machine itself says it runs (what an operator would list on it); none while
    its agent is down."""
    if machine.process is None or machine.process.poll() is not None:
        return set()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    listed = httpx.get(machine.url + "/internal/v1/sandboxes", headers=headers, timeout=30).json()
    return {str(sandbox["id"]) for sandbox in listed}


def placement(cluster: Cluster, sandbox_ids: list[str]) -> Counter[str]:
    """How many of these sandboxes each machine runs, by host id."""
    wanted = set(sandbox_ids)
    return Counter({m.host_id: len(running_on(m) & wanted) for m in machines(cluster)})


def host_of(cluster: Cluster, sandbox_id: str) -> str:
    found = [m.host_id for m in machines(cluster) if sandbox_id in running_on(m)]
    assert len(found) == 1, f"{sandbox_id} runs on {found}"
    return found[0]


def wait_status(http: httpx.Client, sandbox_id: str, status: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]
        if view["status"] == status:
            return view
        time.sleep(0.2)
    raise AssertionError(f"{sandbox_id} is {view.get('status')!r}, not {status!r}, after {timeout_s} s")


def exec_ok(http: httpx.Client, sandbox_id: str, script: str) -> str:
    answer = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]})
    assert answer.status_code == 200, answer.text
    result = answer.json()["data"]["result"]
    assert result["exit_code"] == 0, result
    return str(result["stdout"])
