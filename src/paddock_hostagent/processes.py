"""Managed processes (spec §12.2) on the internal API: ``/internal/v1/sandboxes/{id}/processes…``.

The guest agent owns the processes and their output rings (``guest/process.c``); this module turns the
routes into guest requests and the guest's answers into the contract's ``ProcessView``. Because the
guest keeps everything, a process outlives its client, this agent's restarts and any stream. A connect
stream is NDJSON: retained output after ``after``, live output, one ``exit`` frame, and a heartbeat
every ``HEARTBEAT_S`` while nothing else is sent.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import signal
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from paddock_hostagent import errors
from paddock_hostagent.drivers.runtime.ocispec import DEFAULT_PATH
from paddock_hostagent.guest import GuestError, GuestTooOldError, GuestUserError
from paddock_hostagent.guest.process_client import (
    GuestProcesses,
    GuestProcessNotFoundError,
    GuestProcessStateError,
    GuestSpawnError,
    ProcessExit,
    ProcessOutput,
    ProcessStream,
    StartRequest,
)
from paddock_hostagent.images import CommandAsked
from paddock_hostagent.routes import Manager
from paddock_hostagent.sandboxes import SandboxManager
from paddock_hostagent.schemas import (
    OkResult,
    ProcessFrame,
    ProcessInputBody,
    ProcessInputResult,
    ProcessList,
    ProcessResizeBody,
    ProcessSignalBody,
    ProcessStartBody,
    ProcessStreamBody,
    ProcessView,
)

HEARTBEAT_S = 5.0
DEFAULT_SHELL = ("bash", ["-l"])
MAX_WAIT_MS = 3_600_000
MAX_GRACE_MS = 600_000
MAX_INPUT_BYTES = 1 << 20

router = APIRouter(prefix="/internal/v1/sandboxes/{sandbox_id}/processes")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def view_of(doc: dict[str, Any]) -> ProcessView:
    """The guest's JSON (times in ms, signal numbers) as the contract's object."""
    signo = int(doc.get("signal_number") or 0)
    finished = doc.get("finished_at_ms")
    return ProcessView(
        process_id=doc["process_id"],
        kind=doc["kind"],
        pid=doc["pid"],
        state=doc["state"],
        leader_exited=doc["leader_exited"],
        tree_exited=doc["tree_exited"],
        created_at=_iso(int(doc["created_at_ms"])),
        finished_at=_iso(int(finished)) if finished is not None else None,
        exit_code=doc.get("exit_code"),
        signal=_signal_name(signo) if signo else None,
        cmd=doc["cmd"],
        args=doc["args"],
        cwd=doc["cwd"],
        foreground=doc.get("foreground"),
        output=doc["output"],
    )


def _signal_name(signo: int) -> str:
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"SIG{signo}"


@contextlib.contextmanager
def _guest_errors(sandbox_id: str, process_id: str = "") -> Iterator[None]:
    """The guest's refusals as this API's errors (one table, as ``_guest_file_errors`` does)."""
    try:
        yield
    except GuestProcessNotFoundError as exc:
        raise errors.ProcessNotFound(f"process {process_id} not found in sandbox {sandbox_id}") from exc
    except GuestProcessStateError as exc:
        raise errors.ProcessState(str(exc)) from exc
    except GuestSpawnError as exc:
        raise errors.SpawnFailed(str(exc)) from exc
    except GuestUserError as exc:
        raise errors.UnknownUser(f"user: {exc}") from exc
    except GuestTooOldError as exc:
        raise errors.UnsupportedOnTier(f"user: {exc}") from exc
    except GuestError as exc:
        raise errors.SandboxFailed(f"guest agent of {sandbox_id} failed: {exc}") from exc


class ProcessService:
    """The managed processes of the sandboxes of one ``SandboxManager``."""

    def __init__(self, manager: SandboxManager) -> None:
        self.manager = manager

    def _guest(self, sandbox_id: str) -> GuestProcesses:
        entry = self.manager.running_entry(sandbox_id)  # 404 unknown, 409 not running
        entry.touch()
        return GuestProcesses(self.manager.runtime.guest(entry.record))

    def _start_request(self, sandbox_id: str, body: ProcessStartBody) -> StartRequest:
        if body.cmd is None and body.pty is None:
            raise errors.BadRequest("cmd: required for a process without a pty")
        cmd, args = (body.cmd, body.args) if body.cmd is not None else DEFAULT_SHELL
        record = self.manager.entry(sandbox_id).record
        base = {"PATH": DEFAULT_PATH, "HOSTNAME": record.name, "LANG": "C.UTF-8"}
        if body.pty is not None:
            base["TERM"] = "xterm-256color"  # what every terminal emulator a client runs understands
        # A template's ENV, WORKDIR and USER apply as they do to ``exec`` (E2B's template envs and
        # workdir reach its commands too); as a user, without a directory: the user's home.
        run = self.manager.images.config(record.image).command(
            base,
            CommandAsked(cmd, list(args), body.env, body.cwd, body.user),
            self.manager.settings.default_cwd,
        )
        strings = [run.cmd, *run.args, *run.env, *run.env.values(), run.cwd, run.user or ""]
        if any("\0" in value for value in strings):
            raise errors.BadRequest("cmd, args, env and cwd may not contain NUL characters")
        pty = (body.pty.rows, body.pty.cols) if body.pty is not None else None
        return StartRequest(run.cmd, run.args, run.env, run.cwd, pty, run.user)

    async def start(self, sandbox_id: str, body: ProcessStartBody) -> ProcessView:
        guest = self._guest(sandbox_id)
        request = self._start_request(sandbox_id, body)
        with _guest_errors(sandbox_id):
            return view_of(await guest.start(request))

    async def list(self, sandbox_id: str) -> ProcessList:
        with _guest_errors(sandbox_id):
            doc = await self._guest(sandbox_id).list()
        return ProcessList(processes=[view_of(item) for item in doc["processes"]])

    async def get(self, sandbox_id: str, process_id: str) -> ProcessView:
        with _guest_errors(sandbox_id, process_id):
            return view_of(await self._guest(sandbox_id).get(process_id))

    async def kill(self, sandbox_id: str, process_id: str, grace_ms: int) -> ProcessView:
        with _guest_errors(sandbox_id, process_id):
            return view_of(await self._guest(sandbox_id).kill(process_id, grace_ms))

    async def input(self, sandbox_id: str, process_id: str, body: ProcessInputBody) -> ProcessInputResult:
        try:
            data = base64.b64decode(body.data_base64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise errors.BadRequest("data_base64: not valid base64") from exc
        if len(data) > MAX_INPUT_BYTES:
            raise errors.BadRequest(f"data_base64: at most {MAX_INPUT_BYTES} bytes per request")
        with _guest_errors(sandbox_id, process_id):
            doc = await self._guest(sandbox_id).input(process_id, data)
        return ProcessInputResult(input_seq=doc["input_seq"])

    async def stdin_close(self, sandbox_id: str, process_id: str) -> OkResult:
        with _guest_errors(sandbox_id, process_id):
            await self._guest(sandbox_id).stdin_close(process_id)
        return OkResult()

    async def resize(self, sandbox_id: str, process_id: str, body: ProcessResizeBody) -> ProcessView:
        with _guest_errors(sandbox_id, process_id):
            return view_of(await self._guest(sandbox_id).resize(process_id, body.rows or 0, body.cols or 0))

    async def signal(self, sandbox_id: str, process_id: str, body: ProcessSignalBody) -> ProcessView:
        signo = int(signal.Signals[body.signal])
        with _guest_errors(sandbox_id, process_id):
            return view_of(await self._guest(sandbox_id).signal(process_id, signo))

    async def wait(self, sandbox_id: str, process_id: str, *, tree: bool, timeout_ms: int) -> ProcessView:
        entry = self.manager.running_entry(sandbox_id)
        guest = GuestProcesses(self.manager.runtime.guest(entry.record))
        with _guest_errors(sandbox_id, process_id):
            return view_of(await guest.wait(process_id, tree=tree, timeout_ms=timeout_ms))

    async def connect(self, sandbox_id: str, process_id: str, after: int) -> ProcessStream:
        """Opens the stream (404/409 raised here, before any byte of the response)."""
        stream = self._guest(sandbox_id).connect(process_id, after)
        with _guest_errors(sandbox_id, process_id):
            await stream.__aenter__()
        return stream

    async def start_streaming(
        self, sandbox_id: str, body: ProcessStreamBody
    ) -> tuple[ProcessView, ProcessStream]:
        """Starts the process and opens its stream from its first output, stdin closed first when
        asked (one guest connection: ``GuestProcesses.start_streaming``). Errors are raised before any
        byte of the response."""
        guest = self._guest(sandbox_id)
        request = self._start_request(sandbox_id, body)
        with _guest_errors(sandbox_id):
            view, stream = await guest.start_streaming(request, close_stdin=body.close_stdin)
        return view_of(view), stream


async def frames(stream: ProcessStream, after: int) -> AsyncGenerator[ProcessFrame, None]:
    """The connect stream's frames, with a heartbeat whenever ``HEARTBEAT_S`` pass in silence."""
    oldest = int(stream.process["output"]["oldest_seq"])
    gap = oldest if oldest > after + 1 else None  # the requested range was already discarded
    events = aiter(stream)
    pending: asyncio.Task[ProcessOutput | ProcessExit] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=HEARTBEAT_S)
            if not done:
                yield ProcessFrame(type="heartbeat")
                continue
            finished, pending = pending, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                return
            except GuestError as exc:
                yield ProcessFrame(type="error", error=f"lost the process stream: {exc}")
                return
            if isinstance(event, ProcessOutput):
                data = base64.b64encode(event.data).decode()
                yield ProcessFrame(
                    type="data",
                    seq=event.seq,
                    stream=event.stream,
                    data_base64=data,
                    oldest_available_seq=gap,
                )
            else:
                signame = _signal_name(event.signal) if event.signal else None
                yield ProcessFrame(
                    type="exit", exit_code=event.exit_code, signal=signame, oldest_available_seq=gap
                )
                return
            gap = None
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        stream.close()


