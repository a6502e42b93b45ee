"""A private network across machines: members on hosts 1 and 2 ping and TCP each other through the
network's VXLAN ports; a sandbox on host 3 outside the network reaches neither."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.multihost.harness import Cluster
from tests.multihost.support import create_ok, destroy_many, host_of, machines
from tests.network.ingress_support import APP_PORT, start_app


def run(http: httpx.Client, sandbox_id: str, script: str) -> dict[str, Any]:
    answer = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]})
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"]["result"])


def network_ip(http: httpx.Client, sandbox_id: str, network_id: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        view = http.get(f"/v1/sandboxes/{sandbox_id}").json()["data"]
        refs = [n for n in view.get("networks", []) if n["id"] == network_id and n.get("ip")]
        if refs:
            return str(refs[0]["ip"])
        time.sleep(0.2)
    raise AssertionError(f"{sandbox_id} never got an address on {network_id}")


def test_members_on_two_hosts_talk_and_a_non_member_on_a_third_cannot(cluster: Cluster) -> None:
    key = cluster.api_key()
    first, second, third = (m.host_id for m in machines(cluster))
    made: list[str] = []
    with cluster.http(key, cp=0) as http:
        network = http.post("/v1/networks", json={"name": "across"}).json()["data"]
        try:
            a = create_ok(http, host_id=first, networks=[{"id": network["id"]}])["id"]
            b = create_ok(http, host_id=second, networks=[{"id": network["id"]}])["id"]
            outsider = create_ok(http, host_id=third)["id"]
            made += [a, b, outsider]
            assert [host_of(cluster, s) for s in (a, b, outsider)] == [first, second, third]
            a_ip, b_ip = network_ip(http, a, network["id"]), network_ip(http, b, network["id"])
            start_app(http, b)

            # The hosts learn their peers with the next heartbeats; then the members meet.
            deadline = time.monotonic() + 20
            while run(http, a, f"ping -c1 -W1 {b_ip}")["exit_code"] != 0:
                assert time.monotonic() < deadline, "a never reached b across hosts"
            assert run(http, b, f"ping -c2 -W2 {a_ip}")["exit_code"] == 0
            fetched = run(http, a, f"curl -sS --max-time 5 http://{b_ip}:{APP_PORT}/hello")
            assert fetched["exit_code"] == 0 and fetched["stdout"].startswith("hello from"), fetched
            big = run(http, a, f"curl -sS --max-time 20 http://{b_ip}:{APP_PORT}/zeros?mib=4 | wc -c")
            assert big["stdout"].strip() == str(4 << 20), big  # full-size frames fit the overlay's MTU

            for target in (a_ip, b_ip):
                assert run(http, outsider, f"ping -c1 -W1 {target}")["exit_code"] != 0
            refused = run(http, outsider, f"curl -sS --max-time 3 http://{b_ip}:{APP_PORT}/hello")
            assert refused["exit_code"] != 0 and "hello" not in refused["stdout"], refused
        finally:
            destroy_many(cluster, key, made)
            http.delete(f"/v1/networks/{network['id']}")
