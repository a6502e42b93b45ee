"""``ingress_host_header`` and ``ingress_https_ports`` as the control plane keeps them (docs/ingress.md):
a PATCH that changes them sends a ``sandbox.patch`` webhook naming what changed (``null``: cleared), one
that changes nothing sends none, and a refused one sends none and changes nothing. The host is the fake
seam; tests/network/test_ingress.py shows what the app behind the ingress gets on a real sandbox."""

from __future__ import annotations

import pytest

from tests.controlplane.conftest import Clocked, user_client

pytestmark = pytest.mark.db


async def test_a_patch_of_the_ports_settings_is_a_webhook_naming_what_changed(clocked: Clocked) -> None:
    user_id, http = await user_client(clocked)
    await clocked.subscribe(user_id, "sandbox.patch")
    async with http:
        created = await http.post(
            "/v1/sandboxes",
            json={
                "shape": "s-1vcpu-1gb",
                "ingress_host_header": "app.test",
                "ingress_https_ports": [9443, 8443, 9443],
            },
        )
        assert created.status_code == 200, created.text
        sid = created.json()["data"]["id"]
        # Sorted and each once, as the ingress goes by them.
        assert created.json()["data"]["ingress_https_ports"] == [8443, 9443]

        same = await http.patch(f"/v1/sandboxes/{sid}", json={"ingress_host_header": "app.test"})
        assert same.status_code == 200, same.text
        refused = await http.patch(
            f"/v1/sandboxes/{sid}", json={"ingress_host_header": "other.test", "ingress_https_ports": [70000]}
        )
        assert refused.status_code == 400 and "ingress_https_ports[0]" in refused.json()["data"], refused.text
        assert await clocked.events_of("sandbox.patch") == []

        moved = await http.patch(
            f"/v1/sandboxes/{sid}",
            json={"ingress_host_header": "${PORT}.app.test", "ingress_https_ports": [8443]},
        )
        assert moved.status_code == 200, moved.text
        cleared = await http.patch(f"/v1/sandboxes/{sid}", json={"ingress_host_header": ""})
        assert cleared.status_code == 200 and "ingress_host_header" not in cleared.json()["data"], (
            cleared.text
        )
        assert cleared.json()["data"]["ingress_https_ports"] == [8443]

        events = await clocked.events_of("sandbox.patch")
        assert [{k: v for k, v in event.items() if k.startswith("ingress_")} for event in events] == [
            {"ingress_host_header": "${PORT}.app.test", "ingress_https_ports": [8443]},
            {"ingress_host_header": None},
        ]
        assert all(event["sandbox_id"] == sid for event in events)