def service_of(manager: SandboxManager) -> ProcessService:
    return ProcessService(manager)


@router.post("")
async def start_process(sandbox_id: str, body: ProcessStartBody, manager: Manager) -> ProcessView:
    return await service_of(manager).start(sandbox_id, body)


@router.post("/stream", response_model=None)
async def start_streaming(sandbox_id: str, body: ProcessStreamBody, manager: Manager) -> StreamingResponse:
    """A start answered by the process's connect stream, led by a ``start`` frame holding its view.
    An agent from before this route answers 405 (``/{process_id}`` takes no POST): the caller then
    makes the three calls it stands for."""
    view, stream = await service_of(manager).start_streaming(sandbox_id, body)
    return _ndjson(stream, 0, lead=ProcessFrame(type="start", process=view))


@router.get("")
async def list_processes(sandbox_id: str, manager: Manager) -> ProcessList:
    return await service_of(manager).list(sandbox_id)


@router.get("/{process_id}")
async def get_process(sandbox_id: str, process_id: str, manager: Manager) -> ProcessView:
    return await service_of(manager).get(sandbox_id, process_id)


@router.delete("/{process_id}")
async def kill_process(
    sandbox_id: str,
    process_id: str,
    manager: Manager,
    grace_ms: Annotated[int, Query(ge=0, le=MAX_GRACE_MS)] = 5000,
) -> ProcessView:
    return await service_of(manager).kill(sandbox_id, process_id, grace_ms)


