"""The harness itself: three machines register with both control planes, each runs sandboxes."""

from __future__ import annotations

from tests.multihost.harness import Cluster


def test_every_host_registers_with_both_control_planes(cluster: Cluster) -> None:
    key = cluster.api_key()
    ids = {agent.host_id for agent in cluster.agents}  # type: ignore[attr-defined]
    for cp in (0, 1):
        statuses = cluster.host_statuses(key, cp)
        assert {h: statuses.get(h) for h in ids} == {h: "active" for h in ids}
