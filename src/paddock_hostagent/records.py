"""Sandbox records on disk: one JSON file per sandbox in ``<state_dir>/sandboxes``, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import SandboxRecord

log = get_logger(__name__)


class RecordStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, sandbox_id: str) -> Path:
        return self.directory / f"{sandbox_id}.json"

    def save(self, record: SandboxRecord) -> None:
        tmp = self.directory / f".{record.id}.json.tmp"
        # No fsync: a host crash takes the sandboxes' processes with it anyway, and the rename keeps
        # the file whole against an agent crash.
        tmp.write_text(json.dumps(record.to_json(), indent=1))
        tmp.replace(self._path(record.id))

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
