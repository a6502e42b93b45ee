"""Network isolation probes (issue #12, items 2-4), run from inside real sandboxes of a real host agent.

Listeners are started by the test on the host — on 0.0.0.0, on [::], and on 169.254.169.254 held by a
veth end in the host's namespace — and every probe asserts both what the sandbox saw (refused) and what
the listener saw (nothing). Each probe is made from a sandbox with open egress and from one with an
allowlist. Whatever would have to leave the host goes to the fake internet, a namespace on this machine.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dnslib import DNSRecord

from paddock_hostagent.client import HostAgentClient
from tests.hostagent.conftest import (
    AgentProcess,
    Sandboxes,
    debian_image,
    guest_binary_dir,
    sh,
    teardown_agent,
)
from tests.network.conftest import internet
from tests.network.internet import FakeInternet
from tests.security.network_support import (
    METADATA_ADDRESS,
    HostListener,
    host_address_on_veth,
    link_local_of,
    mac_of,
    sandbox_netns,
    socket_in,
    sysctl_in,
    udp_datagram,
    wait_for_link_local,
)

__all__ = ["debian_image", "guest_binary_dir", "internet"]

pytestmark = [pytest.mark.root, pytest.mark.slow]

CURL_REFUSED = 7


@pytest.fixture(scope="module")
def probe_agent(debian_image: Path, guest_binary_dir: Path, internet: FakeInternet) -> Iterator[AgentProcess]:
    agent = AgentProcess(
        state_dir=Path(f"/tmp/pdkt-{secrets.token_hex(3)}"),
        guest_dir=guest_binary_dir,
        extra_env={"PADDOCK_HOST_DNS_UPSTREAM": internet.dns_upstream},
    )
    agent.start()
    try:
        yield agent
    finally:
        teardown_agent(agent)


@dataclass
class Box:
    """A sandbox with what the probes need to know about it."""

    id: str
    ip: str
    label: str
    netns: Path
    host_veth: str

    @property
    def netns_name(self) -> str:
        return self.netns.name


@dataclass
class Probes:
    host: HostAgentClient
    agent: AgentProcess
    sandboxes: Sandboxes
    internet: FakeInternet

    @property
    def gateway(self) -> str:
        return self.agent.subnet.rsplit(".", 1)[0] + ".1"

    async def box(self, label: str, egress: list[str]) -> Box:
        created = await self.sandboxes.create(egress=egress)
        netns, veth = sandbox_netns(self.agent.record(created["id"]))
        return Box(created["id"], created["ip"], label, netns, veth)

    async def pair(self) -> list[Box]:
        """One sandbox with open egress and one with an allowlist (a name and the fake internet's
        ``raw-a``, so the allowlisted sandbox has somewhere it may go)."""
        allowlist = ["api.example.test", self.internet.address("raw-a")]
        return [await self.box("open", []), await self.box("allowlisted", allowlist)]

    async def sh(self, box: Box, script: str) -> dict[str, Any]:
        return await sh(self.host, box.id, script)

    async def dial(self, box: Box, url: str, max_time_s: int = 3) -> tuple[int, str]:
        """curl's exit code and body for ``url`` fetched inside the sandbox."""
        result = await self.sh(box, f"curl -sS -g --max-time {max_time_s} '{url}'; echo \"|rc=$?\"")
        body, _, code = result["stdout"].rpartition("|rc=")
        return int(code), body


@pytest.fixture
async def probes(probe_agent: AgentProcess, internet: FakeInternet) -> AsyncIterator[Probes]:
    async with probe_agent.client() as client:
        tracker = Sandboxes(client, probe_agent)
        try:
            yield Probes(client, probe_agent, tracker, internet)
        finally:
            await tracker.destroy_all()


@pytest.fixture
def listeners() -> Iterator[dict[str, HostListener]]:
    """TCP listeners on the host: on every IPv4 address, on every IPv6 address, and on the cloud
    metadata address held by a local veth end."""
    with host_address_on_veth(METADATA_ADDRESS):
        made = {
            "any4": HostListener(socket.AF_INET, "0.0.0.0").start(),
            "any6": HostListener(socket.AF_INET6, "::").start(),
            "metadata": HostListener(socket.AF_INET, METADATA_ADDRESS).start(),
        }
        try:
            yield made
        finally:
            for listener in made.values():
                listener.stop()


