"""Which E2B requests the audit trail files, and under which route (``edge/e2b/audit_targets.py``); the
trail of a live sandbox driven through E2B's SDK is ``tests/e2b/test_audit_trail.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from paddock_controlplane.edge.auditing import Target
from paddock_controlplane.edge.e2b.audit_targets import api_target, edge_locate
from paddock_controlplane.records.services import Services
from paddock_controlplane.settings import ControlPlaneSettings


def _scope(path: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    encoded = [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
    return {"type": "http", "method": "POST", "path": path, "headers": encoded, "query_string": b""}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/sandboxes/sb-1", Target("sb-1", "/sandboxes/{sandbox_id}")),
        ("/sandboxes/sb-1/timeout", Target("sb-1", "/sandboxes/{sandbox_id}/timeout")),
        ("/sandboxes/sb-1/snapshots", Target("sb-1", "/sandboxes/{sandbox_id}/snapshots")),
        ("/sandboxes/sb-1/logs", None),  # read from the trail: reading them would add to it
        ("/v2/sandboxes/sb-1/logs", None),
        ("/unstable/sandboxes/sb-1/record", Target("sb-1", "/unstable/sandboxes/{sandbox_id}/record")),
        ("/sandboxes/metrics", None),  # many sandboxes' metrics: on none
        ("/sandboxes", None),  # a create or a list: no sandbox yet
        ("/v2/sandboxes", None),
        ("/templates/base", None),
        ("/v3/sandboxes/sb-1", None),
    ],
)
def test_the_e2b_apis_calls_on_a_sandbox(path: str, expected: Target | None) -> None:
    assert api_target(_scope(path)) == expected


def test_the_edges_calls_on_envd_and_the_interpreter() -> None:
    settings = ControlPlaneSettings(e2b_domain="e2b.example.test")
    locate = edge_locate(cast(Services, SimpleNamespace(settings=settings)))

    def by_header(path: str, port: int) -> Target | None:
        return locate(_scope(path, {"E2b-Sandbox-Id": "sb-1", "E2b-Sandbox-Port": str(port)}))

    assert by_header("/process.Process/Start", 49983) == Target("sb-1", "/process.Process/Start")
    assert by_header("/files", 49983) == Target("sb-1", "/files", raw_body=True)
    assert by_header("/execute", 49999) == Target("sb-1", "/execute")
    assert by_header("/health", 49983) is None
    assert by_header("/", 8080) is None  # the user's own traffic, as the ingress's
    by_host = locate(_scope("/files", {"Host": "49983-sb-2.e2b.example.test"}))
    assert by_host == Target("sb-2", "/files", raw_body=True)
    assert locate(_scope("/files")) is None  # names no sandbox: the edge's 400
