"""The saved-state store of the VM tier (drivers/vm/vmsaved.py) on real files, without booting a VM.

A VM restored from a state is tested in tests/isolation/test_vm_saved_state.py (slow, QEMU); this
checks the store's promises fast: a state has a name only once whole, and one that is not whole, or
that no create can match any more, is removed instead of restored.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

from paddock_hostagent.drivers.vm.vmsaved import HOST_FIELDS, SavedKey, SavedStates

KEY = SavedKey(
    base_disk="base-abc-2048m.ext4",
    kernel="6.1.0-57-cloud-amd64",
    initramfs="initramfs-def.cpio.gz",
    mem_mib=512,
    vcpu=1,
    qemu="QEMU emulator version 7.2.22",
    machine="q35",
    accel="tcg",
    kernel_args="console=ttyS0 init_on_free=1",
)


def _saved(tmp_path: Path) -> tuple[SavedStates, Path]:
    store = SavedStates(tmp_path / "saved")
    building = store.building_dir(KEY)
    (building / "memory.state").write_bytes(os.urandom(256 * 1024))
    (building / "disk.qcow2").write_bytes(os.urandom(64 * 1024))
    assert store.load(KEY) is None  # still being written: no create can find it
    state = store.commit(KEY, building, "52:54:00:aa:bb:cc")
    assert not building.exists() and state.dir == store.path(KEY)
    return store, state.dir


def test_a_committed_state_loads_with_its_mac(tmp_path: Path) -> None:
    store, _ = _saved(tmp_path)
    loaded = SavedStates(store.root).load(KEY)  # another process: checksums verified from scratch
    assert loaded is not None and loaded.mac == "52:54:00:aa:bb:cc" and loaded.memory.is_file()
    assert SavedStates(store.root).load(replace(KEY, mem_mib=1024)) is None  # another shape: none


def test_a_truncated_state_is_removed_not_loaded(tmp_path: Path) -> None:
    store, directory = _saved(tmp_path)
    os.truncate(directory / "memory.state", 1000)
    assert store.load(KEY) is None
    assert not directory.exists()


def test_a_state_changed_in_place_fails_its_checksum(tmp_path: Path) -> None:
    store, directory = _saved(tmp_path)
    with open(directory / "disk.qcow2", "r+b") as file:
        first = file.read(1)
        file.seek(0)
        file.write(bytes([first[0] ^ 1]))
    # same size: a host agent that has not hashed this version of the file yet (after a restart, or
    # once the write moved its mtime) finds it changed
    assert SavedStates(store.root).load(KEY) is None
    assert not directory.exists()


def test_a_state_without_its_completion_record_is_removed(tmp_path: Path) -> None:
    store, directory = _saved(tmp_path)
    (directory / "meta.json").unlink()
    assert store.load(KEY) is None and not directory.exists()


def test_sweep_removes_leftover_builds_and_states_no_create_can_match(tmp_path: Path) -> None:
    store, directory = _saved(tmp_path)
    images = tmp_path / "images"
    images.mkdir()
    (images / KEY.base_disk).write_bytes(b"")
    leftover = store.building_dir(KEY)
    other_kernel = replace(KEY, kernel="6.12.0-1-cloud-amd64", mem_mib=2048)
    old = store.path(other_kernel)
    old.mkdir()
    (old / "meta.json").write_text(json.dumps({"key": asdict(other_kernel)}))
    gone_image = replace(KEY, base_disk="base-gone-2048m.ext4", mem_mib=4096)
    orphan = store.path(gone_image)
    orphan.mkdir()
    (orphan / "meta.json").write_text(json.dumps({"key": asdict(gone_image)}))

    store.sweep({name: getattr(KEY, name) for name in HOST_FIELDS}, images)

    assert sorted(path.name for path in store.root.iterdir()) == [directory.name]
    assert not leftover.exists() and not old.exists() and not orphan.exists()
    assert store.load(KEY) is not None