def assert_listeners_idle(listeners: dict[str, HostListener]) -> None:
    assert {name: item.accepted for name, item in listeners.items()} == {name: [] for name in listeners}


def assert_host_reaches(listener: HostListener, address: str) -> None:
    """The listener answers the host itself: a refusal seen by a sandbox is the firewall's doing."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(3)
        client.connect((address, listener.port))
        client.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert client.recv(4096).endswith(b"hello host")
    deadline = time.monotonic() + 3
    while not listener.accepted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert listener.accepted, "the host's own connection was not recorded"
    listener.accepted.clear()


# -- item 2: the host is closed to every sandbox ------------------------------------------------


async def test_no_sandbox_reaches_the_host_on_any_of_its_addresses(
    probes: Probes, listeners: dict[str, HostListener], internet: FakeInternet
) -> None:
    for box in await probes.pair():
        targets = {
            "0.0.0.0 through the gateway": f"http://{probes.gateway}:{listeners['any4'].port}/",
            "0.0.0.0 through the host's address on another link": (
                f"http://{internet.gateway}:{listeners['any4'].port}/"
            ),
            "169.254.169.254": f"http://{METADATA_ADDRESS}:{listeners['metadata'].port}/",
            "0.0.0.0 through 169.254.169.254": f"http://{METADATA_ADDRESS}:{listeners['any4'].port}/",
        }
        for what, url in targets.items():
            code, body = await probes.dial(box, url)
            assert code == CURL_REFUSED, f"{box.label} sandbox, {what}: curl {code} {body!r}"
        assert_listeners_idle(listeners)
        # What a sandbox still gets from the host: DNS from its resolver.
        lookup = await probes.sh(box, "getent hosts api.example.test")
        assert lookup["stdout"].split()[:1] == [internet.address("api.example.test")], (box.label, lookup)
    # Every listener answers when the host itself asks.
    assert_host_reaches(listeners["any4"], "127.0.0.1")
    assert_host_reaches(listeners["metadata"], METADATA_ADDRESS)
    assert_host_reaches(listeners["any6"], "::1")


@contextlib.contextmanager
def nft_table(ruleset: str) -> Iterator[str]:
    """A throwaway nftables table of the test's (``{t}`` in ``ruleset`` is its name)."""
    name = f"pdkprobe{secrets.token_hex(3)}"
    subprocess.run(["nft", "-f", "-"], input=ruleset.format(t=f"ip {name}"), text=True, check=True)
    try:
        yield name
    finally:
        subprocess.run(["nft", "delete", "table", "ip", name], capture_output=True)


@contextlib.contextmanager
def link_local_beyond_the_host(internet: FakeInternet) -> Iterator[tuple[str, socket.socket]]:
    """169.254.77.7 in the fake internet's namespace, routed from the host as a cloud's metadata
    service would be, with a UDP listener on port 9 of it."""
    target = "169.254.77.7"
    netns = Path(f"/run/netns/{internet.netns}")
    inside_gateway = str(internet.subnet.network_address + 2)
    subprocess.run(["ip", "-n", internet.netns, "addr", "add", f"{target}/32", "dev", "eth0"], check=True)
    subprocess.run(["ip", "route", "add", f"{target}/32", "via", inside_gateway], check=True)
    inbox = socket_in(netns, socket.AF_INET, socket.SOCK_DGRAM)
    try:
        inbox.bind((target, 9))
        yield target, inbox
    finally:
        inbox.close()
        subprocess.run(["ip", "route", "delete", f"{target}/32"], capture_output=True)
        subprocess.run(["ip", "-n", internet.netns, "addr", "delete", f"{target}/32", "dev", "eth0"])


