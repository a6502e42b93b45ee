"""The control plane hands egress rules and bandwidth budgets to the host and reads the host's counters.

The host is the unit seam (``FakeHostLink``); tests/network shows the same paths enforced in the kernel.
"""

from __future__ import annotations

import httpx
import pytest

from paddock_controlplane.hosts import hostlink
from tests.controlplane.fakehost import FakeHostLink
from tests.controlplane.sandboxes.test_sandboxes_rules import api, fake_host

__all__ = ["api", "fake_host"]

pytestmark = pytest.mark.db


async def test_put_egress_reaches_the_host_normalised(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    put = await api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["API.Example.com:443", "10.0.0.1/8"]})
    assert put.status_code == 200, put.text
    assert fake_host.egress[sid] == ["api.example.com:443", "10.0.0.0/8"]
    await api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": None})
    assert fake_host.egress[sid] == []


async def test_a_host_that_fails_to_apply_egress_gets_503_and_the_list_is_kept(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    fake_host.fail_egress = True
    put = await api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["a.example.com"]})
    assert put.status_code == 503, put.text
    assert "repeat the PUT" in put.json()["message"]
    assert (await api.get(f"/v1/sandboxes/{sid}/egress")).json()["data"]["egress"] == ["a.example.com"]


async def test_recharge_pushes_the_new_budget_and_bandwidth_is_the_hosts_count(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    sid = (await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})).json()["data"]["id"]
    quota = 5 * 1024**3
    fake_host.usage[sid] = hostlink.Usage(egress_bytes=quota - 700, ingress_bytes=42, capped=True)
    view = (await api.get(f"/v1/sandboxes/{sid}/bandwidth")).json()["data"]
    assert view == {
        "id": sid,
        "quota_bytes": quota,
        "used_bytes": quota - 700,
        "ingress_bytes": 42,
        "remaining_bytes": 0,
        "capped": True,
    }
    fake_host.usage[sid] = hostlink.Usage(egress_bytes=quota - 700, ingress_bytes=42, capped=False)
    view = (await api.post(f"/v1/sandboxes/{sid}/bandwidth/recharge", json={"add_bytes": 1000})).json()[
        "data"
    ]
    assert fake_host.quotas[sid] == quota + 1000
    assert view["capped"] is False and view["remaining_bytes"] == 1700
    shown = (await api.get(f"/v1/sandboxes/{sid}")).json()["data"]
    assert shown["bandwidth_ingress_bytes"] == 42
