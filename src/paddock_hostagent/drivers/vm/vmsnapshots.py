"""VM snapshots on this host: a sandbox's disk and memory at one instant, kept until deleted.

    store = VmSnapshots(<state_dir>/vm/snapshots)
    partial = store.partial_dir(snapshot_id)      # the driver writes memory.state and disk.qcow2 here
    store.commit(snapshot_id, partial, meta)      # sizes into meta.json, synced, then renamed into place
    store.load(snapshot_id)                       # the whole snapshot, or None

A snapshot lives in ``<root>/<snap id>/``:

    memory.state   QEMU's migration stream of the source (``migrate "exec:cat > …"``), as vmsaved.py's
    disk.qcow2     the source's overlay at that instant (backed by the image's ext4 under vm/images)
    meta.json      what a restore needs and must match (image, shape, MAC of the device state, the
                   host's kernel, initramfs, QEMU, machine, accelerator), and each file's size; written last

It is written in ``.partial-<id>/`` and renamed to its id only once ``meta.json`` is written and synced,
so a directory with an id for a name is whole; ``load`` also checks each file's size against
``meta.json``. A partial directory is never loaded, and ``sweep`` (a host agent's start) removes it,
after telling the driver which source the dead agent had stopped for the copy (``RESUME_MARKER``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddock_hostagent.drivers.vm.vmsaved import FILES, fsync_path, read_meta, write_meta

PARTIAL_PREFIX = ".partial-"
#: In a snapshot being written: the id of its source, stopped for the copy by this agent.
RESUME_MARKER = "resume-source"
#: The ids the host agent's API accepts (schemas.SNAPSHOT_ID_PATTERN); a path part, and a word in
#: QEMU's ``exec:`` URI, so nothing else is ever used as one.
SNAPSHOT_ID = re.compile(r"^snap_[A-Za-z0-9]{1,64}$")


@dataclass(frozen=True)
class VmSnapshot:
    id: str
    dir: Path
    meta: dict[str, Any]

    @property
    def memory(self) -> Path:
        return self.dir / "memory.state"

    @property
    def disk(self) -> Path:
        return self.dir / "disk.qcow2"

    @property
    def size_bytes(self) -> int:
        """The blocks its files hold on the host (a reflinked disk counted whole)."""
        total = 0
        for name in FILES:
            with contextlib.suppress(OSError):
                total += os.stat(self.dir / name).st_blocks * 512
        return total


class VmSnapshots:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, snapshot_id: str) -> Path:
        if not SNAPSHOT_ID.match(snapshot_id):
            raise ValueError(f"not a snapshot id: {snapshot_id!r}")
        return self.root / snapshot_id

    def partial_dir(self, snapshot_id: str) -> Path:
        """A fresh, empty directory to write ``snapshot_id`` into (an earlier partial one is removed)."""
        directory = self.root / f"{PARTIAL_PREFIX}{self.path(snapshot_id).name}"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        return directory

    def load(self, snapshot_id: str) -> VmSnapshot | None:
        """The snapshot if it is whole: named by its id, its meta.json readable, each file there with
        the size meta.json gives. None otherwise (also for any name that is not an id)."""
        if not SNAPSHOT_ID.match(snapshot_id):
            return None
        directory = self.root / snapshot_id
        try:
            meta = read_meta(directory)
            for name in FILES:
                if (directory / name).stat().st_size != meta["files"][name]["size"]:
                    return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return VmSnapshot(snapshot_id, directory, meta)

    def commit(self, snapshot_id: str, partial: Path, meta: dict[str, Any]) -> VmSnapshot:
        """Seals what the driver wrote into ``partial``: the files' sizes into ``meta``, the files and
        meta.json synced, then the directory renamed to the snapshot's id."""
        target = self.path(snapshot_id)
        if target.exists():
            raise FileExistsError(f"snapshot {snapshot_id} exists")
        meta = {**meta, "files": {}}
        for name in FILES:
            path = partial / name
            meta["files"][name] = {"size": path.stat().st_size}
            fsync_path(path)
        (partial / RESUME_MARKER).unlink(missing_ok=True)
        write_meta(partial, meta)
        os.rename(partial, target)
        fsync_path(self.root)
        return VmSnapshot(snapshot_id, target, meta)

    def delete(self, snapshot_id: str) -> bool:
        """Removes a whole snapshot (renamed to a partial first: a delete cut short leaves a partial,
        never a snapshot without its memory); whether it was here."""
        if not SNAPSHOT_ID.match(snapshot_id):
            return False
        directory = self.root / snapshot_id
        doomed = self.root / f"{PARTIAL_PREFIX}{snapshot_id}"
        shutil.rmtree(doomed, ignore_errors=True)
        try:
            os.rename(directory, doomed)
        except FileNotFoundError:
            return False
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def sweep(self) -> list[str]:
        """Removes the partial snapshots an agent left (killed half-way through a snapshot or a delete);
        returns the ids of the sources such a snapshot had stopped for its copy."""
        stopped: list[str] = []
        for entry in sorted(self.root.glob(f"{PARTIAL_PREFIX}*")) if self.root.is_dir() else []:
            with contextlib.suppress(OSError, UnicodeDecodeError), open(entry / RESUME_MARKER, "rb") as file:
                stopped.append(file.read(200).decode().strip())
            shutil.rmtree(entry, ignore_errors=True)
        return stopped
