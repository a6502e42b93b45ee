"""Escape probes from inside a sandbox, on every tier: host files and processes, another sandbox, host
services on every host address (the host agent's and the control plane's ports among them), raw
sockets, mount, module loading, ptrace of a host process, devices, /proc/sys writes, bpf and
open_by_handle_at. The probes are the same scripts on every tier (probes.py); each must hold.

Tiers come from the integration suite's ``platform`` fixture (tests/integration/conftest.py ``TIERS``),
so ``pytest tests/isolation -k gvisor`` runs one tier, and a tier added there is probed here too.

At the end of the session the suite writes its report — probes tried and held per tier, and what each
probe printed — to ``isolation-probes.md``/``.json`` under pytest's temporary directory (the path is
printed), and to ``$PADDOCK_ISOLATION_REPORT_DIR`` when that is set (bench/results, for instance).

Also probed elsewhere: IPv6, forged sources and link-local/metadata addresses per runtime in
tests/security/test_network_probes.py; pids, disk and memory admission in
tests/security/test_sandbox_isolation.py.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import debian_image, guest_binary_dir, platform, platform_tier
from tests.isolation.probes import PROBES, Probe, Targets
from tests.live import LivePlatform
from tests.network import internet
from tests.security.network_support import HostListener

__all__ = ["debian_image", "guest_binary_dir", "platform"]

pytestmark = pytest.mark.root

BODY = {"shape": "s-1vcpu-256mb", "disk_mib": 2048}
VICTIM_PORT = 8123
# What a sandbox may reach on the host by design: its DNS resolver on the gateway.
ALLOWED_PORTS = {53}


@dataclasses.dataclass
class Outcome:
    tier: str
    probe: str
    what: str
    held: bool
    output: str


@dataclasses.dataclass
class Report:
    outcomes: list[Outcome] = dataclasses.field(default_factory=list)

    def per_tier(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for outcome in self.outcomes:
            tier = counts.setdefault(outcome.tier, {"tried": 0, "held": 0})
            tier["tried"] += 1
            tier["held"] += int(outcome.held)
        return counts

    def markdown(self) -> str:
        lines = ["# Escape probes", "", "| tier | tried | held |", "|---|---|---|"]
        lines += [f"| {tier} | {c['tried']} | {c['held']} |" for tier, c in self.per_tier().items()]
        lines += ["", "| tier | probe | held | output |", "|---|---|---|---|"]
        for o in self.outcomes:
            output = o.output.replace("|", "\\|").replace("\n", " ")[:160]
            lines.append(f"| {o.tier} | {o.probe} | {'yes' if o.held else 'NO'} | {output} |")
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Report]:
    collected = Report()
    yield collected
    if not collected.outcomes:
        return
    directories = [tmp_path_factory.mktemp("isolation-report")]
    if os.environ.get("PADDOCK_ISOLATION_REPORT_DIR"):
        directories.append(Path(os.environ["PADDOCK_ISOLATION_REPORT_DIR"]))
    payload = {
        "per_tier": collected.per_tier(),
        "probes": [dataclasses.asdict(o) for o in collected.outcomes],
    }
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "isolation-probes.md").write_text(collected.markdown())
        (directory / "isolation-probes.json").write_text(json.dumps(payload, indent=2))
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        terminal.write_line("")
        for tier, counts in collected.per_tier().items():
            terminal.write_line(f"escape probes on {tier}: {counts['held']} of {counts['tried']} held")
        terminal.write_line(f"escape probe report: {directories[-1] / 'isolation-probes.md'}")


@dataclasses.dataclass
class Scene:
    http: httpx.Client
    attacker: str
    targets: Targets
    host_process: subprocess.Popen[bytes]
    listener: HostListener


def exec_sh(http: httpx.Client, sandbox_id: str, script: str, timeout_s: float = 60) -> dict[str, Any]:
    response = http.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "bash", "args": ["-c", script]}, timeout=timeout_s
    )
    assert response.status_code == 200, response.text
    return dict(response.json()["data"]["result"])


def create(http: httpx.Client) -> dict[str, Any]:
    response = http.post("/v1/sandboxes", json=BODY)
    assert response.status_code == 200, response.text
    return dict(response.json()["data"])


#: Where the suite's test agents take their subnets (tests/hostagent/conftest.py ``private_subnet``).
TEST_AGENT_SUBNETS = ipaddress.IPv4Network("10.252.0.0/16")


def host_addresses(own_subnet: str) -> list[str]:
    """The host's IPv4 addresses, but those other tests made and may take down while the probe dials
    them (the address is then routed out like any other, and whatever answers there is no host
    service): the host ends of fake internets (tests/network/internet.py), which stand for the
    internet a sandbox may reach anyway, and the gateways of other test agents' subnets. Full run 50
    read that as an escape: the VM dialled 198.19.134.1 just after a concurrent test's fake internet
    there had gone."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    own = ipaddress.IPv4Network(own_subnet)
    kept = []
    for address in {ipaddress.IPv4Address(line.split()[3].split("/")[0]) for line in out.splitlines()}:
        if address in internet.RANGE or (address in TEST_AGENT_SUBNETS and address not in own):
            continue
        kept.append(str(address))
    return sorted(kept)


