"""drivers/net/linkdump.py against the kernel: a link dump filtered by kind, in a namespace of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.security.network_support import scratch_netns


@pytest.fixture
def netns() -> Iterator[str]:
    with scratch_netns("pdkld") as name:
        yield name


def _in(netns: str, *argv: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", netns, *argv], check=True, capture_output=True, text=True
    ).stdout


def test_only_links_of_the_kind_asked_for_are_named_across_a_dump_of_many_parts(netns: str) -> None:
    # 300 veth pairs make the kernel answer in several parts; two bridges hide among them.
    batch = "\n".join(f"link add va{i} type veth peer name vb{i}" for i in range(300))
    subprocess.run(["ip", "-n", netns, "-batch", "-"], input=batch + "\n", check=True, text=True)
    for bridge in ("pdkbtest1", "pdkbtest0"):
        subprocess.run(["ip", "-n", netns, "link", "add", bridge, "type", "bridge"], check=True)
    script = (
        "import json; from paddock_hostagent.drivers.net.linkdump import links_of_kind; "
        "print(json.dumps([links_of_kind('bridge'), links_of_kind('veth'), links_of_kind('vxlan')]))"
    )
    bridges, veths, vxlans = json.loads(_in(netns, sys.executable, "-c", script))
    assert bridges == ["pdkbtest0", "pdkbtest1"]
    assert len(veths) == 600 and "va0" in veths and "vb299" in veths
    assert vxlans == []
