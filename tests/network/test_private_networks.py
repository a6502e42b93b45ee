"""Private networks on real sandboxes: control plane + host agent + runc/crun + Linux bridges, no fakes.

Reachability is proven with real traffic between sandboxes, both ways: a small TCP server (perl's
IO::Socket, in the debian:13 image) answers with its hostname, a client dials it with bash's
``/dev/tcp``, and ``ping`` checks ICMP. Every address dialled is a sandbox on this machine.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostagent.conftest import debian_image, guest_binary_dir, pytest_collection_modifyitems
from tests.live import LivePlatform, start_platform

__all__ = ["debian_image", "guest_binary_dir", "pytest_collection_modifyitems"]

pytestmark = pytest.mark.root

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size
PORT = 7000
LISTEN = (
    "setsid perl -MIO::Socket::INET -e '"
    '$s = IO::Socket::INET->new(LocalAddr => "0.0.0.0", LocalPort => {port}, Listen => 16, ReuseAddr => 1)'
    ' or die "listen: $!"; while ($c = $s->accept) {{ print $c "hello from " . `hostname`; close $c }}'
    "' </dev/null >/dev/null 2>&1 &"
)


@pytest.fixture(scope="module")
def platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    # A restarted agent on a busy test machine may take a few seconds: not long enough to be "dead".
    live = start_platform(
        guest_binary_dir, agent_options={"pool_size": 3}, cp_env={"PADDOCK_CP_HOST_DEAD_AFTER_S": "20"}
    )
    tags = [hashlib.sha256(str(agent.state_dir.resolve()).encode()).hexdigest()[:4] for agent in live.agents]
    try:
        yield live
    finally:
        live.stop()
        left = [name for name in bridges() for tag in tags if name.startswith(f"pb{tag}")]
        assert not left, f"bridges left behind: {left}"


class User:
    """One account on the platform; destroys what it created when the test ends."""

    def __init__(self, platform: LivePlatform) -> None:
        self.http = platform.http(platform.api_key())
        self.created: list[str] = []

    def ok(self, response: httpx.Response) -> Any:
        assert response.status_code == 200, response.text
        return response.json()["data"]

    def network(self, name: str = "lan") -> dict[str, Any]:
        return dict(self.ok(self.http.post("/v1/networks", json={"name": name})))

    def create(self, name: str, **body: Any) -> dict[str, Any]:
        body = {"shape": SHAPE, "disk_mib": DISK_MIB, "name": name, **body}
        sandbox = dict(self.ok(self.http.post("/v1/sandboxes", json=body)))
        self.created.append(sandbox["id"])
        return sandbox

    def get(self, sandbox_id: str) -> dict[str, Any]:
        return dict(self.ok(self.http.get(f"/v1/sandboxes/{sandbox_id}")))

    def sh(self, sandbox_id: str, script: str) -> dict[str, Any]:
        response = self.http.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}
        )
        return dict(self.ok(response)["result"])

    def serve(self, sandbox_id: str) -> None:
        assert self.sh(sandbox_id, LISTEN.format(port=PORT))["exit_code"] == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if f":{PORT}" in self.sh(sandbox_id, "ss -ltn")["stdout"]:
                return
            time.sleep(0.1)
        raise AssertionError("listener did not start")

    def dial(self, sandbox_id: str, ip: str) -> str:
        """What the TCP server at ``ip`` says to ``sandbox_id``; '' when it cannot be reached in 2 s."""
        script = f"timeout 2 bash -c 'exec 3<>/dev/tcp/{ip}/{PORT}; cat <&3'"
        result = self.sh(sandbox_id, script)
        return str(result["stdout"]).strip() if result["exit_code"] == 0 else ""

    def ping(self, sandbox_id: str, ip: str) -> bool:
        return self.sh(sandbox_id, f"ping -c1 -W1 {ip}")["exit_code"] == 0

    def destroy_all(self) -> None:
        for sandbox_id in self.created:
            self.http.delete(f"/v1/sandboxes/{sandbox_id}")
        deadline = time.monotonic() + 30
        for sandbox_id in self.created:
            while self.get(sandbox_id)["status"] != "destroyed" and time.monotonic() < deadline:
                time.sleep(0.1)
        self.created.clear()

    def close(self) -> None:
        self.destroy_all()
        self.http.close()


@pytest.fixture
def user(platform: LivePlatform) -> Iterator[User]:
    account = User(platform)
    try:
        yield account
    finally:
        account.close()


def overlay_ip(sandbox: dict[str, Any], network_id: str) -> str:
    (member,) = [n for n in sandbox.get("networks", []) if n["id"] == network_id]
    assert member["status"] == "active"
    return str(member["ip"])


def bridges() -> set[str]:
    return {path.name for path in Path("/sys/class/net").iterdir() if (path / "bridge").is_dir()}


def ports(bridge: str) -> set[str]:
    return {path.name for path in Path(f"/sys/class/net/{bridge}/brif").iterdir()}


def test_members_talk_both_ways_and_a_non_member_cannot(user: User) -> None:
    net = user.network()
    name = secrets.token_hex(2)
    a = user.create(f"a-{name}", networks=[{"id": net["id"]}])
    b = user.create(f"b-{name}", networks=[{"id": net["id"]}])
    c = user.create(f"c-{name}")
    ip_a, ip_b = overlay_ip(a, net["id"]), overlay_ip(b, net["id"])
    assert "networks" not in c
    shown = user.sh(a["id"], "ip -4 -o addr show dev eth1")["stdout"]
    assert f"{ip_a}/24" in shown, shown
    for sandbox in (a, b, c):
        user.serve(sandbox["id"])

    assert user.dial(b["id"], ip_a) == f"hello from a-{name}"
    assert user.dial(a["id"], ip_b) == f"hello from b-{name}"
    assert user.ping(a["id"], ip_b) and user.ping(b["id"], ip_a)

    # the third sandbox reaches neither member, over the overlay nor over their default addresses
    assert user.dial(c["id"], ip_a) == "" and user.dial(c["id"], ip_b) == ""
    assert not user.ping(c["id"], ip_a)
    assert user.dial(c["id"], a["ip"]) == ""
    # and the members reach the third one only as before: not at all (default network stays isolated)
    assert user.dial(a["id"], c["ip"]) == ""
    members = user.ok(user.http.get(f"/v1/networks/{net['id']}"))["members"]
    assert sorted(m["ip"] for m in members) == sorted([ip_a, ip_b])


def test_a_create_joins_its_networks_in_its_one_boot_call(platform: LivePlatform, user: User) -> None:
    first, second = user.network("one"), user.network("two")
    body = {"shape": SHAPE, "disk_mib": DISK_MIB, "networks": [{"id": first["id"]}, {"id": second["id"]}]}
    response = user.http.post("/v1/sandboxes", json=body)
    sandbox = user.ok(response)
    user.created.append(sandbox["id"])
    shown = user.sh(sandbox["id"], "ip -4 -o addr show dev eth1; ip -4 -o addr show dev eth2")["stdout"]
    assert (
        f"{overlay_ip(sandbox, first['id'])}/24" in shown
        and f"{overlay_ip(sandbox, second['id'])}/24" in shown
    )
    # the host agent logs its calls under the create's request id (an HTTP request, or a call on the
    # kept channel): one create, no separate attach
    request_id = response.headers["x-request-id"]
    lines = [
        json.loads(raw)
        for agent in platform.agents
        for raw in agent.log_path.read_text(errors="replace").splitlines()
        if request_id in raw
    ]
    calls = [
        (line["method"], line["path"]) if line["event"] == "request" else ("channel", line["op"])
        for line in lines
        if line.get("event") in ("request", "channel_call")
    ]
    assert calls in ([("POST", "/internal/v1/sandboxes")], [("channel", "create")]), calls


def test_an_egress_allowlist_does_not_cut_the_private_network(user: User) -> None:
    """Allowlists govern traffic leaving through eth0; members still reach each other on the bridge."""
    net = user.network()
    name = secrets.token_hex(2)
    a = user.create(f"a-{name}", networks=[{"id": net["id"]}])
    b = user.create(f"b-{name}", networks=[{"id": net["id"]}], egress=["192.0.2.1:443"])
    user.serve(a["id"])
    user.serve(b["id"])
    assert user.dial(b["id"], overlay_ip(a, net["id"])) == f"hello from a-{name}"
    assert user.dial(a["id"], overlay_ip(b, net["id"])) == f"hello from b-{name}"


def test_attach_later_detach_and_destroy_leave_nothing(user: User) -> None:
    before = bridges()
    net = user.network()
    name = secrets.token_hex(2)
    a = user.create(f"a-{name}", networks=[{"id": net["id"]}])
    c = user.create(f"c-{name}")
    user.serve(a["id"])
    user.serve(c["id"])
    ip_a = overlay_ip(a, net["id"])
    assert user.dial(c["id"], ip_a) == ""

    assert user.ok(user.http.post(f"/v1/sandboxes/{c['id']}/networks", json={"id": net["id"]})) == {
        "ok": True
    }
    ip_c = overlay_ip(user.get(c["id"]), net["id"])
    assert user.dial(c["id"], ip_a) == f"hello from a-{name}"
    assert user.dial(a["id"], ip_c) == f"hello from c-{name}"
    (bridge,) = bridges() - before
    assert len(ports(bridge)) == 2
    # the host has no address on the bridge or its ports: nothing there is routed or answered
    shown = subprocess.run(["ip", "-o", "addr", "show", "master", bridge], capture_output=True, text=True)
    bridge_addrs = subprocess.run(["ip", "-o", "addr", "show", "dev", bridge], capture_output=True, text=True)
    assert shown.stdout.strip() == "" and bridge_addrs.stdout.strip() == ""

    detached = user.http.delete(f"/v1/sandboxes/{c['id']}/networks/{net['id']}")
    assert user.ok(detached) == {"ok": True}
    assert user.sh(c["id"], "ip link show eth1")["exit_code"] != 0  # the interface is gone
    assert user.dial(c["id"], ip_a) == "" and user.dial(a["id"], ip_c) == ""
    assert len(ports(bridge)) == 1

    assert user.http.delete(f"/v1/networks/{net['id']}").status_code == 409  # a is still a member
    user.destroy_all()
    assert bridges() == before  # last member gone: the bridge is gone too
    assert user.ok(user.http.delete(f"/v1/networks/{net['id']}")) == {"ok": True}


def test_two_users_networks_with_the_same_addresses_stay_apart(platform: LivePlatform, user: User) -> None:
    other = User(platform)
    try:
        mine, theirs = user.network(), other.network()
        assert mine["cidr"] == theirs["cidr"]  # blocks are per user: the same addresses on both
        name = secrets.token_hex(2)
        a = user.create(f"a-{name}", networks=[{"id": mine["id"]}])
        x = other.create(f"x-{name}", networks=[{"id": theirs["id"]}])
        y = other.create(f"y-{name}", networks=[{"id": theirs["id"]}])
        assert overlay_ip(a, mine["id"]) == overlay_ip(x, theirs["id"])
        user.serve(a["id"])
        other.serve(x["id"])
        # y dials the address a and x share: it reaches x, on its own network, never a
        assert other.dial(y["id"], overlay_ip(a, mine["id"])) == f"hello from x-{name}"
    finally:
        other.close()


def test_pause_resume_and_fork(user: User) -> None:
    net = user.network()
    name = secrets.token_hex(2)
    a = user.create(f"a-{name}", networks=[{"id": net["id"]}])
    b = user.create(f"b-{name}", networks=[{"id": net["id"]}])
    user.serve(a["id"])
    ip_a = overlay_ip(a, net["id"])
    assert user.ok(user.http.post(f"/v1/sandboxes/{b['id']}/pause"))["status"] == "paused"
    assert user.ok(user.http.post(f"/v1/sandboxes/{b['id']}/resume"))["status"] == "running"
    assert user.dial(b["id"], ip_a) == f"hello from a-{name}"  # membership kept across pause/resume
    # a sandbox created paused joins at boot too, and is reachable once resumed
    late = user.create(f"p-{name}", networks=[{"id": net["id"]}], start_paused=True)
    assert late["status"] == "paused" and overlay_ip(late, net["id"])
    assert user.ok(user.http.post(f"/v1/sandboxes/{late['id']}/resume"))["status"] == "running"
    assert user.dial(late["id"], ip_a) == f"hello from a-{name}"
    child = user.ok(user.http.post(f"/v1/sandboxes/{a['id']}/fork", json={}))
    user.created.append(child["id"])
    deadline = time.monotonic() + 30
    while user.get(child["id"])["status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "networks" not in user.get(child["id"])  # a fork child joins no network (§11.9)
    assert user.sh(child["id"], "ip link show eth1")["exit_code"] != 0
    assert user.dial(child["id"], ip_a) == ""


def test_memberships_survive_an_agent_crash(platform: LivePlatform, user: User) -> None:
    net = user.network()
    name = secrets.token_hex(2)
    a = user.create(f"a-{name}", networks=[{"id": net["id"]}])
    b = user.create(f"b-{name}", networks=[{"id": net["id"]}])
    user.serve(a["id"])
    ip_a, ip_b = overlay_ip(a, net["id"]), overlay_ip(b, net["id"])
    agent = platform.agents[0]
    record = agent.record(b["id"])
    assert [(m["network_id"], m["ip"], m["ifname"]) for m in record["networks"]] == [
        (net["id"], ip_b, "eth1")
    ]
    # the port of b goes missing while the agent is down; the agent puts it back on adoption
    port = record["networks"][0]["port"]
    agent.stop(signal.SIGKILL)
    subprocess.run(["ip", "link", "del", port], check=True)
    # and a bridge of this agent that no sandbox uses (say, left by a crash mid-detach) is removed
    tag = hashlib.sha256(str(agent.state_dir.resolve()).encode()).hexdigest()[:4]
    orphan = f"pb{tag}deadbeef"
    subprocess.run(["ip", "link", "add", orphan, "type", "bridge"], check=True)
    agent.start()
    platform.wait_for_hosts()
    assert orphan not in bridges()
    assert user.dial(b["id"], ip_a) == f"hello from a-{name}"
    assert user.ping(a["id"], ip_b)
    assert overlay_ip(user.get(b["id"]), net["id"]) == ip_b


def test_interface_names_fit_the_kernel_limit() -> None:
    from paddock_hostagent.drivers.net.bridges import BridgeNetworks

    networks = BridgeNetworks("abcdef12", "paddock", "10.96.0.0/11")
    ids = [f"net_{secrets.token_hex(13)}" for _ in range(50)]
    names = {networks.bridge_name(i) for i in ids} | {networks.port_name("sb-" + i, i) for i in ids}
    assert len(names) == 100 and all(len(name) <= 15 for name in names)
    assert all(networks.bridge_name(i).startswith("pbabcd") for i in ids)