async def test_link_local_and_host_dnat_beyond_the_host_are_refused(
    probes: Probes, internet: FakeInternet
) -> None:
    boxes = await probes.pair()
    raw_a = internet.address("raw-a")
    # Something on the host publishes a port of its own address to a service elsewhere (as docker's
    # published ports do): a sandbox must not get there through the host's address either.
    published = 18080
    dnat = f"""
add table {{t}}
add chain {{t}} pre {{{{ type nat hook prerouting priority dstnat - 5; policy accept; }}}}
add rule {{t}} pre ip daddr {internet.gateway} tcp dport {published} dnat to {raw_a}:80
"""
    with link_local_beyond_the_host(internet) as (target, inbox), nft_table(dnat):
        for box in boxes:
            sent = await probes.sh(box, f"for i in 1 2 3; do echo {box.label} > /dev/udp/{target}/9; done")
            assert sent["exit_code"] == 0, sent
            assert received(inbox, 1) == [], f"datagrams of the {box.label} sandbox reached {target}"
            code, body = await probes.dial(box, f"http://{internet.gateway}:{published}/")
            assert code == CURL_REFUSED, f"{box.label} sandbox through the host's DNAT: curl {code} {body!r}"
        # The same service stays reachable where the rules allow it (raw-a is on the allowlist).
        for box in boxes:
            assert await probes.dial(box, f"http://{raw_a}/") == (0, "raw-a:80"), box.label


async def test_route_localnet_does_not_open_the_hosts_loopback(probes: Probes) -> None:
    """With route_localnet on a sandbox's veth (some host tool's doing), a packet to 127.0.0.1 from the
    sandbox would be delivered to the host's loopback services; the host must still refuse it."""
    box = await probes.box("open", [])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("0.0.0.0", 0))
        listener.settimeout(2)
        port = int(listener.getsockname()[1])
        Path(f"/proc/sys/net/ipv4/conf/{box.host_veth}/route_localnet").write_text("1\n")
        # A frame the sandbox's kernel would never route (127/8 is its own loopback): written as the
        # test, root, through a packet socket in the sandbox's namespace.
        frame = (
            bytes.fromhex(mac_of(box.host_veth).replace(":", ""))
            + bytes.fromhex(mac_of("eth0", box.netns_name).replace(":", ""))
            + b"\x08\x00"
            + udp_datagram(box.ip, 40000, "127.0.0.1", port, b"probe")
        )
        counter = Path(f"/sys/class/net/{box.host_veth}/statistics/rx_packets")
        before = int(counter.read_text())
        with socket_in(box.netns, socket.AF_PACKET, socket.SOCK_RAW) as raw:
            raw.bind(("eth0", 0))
            for _ in range(3):
                raw.send(frame)
        with pytest.raises(TimeoutError):
            listener.recvfrom(100)
        assert int(counter.read_text()) - before >= 3, "the frames never reached the host"


# -- item 3: no IPv6 ------------------------------------------------------------------------------


async def test_sandboxes_have_no_ipv6_and_cannot_turn_it_on(probes: Probes) -> None:
    for box in await probes.pair():
        addresses = await probes.sh(box, "ip -6 -o addr show")
        assert [line.split()[1] for line in addresses["stdout"].splitlines()] == ["lo"], addresses
        attempt = await probes.sh(
            box,
            "echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6; echo 0 > /proc/sys/net/ipv6/conf/all/disable_ipv6;"
            " ip -6 addr add fd00::5/64 dev eth0",
        )
        assert attempt["exit_code"] != 0
        assert (await probes.sh(box, "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6"))["stdout"] == "1\n"
        host_side = Path(f"/proc/sys/net/ipv6/conf/{box.host_veth}/disable_ipv6").read_text()
        assert host_side == "1\n", f"{box.label}: the host end of the veth has IPv6"


async def test_a_private_network_interface_has_no_ipv6_either(probes: Probes) -> None:
    first, second = await probes.pair()
    network_id = f"net_probe{secrets.token_hex(3)}"
    for index, box in enumerate((first, second)):
        joined = await probes.host.attach_network(
            box.id, network_id=network_id, ip=f"10.96.250.{2 + index}", prefixlen=24
        )
        assert joined.ifname == "eth1"
        addresses = await probes.sh(box, "ip -6 -o addr show; ip -4 -o addr show dev eth1")
        lines = addresses["stdout"].splitlines()
        assert [line.split()[1] for line in lines] == ["lo", "eth1"], addresses
    reach = await probes.sh(first, "ping -c 1 -W 3 10.96.250.3")
    assert reach["exit_code"] == 0, reach  # members still meet, over IPv4
    for box in (first, second):
        await probes.host.detach_network(box.id, network_id)