def host_tcp_ports() -> list[int]:
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    return sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines()} - ALLOWED_PORTS)


def root_device() -> str:
    dev = os.stat("/").st_dev
    return f"{os.major(dev)} {os.minor(dev)}"


@pytest.fixture(scope="module")
def scene(platform: LivePlatform, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """An attacker sandbox and a victim sandbox (a file and a listening port), a host process, a host
    file and a host listener on every address."""
    marker = f"pdkescape{secrets.token_hex(4)}"
    secret_dir = tmp_path_factory.mktemp("escape")
    secret_file = secret_dir / "secret"
    secret_file.write_text(f"{marker}-host")
    host_process = subprocess.Popen(["sleep", f"3600.{int(marker[-6:], 16)}"])
    listener = HostListener(family=2, address="0.0.0.0").start()
    http = platform.http(platform.api_key())
    try:
        attacker = create(http)["id"]
        victim = create(http)
        victim_secret = f"{marker}-victim"
        serve = (
            f"echo {victim_secret} > /root/secret; nohup perl -e 'use IO::Socket::INET;"
            f" my $s = IO::Socket::INET->new(LocalPort => {VICTIM_PORT}, Listen => 5, ReuseAddr => 1) or die;"
            ' while (my $c = $s->accept) { print $c "hi\\n"; close $c }\' >/dev/null 2>&1 &'
        )
        exec_sh(http, victim["id"], serve)
        deadline = time.monotonic() + 10
        while (
            "hi"
            not in exec_sh(
                http, victim["id"], f"curl -s --max-time 2 telnet://127.0.0.1:{VICTIM_PORT} </dev/null"
            )["stdout"]
        ):
            assert time.monotonic() < deadline, "the victim's listener never answered inside the victim"
            time.sleep(0.2)
        ports = host_tcp_ports()
        assert listener.port in ports and platform.agents[0].port in ports, ports
        addresses = host_addresses(platform.agents[0].subnet)
        targets = Targets(
            host_secret_path=str(secret_file),
            host_secret=f"{marker}-host",
            host_write_path=str(secret_dir / "written"),
            host_pid=host_process.pid,
            host_marker=f"3600.{int(marker[-6:], 16)}",
            victim_ip=victim["ip"],
            victim_port=VICTIM_PORT,
            victim_secret=victim_secret,
            dial_targets=" ".join(f"{a}:{p}" for a in addresses for p in ports),
            host_root_device=root_device(),
        )
        yield Scene(http, attacker, targets, host_process, listener)
    finally:
        for sandbox in http.get("/v1/sandboxes", params={"limit": 100}).json()["data"].get("data", []):
            if sandbox["status"] not in ("destroyed", "failed"):
                http.delete(f"/v1/sandboxes/{sandbox['id']}")
        http.close()
        listener.stop()
        host_process.kill()
        host_process.wait()


def fill(probe: Probe, targets: Targets) -> str:
    script = probe.script
    values = {**dataclasses.asdict(targets), "host_marker_split": targets.host_marker_split}
    for name, value in values.items():
        script = script.replace("{" + name + "}", str(value))
    return script


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_escape_probe_holds(platform: LivePlatform, scene: Scene, report: Report, probe: Probe) -> None:
    result = exec_sh(scene.http, scene.attacker, fill(probe, scene.targets))
    output = (result["stdout"] + result["stderr"]).strip()
    lines = result["stdout"].splitlines()
    escaped = [line for line in lines if line.startswith("ESCAPED")]
    if probe.name == "host-file-write" and Path(scene.targets.host_write_path).exists():
        escaped.append("ESCAPED the host path was written")
    if probe.name in ("host-process-kill", "ptrace-outside"):
        if scene.host_process.poll() is not None:
            escaped.append("ESCAPED the host process died")
        status = Path(f"/proc/{scene.host_process.pid}/status").read_text()
        tracer = next(line for line in status.splitlines() if line.startswith("TracerPid:"))
        if tracer.split()[1] != "0":
            escaped.append(f"ESCAPED the host process is traced ({tracer})")
    if probe.name == "host-services" and scene.listener.accepted:
        escaped.append(f"ESCAPED the host listener accepted {scene.listener.accepted}")
    tried = escaped or any(line.startswith("DENIED") for line in lines)
    held = bool(tried) and not escaped
    report.outcomes.append(Outcome(platform_tier(platform), probe.name, probe.what, held, output))
    assert tried, f"probe {probe.name} did not run: {result}"
    assert not escaped, f"{probe.name} on {platform_tier(platform)}: {escaped} ({output})"
