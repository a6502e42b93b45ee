"""Small pure pieces of the host agent: cgroup placement, CPU quotas, addresses, OCI config, settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from paddock_hostagent.app import create_app
from paddock_hostagent.drivers.base import CapacityError, RuntimeState, SandboxRecord, Shape
from paddock_hostagent.drivers.net.network import AddressAllocator, host_nameservers
from paddock_hostagent.drivers.runtime.cgroups import CgroupLayout, SandboxCgroup
from paddock_hostagent.drivers.runtime.ocispec import BundleSpec, cpu_quota_us, runtime_config
from paddock_hostagent.host import (
    FAVORDYNMODS,
    INOTIFY_FLOORS,
    XFS_LOG_WORKER_CENTISECS,
    XFS_LOG_WORKER_SETTING,
    _raise_inotify_limits,
    cgroup2_mounts_to_favour,
    hurry_xfs_log_worker,
    prepare_machine,
)
from paddock_hostagent.settings import HostAgentSettings

PROC_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
1:cpu:/
0::/
"""


def test_sandbox_cgroups_go_under_the_agents_memory_cgroup(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text(PROC_CGROUP)
    layout = CgroupLayout.discover(proc)
    assert layout.own_paths["memory"] == "/process_api/abc"
    assert layout.sandbox_path("sb-1") == "/process_api/abc/paddock/sb-1"
    assert CgroupLayout.discover(proc, tag="t1").sandbox_path("sb-1") == "/process_api/abc/paddock-t1/sb-1"
    proc.write_text("4:memory:/\n1:cpu:/\n")
    assert CgroupLayout.discover(proc).sandbox_path("sb-1") == "/paddock/sb-1"


def test_prune_removes_only_empty_groups_the_runtime_fabricated(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/process_api/abc\n8:pids:/\n")
    root = tmp_path / "fs"
    for hierarchy in ("memory", "pids"):
        (root / hierarchy / "process_api" / "abc" / "paddock-t1").mkdir(parents=True)
    (root / "pids" / "process_api" / "other").mkdir()  # someone else's, not empty-chain of ours
    layout = CgroupLayout.discover(proc, root=root, tag="t1")
    layout.prune(ancestors=True)
    assert not (root / "memory" / "process_api" / "abc" / "paddock-t1").exists()
    assert (root / "memory" / "process_api" / "abc").is_dir()  # the agent's own group stays
    assert not (root / "pids" / "process_api" / "abc").exists()  # fabricated by the runtime: gone
    assert (root / "pids" / "process_api" / "other").is_dir()  # not ours, and /process_api not empty


def test_a_group_being_removed_reads_as_empty(tmp_path: Path) -> None:
    """While a destroy removes a sandbox's group, its files can fail to open with ENODEV; a listing of
    the host's sandboxes reads them and answered 500. A file that fails to open with another error than
    "missing" stands in for one here (a directory where the file was)."""
    group = SandboxCgroup("/paddock-t1/sb-1", root=tmp_path)
    for hierarchy, name in (
        ("memory", "memory.oom_control"),
        ("memory", "memory.usage_in_bytes"),
        ("pids", "cgroup.procs"),
        ("freezer", "freezer.state"),
    ):
        (group.dir(hierarchy) / name).mkdir(parents=True)
    assert group.oom_kills() == 0
    assert group.memory_usage_bytes() == 0
    assert group.pids() == []
    assert not group.is_frozen()


def test_cpu_quota_is_a_percent_of_one_cpu_or_whole_vcpus() -> None:
    assert cpu_quota_us(Shape(vcpu=1, mem_mib=512, disk_mib=1024, cpu_quota_pct=25)) == 25_000
    assert cpu_quota_us(Shape(vcpu=1, mem_mib=512, disk_mib=1024, cpu_quota_pct=None)) == 100_000
    assert cpu_quota_us(Shape(vcpu=4, mem_mib=512, disk_mib=1024, cpu_quota_pct=None)) == 400_000


def test_runtime_config_carries_the_shape_and_namespaces() -> None:
    spec = BundleSpec(
        hostname="brave-otter",
        shape=Shape(vcpu=2, mem_mib=1024, disk_mib=10240, cpu_quota_pct=50),
        cgroups_path="/x/paddock/sb-1",
        netns_path=Path("/run/netns/pdk-1"),
        guest_binary=Path("/state/guest/paddock-guest"),
    )
    config = runtime_config(spec)
    assert config["hostname"] == "brave-otter"
    resources = config["linux"]["resources"]
    assert resources["memory"]["limit"] == 1024 << 20
    assert resources["cpu"] == {"quota": 50_000, "period": 100_000}
    namespaces = {ns["type"]: ns.get("path") for ns in config["linux"]["namespaces"]}
    assert namespaces == {
        "pid": None,
        "ipc": None,
        "uts": None,
        "mount": None,
        "cgroup": None,
        "network": "/run/netns/pdk-1",
    }
    denied = {name for rule in config["linux"]["seccomp"]["syscalls"] for name in rule["names"]}
    assert {"mount", "kexec_load", "ptrace", "init_module", "bpf", "unshare"} <= denied
    assert "CAP_SYS_ADMIN" not in config["process"]["capabilities"]["bounding"]


def test_addresses_are_unique_persistent_and_finite(tmp_path: Path) -> None:
    allocator = AddressAllocator("10.9.0.0/29", tmp_path)
    assert allocator.gateway == "10.9.0.1"
    first = allocator.allocate("a")
    assert first == "10.9.0.2"
    again = AddressAllocator("10.9.0.0/29", tmp_path)  # a restarted agent
    taken = [again.allocate(owner) for owner in "bcde"]
    assert first not in taken and len(set(taken)) == 4
    with pytest.raises(CapacityError):
        again.allocate("f")
    again.release(first)
    assert again.allocate("g") == first


def test_host_nameservers_skip_loopback(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.53\nnameserver 10.1.2.3\nsearch example\n")
    assert host_nameservers(resolv) == ["10.1.2.3"]


def test_records_survive_a_json_round_trip() -> None:
    record = SandboxRecord(
        id="sb-1", name="n", image="debian:13", vcpu=1, mem_mib=512, disk_mib=2048, cpu_quota_pct=None,
        ip="10.0.0.2", state=RuntimeState.PAUSED, driver="oci", driver_state={"slot": {"id": "ab"}},
    )  # fmt: skip
    assert SandboxRecord.from_json(record.to_json()) == record
    assert record.to_json()["state"] == "paused"


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PADDOCK_HOST_TOKEN", "s3cret-token-value")
    monkeypatch.setenv("PADDOCK_HOST_LABELS", '{"zone": "a"}')
    monkeypatch.setenv("PADDOCK_HOST_IMAGE_MIRRORS", '{"alpine:3.20": "http://mirror/alpine.tar.gz"}')
    settings = HostAgentSettings()
    assert settings.token.get_secret_value() == "s3cret-token-value"
    assert settings.labels == {"zone": "a"}
    assert settings.image_mirrors["alpine:3.20"].endswith(".tar.gz")
    assert settings.advertised_url == "http://127.0.0.1:8081"
    with pytest.raises(ValidationError):
        HostAgentSettings(subnet="10.0.0.0/30")


def test_the_app_refuses_a_placeholder_token() -> None:
    with pytest.raises(ValueError, match="placeholder"):
        create_app(HostAgentSettings(token=SecretStr("changeme")))


def test_the_host_inotify_limits_are_raised_to_their_floors_and_never_lowered(tmp_path: Path) -> None:
    """Tenants' root shares root's inotify counts on the container tiers: a start raises Debian's 128
    instances to the floor, and keeps an operator's higher watch limit as it is."""
    (tmp_path / "max_user_instances").write_text("128\n")
    (tmp_path / "max_user_watches").write_text("4000000\n")
    _raise_inotify_limits(tmp_path)
    assert int((tmp_path / "max_user_instances").read_text()) == INOTIFY_FLOORS["max_user_instances"] == 8192
    assert int((tmp_path / "max_user_watches").read_text()) == 4000000


def test_the_xfs_log_worker_is_hurried_to_each_second_and_a_shorter_interval_kept(tmp_path: Path) -> None:
    """The kernel's 30 s becomes 1 s; an operator's shorter interval stays; a host without the setting
    (no XFS) starts all the same."""
    setting = tmp_path / "xfssyncd_centisecs"
    setting.write_text("3000\n")
    hurry_xfs_log_worker(setting)
    assert int(setting.read_text()) == XFS_LOG_WORKER_CENTISECS == 100
    setting.write_text("100\n")
    hurry_xfs_log_worker(setting)
    assert setting.read_text() == "100\n"
    hurry_xfs_log_worker(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


MOUNTS = """\
cgroup /sys/fs/cgroup/pids cgroup rw,nosuid,nodev,noexec,relatime,pids 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0
cgroup2 /srv/cg\\040two cgroup2 rw,relatime,nsdelegate 0 0
cgroup2 /sys/fs/cgroup/already cgroup2 rw,relatime,favordynmods 0 0
tmpfs /run tmpfs rw,nosuid,nodev,mode=755 0 0
"""


def test_only_cgroup2_mounts_without_favordynmods_are_remounted() -> None:
    """The v1 hierarchies and other filesystems are left alone, a mount already favouring is not
    remounted again, and an escaped space in a mount point is a space."""
    assert cgroup2_mounts_to_favour(MOUNTS) == ["/sys/fs/cgroup/unified", "/srv/cg two"]


def test_a_start_leaves_every_cgroup2_mount_of_the_host_favouring_cgroup_moves() -> None:
    """On this host (hybrid: v1 controllers, a cgroup2 mount beside them): after the agent's host set-up,
    every cgroup2 mount has ``favordynmods``, so moving a sandbox's first process into its cgroups waits
    for no RCU grace period (docs/performance.md), and XFS's log worker runs each second; a second start
    changes nothing."""
    mounts = Path("/proc/self/mounts")
    cgroup2 = [line for line in mounts.read_text().splitlines() if line.split()[2:3] == ["cgroup2"]]
    assert cgroup2, "this host has no cgroup2 mount to favour"
    prepare_machine("auto")
    assert cgroup2_mounts_to_favour(mounts.read_text()) == []
    assert int(XFS_LOG_WORKER_SETTING.read_text()) <= XFS_LOG_WORKER_CENTISECS
    options = [line.split()[3].split(",") for line in mounts.read_text().splitlines() if " cgroup2 " in line]
    assert options and all(FAVORDYNMODS in each for each in options)
    prepare_machine("auto")
    assert cgroup2_mounts_to_favour(mounts.read_text()) == []