async def test_ipv6_from_a_sandbox_to_the_host_is_dropped_even_if_the_sandbox_had_it(
    probes: Probes, listeners: dict[str, HostListener]
) -> None:
    """The issue's probe: the host's [::] service through the veth's link-local address. The sandbox
    has no IPv6; the test then turns it on in the sandbox's namespace (what no sandbox can do) and the
    host still drops it."""
    port = listeners["any6"].port
    for box in await probes.pair():
        host_ll = link_local_of(mac_of(box.host_veth))
        code, _ = await probes.dial(box, f"http://[{host_ll}%eth0]:{port}/")
        assert code != 0, f"{box.label} sandbox reached the host over IPv6"
        sysctl_in(box.netns_name, "net.ipv6.conf.eth0.disable_ipv6", "0")
        wait_for_link_local(box.netns_name, "eth0")
        code, _ = await probes.dial(box, f"http://[{host_ll}%eth0]:{port}/", max_time_s=4)
        assert code != 0, f"{box.label} sandbox with IPv6 back reached the host"
    assert_listeners_idle(listeners)
    assert_host_reaches(listeners["any6"], "::1")


def accepted_any(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def ipv6_discards(ifname: str) -> int:
    for line in Path(f"/proc/net/dev_snmp6/{ifname}").read_text().splitlines():
        key, value = line.split()
        if key == "Ip6InDiscards":
            return int(value)
    raise AssertionError(f"no Ip6InDiscards for {ifname}")


async def test_ipv6_into_a_sandbox_from_the_host_or_another_sandbox_is_dropped(probes: Probes) -> None:
    target, other = await probes.pair()
    # The worst case on the target's side: IPv6 back on and a service on [::].
    sysctl_in(target.netns_name, "net.ipv6.conf.eth0.disable_ipv6", "0")
    target_ll = wait_for_link_local(target.netns_name, "eth0")
    with socket_in(target.netns, socket.AF_INET6, socket.SOCK_STREAM) as server:
        server.bind(("::", 0))
        server.listen(8)
        server.setblocking(False)
        port = int(server.getsockname()[1])
        # The host: its end of the veth has no IPv6, so it cannot even send.
        index = socket.if_nametoindex(target.host_veth)
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as client:
            client.settimeout(3)
            with pytest.raises(OSError):
                client.connect((target_ll, port, 0, index))
        # Another sandbox, IPv6 back on too, sending to the target's address through the host.
        sysctl_in(other.netns_name, "net.ipv6.conf.eth0.disable_ipv6", "0")
        wait_for_link_local(other.netns_name, "eth0")
        routing = [
            f"-6 neigh replace fe80::1 lladdr {mac_of(other.host_veth)} dev eth0 nud permanent",
            "-6 addr add fd00:77::2/128 dev eth0 nodad",
            "-6 route add fd00:77::1/128 via fe80::1 dev eth0",
        ]
        for command in routing:
            subprocess.run(["ip", "-n", other.netns_name, *command.split()], check=True)
        subprocess.run(
            ["ip", "-n", target.netns_name, "-6", "addr", "add", "fd00:77::1/128", "dev", "eth0", "nodad"]
        )
        before = ipv6_discards(other.host_veth)
        code, _ = await probes.dial(other, f"http://[fd00:77::1]:{port}/")
        assert code != 0
        assert ipv6_discards(other.host_veth) > before, "the host never saw the sandbox's IPv6 packets"
        assert not accepted_any(server)


# -- item 4: forged source addresses ------------------------------------------------------------


async def test_a_sandbox_cannot_open_raw_or_packet_sockets(probes: Probes) -> None:
    box = await probes.box("open", [])
    script = (
        "use Socket; for my $t ([PF_INET, SOCK_RAW, 17], [17, SOCK_RAW, 768]) {"
        ' if (socket(my $s, $t->[0], $t->[1], $t->[2])) { print "opened\\n" } else { print "$!\\n" } }'
    )
    result = await probes.sh(box, f"perl -e '{script}'")
    assert result["stdout"].splitlines() == ["Operation not permitted"] * 2, result


def dns_query(name: str) -> bytes:
    return bytes(DNSRecord.question(name).pack())


def received(sock: socket.socket, timeout_s: float) -> list[bytes]:
    sock.settimeout(timeout_s)
    got: list[bytes] = []
    with contextlib.suppress(TimeoutError):
        while True:
            got.append(sock.recv(4096))
            sock.settimeout(0.3)
    return got


async def test_a_forged_source_address_reaches_no_other_sandbox(
    probes: Probes, internet: FakeInternet
) -> None:
    """A (with the raw socket a sandbox no longer has, opened by the test in A's namespace) asks the
    host's resolver and the fake internet's DNS server with B's address as source: B gets nothing,
    while the same query with A's own address is answered."""
    attacker, victim = await probes.box("attacker", []), await probes.box("victim", [])
    port = 5353
    with (
        socket_in(attacker.netns, socket.AF_INET, socket.SOCK_DGRAM) as attacker_inbox,
        socket_in(victim.netns, socket.AF_INET, socket.SOCK_DGRAM) as victim_inbox,
        socket_in(attacker.netns, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as raw,
    ):
        attacker_inbox.bind((attacker.ip, port))
        victim_inbox.bind((victim.ip, port))
        for resolver in (probes.gateway, internet.dns_upstream):
            query = dns_query("api.example.test")
            raw.sendto(udp_datagram(attacker.ip, port, resolver, 53, query), (resolver, 0))
            answers = received(attacker_inbox, 3)
            assert len(answers) == 1 and answers[0][:2] == query[:2], f"control: {resolver} did not answer"
            for _ in range(20):
                raw.sendto(udp_datagram(victim.ip, port, resolver, 53, query), (resolver, 0))
            assert received(victim_inbox, 2) == [], f"{resolver} answered a forged query to the victim"


async def test_ping_works_without_raw_sockets(probes: Probes, internet: FakeInternet) -> None:
    allowed = internet.address("raw-a")
    for box in await probes.pair():
        for user in ("root", "nobody"):
            result = await probes.sh(
                box, f"setpriv --reuid={user} --regid=nogroup --clear-groups ping -c 1 -W 3 {allowed}"
            )
            assert result["exit_code"] == 0, (box.label, user, result)
            assert "1 received" in result["stdout"]
    # And a ping to the host itself is refused like everything else there.
    result = await probes.sh(box, f"ping -c 1 -W 2 {probes.gateway}")
    assert result["exit_code"] != 0


# -- restarts -----------------------------------------------------------------------------------


async def test_sandboxes_stay_guarded_across_an_agent_crash_and_restart(
    debian_image: Path, guest_binary_dir: Path, internet: FakeInternet, listeners: dict[str, HostListener]
) -> None:
    """A restarted agent rewrites its table; the guard of the sandboxes it adopts is rebuilt in the same
    batch from the addresses it persisted."""
    agent = AgentProcess(
        state_dir=Path(f"/tmp/pdkt-{secrets.token_hex(3)}"),
        guest_dir=guest_binary_dir,
        pool_size=0,
        extra_env={"PADDOCK_HOST_DNS_UPSTREAM": internet.dns_upstream},
    )
    agent.start()
    try:
        async with agent.client() as client:
            probes = Probes(client, agent, Sandboxes(client, agent), internet)
            boxes = await probes.pair()
        agent.stop(signal.SIGKILL)
        agent.start()
        async with agent.client() as client:
            probes.host = client
            for box in boxes:
                code, body = await probes.dial(box, f"http://{probes.gateway}:{listeners['any4'].port}/")
                assert code == CURL_REFUSED, f"{box.label} sandbox after the restart: curl {code} {body!r}"
                lookup = await probes.sh(box, "getent hosts api.example.test")
                assert lookup["exit_code"] == 0, (box.label, lookup)
                addresses = await probes.sh(box, "ip -6 -o addr show")
                assert [line.split()[1] for line in addresses["stdout"].splitlines()] == ["lo"]
                ping = await probes.sh(box, f"ping -c 1 -W 3 {internet.address('raw-a')}")
                assert ping["exit_code"] == 0, (box.label, ping)
            assert_listeners_idle(listeners)
    finally:
        teardown_agent(agent)
