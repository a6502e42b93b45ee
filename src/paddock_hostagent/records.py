"""Sandbox records on disk: one JSON file per sandbox in ``<state_dir>/sandboxes``, written atomically,
readable by the agent's user only (0600 in a 0700 directory)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from paddock_core import statefiles
from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import SandboxRecord

log = get_logger(__name__)


class RecordStore:
    def __init__(self, directory: Path) -> None:
        self.directory = statefiles.private_dir(directory)
        os.chmod(directory, statefiles.DIR_MODE)  # ours alone, also when an older version made it 0755

    def _path(self, sandbox_id: str) -> Path:
        return self.directory / f"{sandbox_id}.json"

    def save(self, record: SandboxRecord, *, durable: bool = False) -> None:
        """Writes the record whole (temp file + rename). No fsync by default: a host crash takes the
        sandboxes' processes with it anyway, and the rename keeps the file whole against an agent crash.
        ``durable``: on disk before this returns (file and directory synced), for a record that must
        outlive a host crash too: a hibernation's commit and its wake's, after which the disk the
        previous record named is removed."""
        tmp = self.directory / f".{record.id}.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, statefiles.FILE_MODE)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record.to_json(), indent=1))
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, statefiles.FILE_MODE)  # also when a stale tmp file existed with another mode
        tmp.replace(self._path(record.id))
        if durable:
            directory = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def delete(self, sandbox_id: str) -> None:
        self._path(sandbox_id).unlink(missing_ok=True)

    def load_all(self) -> list[SandboxRecord]:
        records: list[SandboxRecord] = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                records.append(SandboxRecord.from_json(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("unreadable_sandbox_record", path=str(path), error=str(exc))
        return records
