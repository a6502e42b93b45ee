"""The VM tier's snapshot store (drivers/vm/vmsnapshots.py) on real files, without booting a VM, and the
control plane's tier refusal for snapshots.

A VM snapshot booted twice is tested in tests/isolation/test_vm_snapshots.py (slow, QEMU); this checks
fast that a half-written VM snapshot is never offered: not while it is written, not after a crash left
it, not when a file is short or its record is missing; and that an agent's start removes what a crash
left and names the source the dead agent had stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from paddock_controlplane.records.models import Host
from paddock_controlplane.resources import snapshots, volumes
from paddock_hostagent.drivers.vm.qemu import QemuOptions, QemuRuntime
from paddock_hostagent.drivers.vm.vmsnapshots import PARTIAL_PREFIX, RESUME_MARKER, VmSnapshots

META = {"image": "debian:13", "disk_mib": 2048, "mem_mib": 384, "vcpu": 1, "base_disk": "base-x.ext4"}


def _write(partial: Path) -> None:
    (partial / "memory.state").write_bytes(os.urandom(128 * 1024))
    (partial / "disk.qcow2").write_bytes(os.urandom(32 * 1024))


def _runtime(state_dir: Path) -> QemuRuntime:
    # snapshot_info reads only the store: no network, kernel or QEMU is touched
    return QemuRuntime(QemuOptions(state_dir=state_dir, guest_binary=Path("/nonexistent"), network=None))  # type: ignore[arg-type]


def test_a_snapshot_being_written_or_left_by_a_crash_is_never_offered(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    store = runtime.snapshots
    partial = store.partial_dir("snap_a1")
    (partial / RESUME_MARKER).write_text("sb-source")
    _write(partial)
    # even with a record beside its files, a partial snapshot has no id's name: nothing finds it
    (partial / "meta.json").write_text(json.dumps({**META, "files": {}}))
    assert store.load("snap_a1") is None and runtime.snapshot_info("snap_a1") is None
    assert runtime.snapshot_info(f"{PARTIAL_PREFIX}snap_a1") is None
    assert runtime.snapshot_info("../snapshots/snap_a1") is None

    # the next agent's start removes it and learns which source it had stopped for the copy
    assert store.sweep() == ["sb-source"]
    assert not partial.exists() and list(store.root.iterdir()) == []


def test_a_committed_snapshot_is_offered_whole_and_not_once_a_file_is_short(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    store = runtime.snapshots
    partial = store.partial_dir("snap_b2")
    (partial / RESUME_MARKER).write_text("sb-source")
    _write(partial)
    snap = store.commit("snap_b2", partial, META)
    assert not partial.exists() and not (snap.dir / RESUME_MARKER).exists()
    info = runtime.snapshot_info("snap_b2")
    assert info is not None
    assert (info.image, info.disk_mib, info.path) == ("debian:13", 2048, snap.dir / "disk.qcow2")
    assert info.size_bytes >= 160 * 1024
    with pytest.raises(FileExistsError):
        store.commit("snap_b2", store.partial_dir("snap_b2"), META)

    os.truncate(snap.memory, 4096)  # a memory file cut short would restore a broken machine
    assert runtime.snapshot_info("snap_b2") is None

    partial = store.partial_dir("snap_c3")
    _write(partial)
    snap = store.commit("snap_c3", partial, META)
    (snap.dir / "meta.json").unlink()
    assert runtime.snapshot_info("snap_c3") is None


def test_a_deleted_snapshot_is_gone_and_a_delete_cut_short_never_boots(tmp_path: Path) -> None:
    store = VmSnapshots(tmp_path / "snapshots")
    partial = store.partial_dir("snap_d4")
    _write(partial)
    store.commit("snap_d4", partial, META)
    assert store.delete("snap_d4") and store.load("snap_d4") is None
    assert not store.delete("snap_d4") and not store.delete("../snap_d4")
    assert list(store.root.iterdir()) == []
    with pytest.raises(ValueError, match="not a snapshot id"):
        store.partial_dir("snap_../x")


def test_the_control_plane_lets_every_tier_snapshot_and_refuses_an_unknown_runtime() -> None:
    vm = Host(labels={"paddock.io/isolation": "vm", "paddock.io/runtime": "qemu"})
    gvisor = Host(labels={"paddock.io/isolation": "gvisor", "paddock.io/runtime": "runsc"})
    other = Host(labels={"paddock.io/isolation": "microvm", "paddock.io/runtime": "firecracker"})
    assert snapshots._tier_refusal(vm) is None and snapshots._tier_refusal(gvisor) is None
    assert snapshots._tier_refusal(other) == (
        "snapshotting a sandbox's disk is not supported on the microvm isolation tier (firecracker)"
        "; the container (crun, runc), gVisor and VM tiers take snapshots"
    )
    # what the VM tier does not offer is still refused: a live volume attach (volumes at create are drives)
    assert volumes.tier_refusal(vm) is None
    assert "vm isolation tier" in (volumes.live_refusal(vm) or "")
