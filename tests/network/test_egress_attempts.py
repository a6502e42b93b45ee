"""Connection attempts for the audit trail (drivers/net/egress_rules.py's sets of attempts, egress.py's
records), with real packets between namespaces the test makes: a "host" namespace holding the egress
table and routing, a "sandbox" behind the veth ``pdkt1``, and a "target" listening on two ports.

tests/audit/test_audit_live.py follows a refused attempt from a real sandbox to its audit trail.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers.net.egress_rules import EgressFirewall
from paddock_hostagent.egress import Attachment, EgressService
from tests.security import network_support

pytestmark = [pytest.mark.root]

NFT_TABLE = "pdka"
SANDBOX_IP, HOST_IP = "10.254.96.2", "10.254.96.1"
TARGET_IP, TARGET_GW = "10.254.97.2", "10.254.97.1"


def run(*argv: str) -> None:
    subprocess.run(argv, check=True)


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str, str]]:
    with (
        network_support.scratch_netns("pdka-host") as host,
        network_support.scratch_netns("pdka-sb") as sandbox,
        network_support.scratch_netns("pdka-tgt") as target,
    ):
        run(
            "ip", "-n", host, "link", "add", "pdkt1", "type", "veth", "peer", "name", "eth0", "netns", sandbox
        )
        run("ip", "-n", host, "link", "add", "tgt0", "type", "veth", "peer", "name", "eth0", "netns", target)
        run("ip", "-n", host, "addr", "add", f"{HOST_IP}/24", "dev", "pdkt1")
        run("ip", "-n", host, "addr", "add", f"{TARGET_GW}/24", "dev", "tgt0")
        run("ip", "-n", sandbox, "addr", "add", f"{SANDBOX_IP}/24", "dev", "eth0")
        run("ip", "-n", target, "addr", "add", f"{TARGET_IP}/24", "dev", "eth0")
        for ns, links in (
            (host, ("lo", "pdkt1", "tgt0")),
            (sandbox, ("lo", "eth0")),
            (target, ("lo", "eth0")),
        ):
            for link in links:
                run("ip", "-n", ns, "link", "set", link, "up")
        run("ip", "-n", sandbox, "route", "add", "default", "via", HOST_IP)
        run("ip", "-n", target, "route", "add", "default", "via", TARGET_GW)
        network_support.sysctl_in(host, "net.ipv4.ip_forward", "1")
        yield host, sandbox, target


def dial(sandbox: str, port: int) -> bool:
    """Whether a TCP connection from the sandbox's namespace to the target's port was accepted."""
    sock = network_support.socket_in(Path(f"/run/netns/{sandbox}"), socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(2)
    try:
        sock.connect((TARGET_IP, port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def listening(target: str, port: int) -> socket.socket:
    """A TCP listener on the target's address and ``port``."""
    listener = network_support.socket_in(Path(f"/run/netns/{target}"), socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((TARGET_IP, port))
    listener.listen(8)
    return listener


@pytest.fixture
def listeners(namespaces: tuple[str, str, str]) -> Iterator[None]:
    """The target listens on 80 and 81, so that what refuses a dial is the rule, not the target."""
    made = [listening(namespaces[2], port) for port in (80, 81)]
    try:
        yield
    finally:
        for listener in made:
            listener.close()


def service_in(host: str) -> EgressService:
    """The agent's egress service over a firewall in the "host" namespace, its table set up."""
    made = network_support.made_in(
        Path(f"/run/netns/{host}"), lambda: EgressFirewall(NFT_TABLE, "10.254.96.0/24", HOST_IP)
    )
    made.setup_host()
    return EgressService(made, "127.0.0.1:0", [])


def test_allowed_and_refused_attempts_become_numbered_records(
    namespaces: tuple[str, str, str], listeners: None
) -> None:
    host, sandbox, _ = namespaces

    async def scenario() -> None:
        service = service_in(host)
        await service.attach(Attachment("sbx_audit", "pdkt1", SANDBOX_IP, [f"{TARGET_IP}:80"], -1))
        assert dial(sandbox, 80), "the allowlist admits port 80"
        assert not dial(sandbox, 81), "and refuses 81"
        records, last, lost = await service.attempts("", 0, 100)
        seen = {(r.verdict, r.address, r.protocol, r.port) for r in records}
        assert seen == {("allowed", TARGET_IP, "tcp", 80), ("refused", TARGET_IP, "tcp", 81)}
        assert all(r.sandbox_id == "sbx_audit" and r.packets >= 1 for r in records)
        assert last == max(r.seq for r in records) and lost == 0

        # Asked again from where it stopped: nothing new, until the sandbox tries again.
        service._read_at = 0.0
        again, last_again, _ = await service.attempts(service.epoch, last, 100)
        assert again == [] and last_again == last
        assert not dial(sandbox, 81)
        service._read_at = 0.0
        more, _, _ = await service.attempts(service.epoch, last, 100)
        assert [(r.verdict, r.port) for r in more] == [("refused", 81)]
        assert more[0].seq == last + 1

        # Another agent run (another epoch) is answered from its first record.
        fresh, _, _ = await service.attempts("an-earlier-run", 10**6, 100)
        assert [r.seq for r in fresh] == list(range(1, more[0].seq + 1))
        await service.detach("sbx_audit", "pdkt1")

    asyncio.run(scenario())


def test_a_denylists_refusals_are_refused_attempts_too(
    namespaces: tuple[str, str, str], listeners: None
) -> None:
    host, sandbox, _ = namespaces

    async def scenario() -> None:
        service = service_in(host)
        await service.attach(Attachment("sbx_deny", "pdkt1", SANDBOX_IP, [f"!{TARGET_IP}:81"], -1))
        assert dial(sandbox, 80), "what the denylist does not name passes"
        assert not dial(sandbox, 81), "and what it names is refused"
        records, _, _ = await service.attempts("", 0, 100)
        seen = {(r.verdict, r.address, r.protocol, r.port) for r in records}
        assert seen == {("allowed", TARGET_IP, "tcp", 80), ("refused", TARGET_IP, "tcp", 81)}
        await service.detach("sbx_deny", "pdkt1")

    asyncio.run(scenario())
