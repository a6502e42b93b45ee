"""Ingress across machines: the proxy in either control plane reaches a sandbox on another host
through the routed per-host subnets (the control planes' machine routes host 3's sandbox subnet via
host 3's address; host 3 forwards from its uplink to the sandbox's veth)."""

from __future__ import annotations

import httpx

from tests.multihost.harness import DOMAIN, Cluster
from tests.multihost.support import create_ok, destroy_many, host_of, machines
from tests.network.ingress_support import APP_PORT, start_app


def through_proxy(proxy_port: int, sandbox_id: str, path: str) -> httpx.Response:
    host = f"{APP_PORT}-{sandbox_id}.{DOMAIN}:{proxy_port}"
    return httpx.get(f"http://127.0.0.1:{proxy_port}{path}", headers={"Host": host}, timeout=30)


def test_ingress_through_either_control_plane_reaches_a_sandbox_on_host_3(cluster: Cluster) -> None:
    key = cluster.api_key()
    third = machines(cluster)[2].host_id
    with cluster.http(key, cp=1) as http:
        sandbox_id = create_ok(http, host_id=third, ingress_enabled=True)["id"]
        try:
            assert host_of(cluster, sandbox_id) == third
            start_app(http, sandbox_id)
            for controlplane in cluster.controlplanes:
                answer = through_proxy(controlplane.ingress_port, sandbox_id, "/hello")
                assert answer.status_code == 200, answer.text
                assert answer.text.startswith("hello from"), answer.text
                echoed = httpx.post(
                    f"http://127.0.0.1:{controlplane.ingress_port}/echo",
                    headers={"Host": f"{APP_PORT}-{sandbox_id}.{DOMAIN}:{controlplane.ingress_port}"},
                    content=b"x" * 300_000,
                    timeout=30,
                )
                assert echoed.status_code == 200 and echoed.text.startswith("bytes=300000"), echoed.text
        finally:
            destroy_many(cluster, key, [sandbox_id])
