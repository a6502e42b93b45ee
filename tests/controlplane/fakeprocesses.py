"""The managed-process half of ``FakeHostLink``: processes as records, nothing runs.

Enough for the control plane's own logic (routing, validation, errors, envelopes); what processes
really do is tested against real sandboxes in tests/terminals.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import AsyncGenerator

from paddock_controlplane.hosts import hostlink
from paddock_core import errors
from paddock_hostagent.schemas import (
    ProcessFrame,
    ProcessInputResult,
    ProcessList,
    ProcessOutputRange,
    ProcessResizeBody,
    ProcessSignalBody,
    ProcessStartBody,
    ProcessStreamBody,
    ProcessView,
)


class FakeProcesses:
    def __init__(self) -> None:
        self.processes: dict[str, dict[str, ProcessView]] = {}
        self.inputs: dict[str, bytes] = {}
        self._pids = itertools.count(100)
        self.processes_host_down = False  # every process call fails as an unreachable host does

    def _find(self, sandbox_id: str, process_id: str) -> ProcessView:
        if self.processes_host_down:
            raise hostlink.HostError("connection refused")
        found = self.processes.get(sandbox_id, {}).get(process_id)
        if found is None:
            raise errors.NotFound("process not found")
        return found

    def _end(self, sandbox_id: str, process_id: str, signame: str) -> ProcessView:
        view = self._find(sandbox_id, process_id).model_copy(
            update={
                "state": "exited",
                "leader_exited": True,
                "tree_exited": True,
                "exit_code": 128 + int(signal.Signals[signame]),
                "signal": signame,
                "finished_at": "2026-01-01T00:00:01.000Z",
            }
        )
        self.processes[sandbox_id][process_id] = view
        return view

    async def start_streaming(
        self, sandbox_id: str, body: ProcessStreamBody
    ) -> tuple[ProcessView, AsyncGenerator[ProcessFrame, None]] | None:
        """As a host agent from before the streamed start answers: the caller makes the three calls
        (the streamed start itself runs against real agents in tests/e2b)."""
        return None

    async def start_process(self, sandbox_id: str, body: ProcessStartBody) -> ProcessView:
        if self.processes_host_down:
            raise hostlink.HostError("connection refused")
        pid = next(self._pids)
        view = ProcessView(
            process_id=f"proc_{pid:016x}",
            kind="pty" if body.pty else "process",
            pid=pid,
            state="running",
            leader_exited=False,
            tree_exited=False,
            created_at="2026-01-01T00:00:00.000Z",
            cmd=body.cmd or "bash",
            args=body.args if body.cmd else ["-l"],
            cwd=body.cwd or "/root",
            output=ProcessOutputRange(oldest_seq=0, newest_seq=0, bytes=0),
        )
        self.processes.setdefault(sandbox_id, {})[view.process_id] = view
        return view

    async def list_processes(self, sandbox_id: str) -> ProcessList:
        return ProcessList(processes=list(self.processes.get(sandbox_id, {}).values()))

    async def get_process(self, sandbox_id: str, process_id: str) -> ProcessView:
        return self._find(sandbox_id, process_id)

    async def kill_process(self, sandbox_id: str, process_id: str, grace_ms: int) -> ProcessView:
        return self._end(sandbox_id, process_id, "SIGTERM" if grace_ms else "SIGKILL")

    async def process_input(self, sandbox_id: str, process_id: str, data_base64: str) -> ProcessInputResult:
        self._find(sandbox_id, process_id)
        self.inputs[process_id] = self.inputs.get(process_id, b"") + data_base64.encode()
        return ProcessInputResult(input_seq=len(self.inputs[process_id]))

    async def close_process_stdin(self, sandbox_id: str, process_id: str) -> None:
        self._find(sandbox_id, process_id)

    async def resize_process(self, sandbox_id: str, process_id: str, body: ProcessResizeBody) -> ProcessView:
        view = self._find(sandbox_id, process_id)
        if view.kind != "pty":
            raise errors.InvalidState(f"process {process_id} has no terminal to resize")
        return view

    async def signal_process(self, sandbox_id: str, process_id: str, body: ProcessSignalBody) -> ProcessView:
        return self._end(sandbox_id, process_id, body.signal)

    async def wait_process(
        self, sandbox_id: str, process_id: str, *, scope: str, timeout_ms: int
    ) -> ProcessView:
        return self._find(sandbox_id, process_id)

    async def connect_process(
        self, sandbox_id: str, process_id: str, after: int
    ) -> AsyncGenerator[ProcessFrame, None]:
        view = self._find(sandbox_id, process_id)

        async def frames() -> AsyncGenerator[ProcessFrame, None]:
            yield ProcessFrame(type="data", seq=after + 1, stream="stdout", data_base64="aGkK")
            if view.state == "exited":
                yield ProcessFrame(type="exit", exit_code=view.exit_code, signal=view.signal)

        return frames()
