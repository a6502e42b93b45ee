"""One cluster for the module's tests: two control planes on PostgreSQL and three host "machines".

Host 1 offers twice the memory of hosts 2 and 3 (so placement by free memory is visible), and the
hosts carry labels for ``node_selector``: ``zone`` a/b/b and ``disk`` ssd on host 3 only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostagent import conftest as hostagent_conftest
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.multihost.harness import Cluster, start_cluster

__all__ = ["debian_image", "guest_binary_dir"]

HOSTS = [
    {"total_mib": 6144, "labels": {"zone": "a"}},
    {"total_mib": 3072, "labels": {"zone": "b"}},
    {"total_mib": 3072, "labels": {"zone": "b", "disk": "ssd"}},
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The whole harness takes minutes (three agents, two control planes): out of the fast subset.
    hostagent_conftest.pytest_collection_modifyitems(config, items)
    for item in items:
        if "multihost" in str(item.fspath):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="package")
def cluster(debian_image: Path, guest_binary_dir: Path) -> Iterator[Cluster]:
    # Billing passes every 0.5 s in both control planes, so they meet on the same rows.
    live = start_cluster(
        guest_binary_dir,
        HOSTS,
        cp_env={
            "PADDOCK_CP_BILLING_INTERVAL_S": "0.5",
            # A create orphaned by a killed control plane is settled after this plus ORPHAN_AFTER_S.
            "PADDOCK_CP_BOOT_TIMEOUT_S": "20",
        },
    )
    try:
        yield live
    finally:
        live.stop()