@router.get("/{process_id}/connect", response_model=None)
async def connect_process(
    sandbox_id: str, process_id: str, manager: Manager, after: Annotated[int, Query(ge=0)] = 0
) -> StreamingResponse:
    stream = await service_of(manager).connect(sandbox_id, process_id, after)
    return _ndjson(stream, after)


def _ndjson(stream: ProcessStream, after: int, *, lead: ProcessFrame | None = None) -> StreamingResponse:
    async def ndjson() -> AsyncIterator[bytes]:
        if lead is not None:
            yield lead.model_dump_json(exclude_none=True).encode() + b"\n"
        async for frame in frames(stream, after):
            yield json.dumps(frame.model_dump(exclude_none=True)).encode() + b"\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(ndjson(), media_type="application/x-ndjson", headers=headers)


@router.post("/{process_id}/input")
async def process_input(
    sandbox_id: str, process_id: str, body: ProcessInputBody, manager: Manager
) -> ProcessInputResult:
    return await service_of(manager).input(sandbox_id, process_id, body)


@router.post("/{process_id}/stdin/close")
async def close_stdin(sandbox_id: str, process_id: str, manager: Manager) -> OkResult:
    return await service_of(manager).stdin_close(sandbox_id, process_id)


@router.post("/{process_id}/resize")
async def resize_pty(
    sandbox_id: str, process_id: str, body: ProcessResizeBody, manager: Manager
) -> ProcessView:
    return await service_of(manager).resize(sandbox_id, process_id, body)


@router.post("/{process_id}/signal")
async def signal_process(
    sandbox_id: str, process_id: str, body: ProcessSignalBody, manager: Manager
) -> ProcessView:
    return await service_of(manager).signal(sandbox_id, process_id, body)


@router.get("/{process_id}/wait")
async def wait_process(
    sandbox_id: str,
    process_id: str,
    manager: Manager,
    scope: Annotated[str, Query(pattern="^(leader|tree)$")] = "leader",
    timeout_ms: Annotated[int, Query(ge=0, le=MAX_WAIT_MS)] = 30000,
) -> ProcessView:
    return await service_of(manager).wait(sandbox_id, process_id, tree=scope == "tree", timeout_ms=timeout_ms)
