"""The hardening probes, run from a Dockerfile's RUN step: a build is untrusted code exactly like a
sandbox, and must not reach the host's services on any host address, another tenant's sandbox, the
builder's own state and secrets, raw sockets, mounts or kernel settings.

One template whose single RUN step runs every probe and prints ``name=result``; the step always exits 0,
so the build ends ``ready`` and the test reads the results from its log. The host side (listeners on
every host address and on the metadata address, a listener inside another sandbox's namespace) records
whatever reached it, which must be nothing. Reuses ``tests/security``'s listeners and namespace helpers.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.live import LivePlatform
from tests.security.network_support import METADATA_ADDRESS, HostListener, sandbox_netns, socket_in
from tests.security.test_network_probes import listeners
from tests.templates.test_live_templates import frames_of, sh, wait_done

__all__ = ["listeners"]

pytestmark = [pytest.mark.root, pytest.mark.slow]

CAP_NET_RAW = 13
CAP_SYS_ADMIN = 21
CAP_NET_ADMIN = 12
CAP_SYS_MODULE = 16


@pytest.fixture(scope="module")
def http(live: LivePlatform) -> Iterator[httpx.Client]:
    with live.http(live.api_key("pro"), timeout=600) as client:
        yield client


@pytest.fixture
def other_tenant(live: LivePlatform) -> Iterator[tuple[str, socket.socket]]:
    """Another user's running sandbox, with a TCP listener inside its network namespace."""
    with live.http(live.api_key("pro")) as other:
        sandbox = other.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "debian:13"}).json()[
            "data"
        ]
        try:
            address = sh(other, sandbox["id"], "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1")
            netns, _ = sandbox_netns(live.agents[0].record(sandbox["id"]))
            server = socket_in(netns, socket.AF_INET, socket.SOCK_STREAM)
            server.bind(("0.0.0.0", 0))
            server.listen(8)
            server.setblocking(False)
            try:
                yield f"{address['stdout'].strip()}:{server.getsockname()[1]}", server
            finally:
                server.close()
        finally:
            other.delete(f"/v1/sandboxes/{sandbox['id']}")


def probe_script(targets: dict[str, str], state_dirs: list[str]) -> str:
    """One shell script: every probe prints ``name=result`` on its own line."""
    lines = ["set +e", "gw=$(ip route | awk '/default/ {print $3}')"]
    for name, url in targets.items():
        lines.append(f'curl -s -o /dev/null -m 3 "{url}"; echo "dial_{name}=$?"')
    raw = (
        "use Socket; for my $t ([PF_INET, SOCK_RAW, 17], [17, SOCK_RAW, 768]) {"
        ' if (socket(my $s, $t->[0], $t->[1], $t->[2])) { print "raw=opened\\n" } else { print "raw=$!\\n" } }'
    )
    lines += [
        f"perl -e '{raw}'",
        'mount -t tmpfs none /mnt 2>/dev/null; echo "mount_tmpfs=$?"',
        'mount -t proc proc /mnt 2>/dev/null; echo "mount_proc=$?"',
        'echo 1 2>/dev/null > /proc/sys/net/ipv4/ip_forward; echo "sysctl_write=$?"',
        'ip link add x type veth peer name y 2>/dev/null; echo "ip_link_add=$?"',
        "echo \"capeff=$(awk '/^CapEff/ {print $2}' /proc/self/status)\"",
        "echo \"pids_visible=$(ls /proc | grep -c '^[0-9]')\"",
        'test -e /var/lib/paddock; echo "var_lib_paddock=$?"',
    ]
    for index, path in enumerate(state_dirs):
        lines.append(f'ls "{path}" >/dev/null 2>&1; echo "state_dir_{index}=$?"')
    return "; ".join(lines)


def results_of(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isalnum() and " " not in key:
            out.setdefault(key, []).append(value)
    return out


def test_run_steps_reach_no_host_service_tenant_state_raw_socket_or_mount(
    http: httpx.Client,
    live: LivePlatform,
    listeners: dict[str, HostListener],
    other_tenant: tuple[str, socket.socket],
) -> None:
    host_ip = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()[0]
    agent = live.agents[0]
    cp_port = live.url.rsplit(":", 1)[1].strip("/")
    any4 = listeners["any4"].port
    targets = {
        "host_gateway": f"http://$gw:{any4}/",
        "host_address": f"http://{host_ip}:{any4}/",
        "host_loopback_via_gateway_cp": f"http://$gw:{cp_port}/v1/rootfs",
        "host_address_agent": f"http://{host_ip}:{agent.port}/",
        "metadata": f"http://{METADATA_ADDRESS}:{listeners['metadata'].port}/",
        "metadata_any": f"http://{METADATA_ADDRESS}:{any4}/",
        "other_sandbox": f"http://{other_tenant[0]}/",
    }
    state_dirs = [str(agent.state_dir), str(live.controlplane.state_dir), "/var/lib/paddock"]
    dockerfile = f"FROM debian:13\nRUN {probe_script(targets, state_dirs)}\n"
    created = http.post("/v1/templates", json={"name": "escape-probes", "dockerfile": dockerfile})
    assert created.status_code == 200, created.text
    template_id = created.json()["data"]["id"]
    try:
        done = wait_done(http, template_id)
        lines = [
            frame.get("line", "") for frame in frames_of(http.get(f"/v1/templates/{template_id}/logs").text)
        ]
        assert done["status"] == "ready", lines
        found = results_of(lines)
        for name in targets:
            codes = found.get(f"dial_{name}")
            # 7: refused, 28: timed out — the connection was tried and stopped (not a bad URL).
            assert codes and codes[0] in ("7", "28"), f"{name}: curl exited {codes} {lines}"
        assert found["raw"] == ["Operation not permitted"] * 2, found.get("raw")
        for name in ("mount_tmpfs", "mount_proc", "sysctl_write", "ip_link_add", "var_lib_paddock"):
            assert found[name][0] != "0", f"{name}: {found[name]}"
        capabilities = int(found["capeff"][0], 16)
        for bit in (CAP_NET_RAW, CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SYS_MODULE):
            assert not capabilities & (1 << bit), f"capability {bit} held: {found['capeff']}"
        assert int(found["pids_visible"][0]) < 10, "the RUN step sees the host's processes"
        for index in range(len(state_dirs)):
            assert found[f"state_dir_{index}"][0] != "0", f"{state_dirs[index]} readable from a RUN step"
        # Nothing reached the host or the other tenant.
        assert {name: item.accepted for name, item in listeners.items()} == {name: [] for name in listeners}
        with pytest.raises(BlockingIOError):
            other_tenant[1].accept()
    finally:
        http.delete(f"/v1/templates/{template_id}")
