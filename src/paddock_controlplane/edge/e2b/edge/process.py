"""envd's ``process.Process`` service (e2b-dev/infra ``packages/envd/spec/process/process.proto``) on
Paddock's process manager (``processes``: the guest agent owns the processes and their output).

E2B names a process by its pid or by a tag; Paddock by its ``process_id``. The pid is found in the
sandbox's process list; tags live here, per sandbox, for as long as their process runs (bounded).
``Start`` and ``Connect`` turn the process's connect stream (``ProcessFrame``) into envd's events:
``start`` (the pid), ``data`` (stdout/stderr/pty, base64 as proto JSON's bytes), ``keepalive`` and ``end``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from paddock_controlplane.edge.e2b.edge.connect import ConnectError
from paddock_controlplane.edge.e2b.edge.context import DEFAULT_USER, Call, mapped
from paddock_controlplane.records import validation
from paddock_controlplane.sandboxes import envs, processes
from paddock_controlplane.sandboxes.activity import Inflight
from paddock_core import errors
from paddock_hostagent.schemas import (
    ProcessFrame,
    ProcessPty,
    ProcessResizeBody,
    ProcessSignalBody,
    ProcessStartBody,
    ProcessStreamBody,
    ProcessView,
)

#: Tags remembered across all sandboxes (oldest forgotten first).
MAX_TAGS = 10_000
_tags: OrderedDict[tuple[str, str], str] = OrderedDict()

#: envd's signals (the enum's JSON names or numbers) and Paddock's.
SIGNALS = {"SIGNAL_SIGTERM": "SIGTERM", "SIGNAL_SIGKILL": "SIGKILL", 15: "SIGTERM", 9: "SIGKILL"}
LIVE = ("starting", "running", "terminating")
MAX_ARG_COUNT = 65536


def _str(value: Any, field: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ConnectError("invalid_argument", f"{field}: must be a string")
    return value


def _size(pty: Any) -> ProcessPty | None:
    if pty is None:
        return None
    size = pty.get("size") if isinstance(pty, dict) else None
    size = size if isinstance(size, dict) else {}
    try:
        return ProcessPty(rows=int(size.get("rows") or 24), cols=int(size.get("cols") or 80))
    except (TypeError, ValueError):
        raise ConnectError("invalid_argument", "pty.size: rows and cols must be 1..10000") from None


def _bytes(value: Any, field: str) -> str:
    """A proto-JSON ``bytes`` field (standard or URL-safe base64, padding optional) as strict base64."""
    if not isinstance(value, str):
        raise ConnectError("invalid_argument", f"{field}: must be base64")
    try:
        padded = value + "=" * (-len(value) % 4)
        raw = (
            base64.urlsafe_b64decode(padded)
            if ("-" in value or "_" in value)
            else base64.b64decode(padded, validate=True)
        )
    except (binascii.Error, ValueError):
        raise ConnectError("invalid_argument", f"{field}: must be base64") from None
    return base64.b64encode(raw).decode()


def _end_event(view: ProcessView | None, frame: ProcessFrame | None) -> dict[str, Any]:
    exit_code = frame.exit_code if frame is not None else (view.exit_code if view else None)
    signal = frame.signal if frame is not None else (view.signal if view else None)
    if signal:
        name = signal.removeprefix("SIG").lower()
        end = {"exitCode": -1, "exited": False, "status": f"signal: {'killed' if name == 'kill' else name}"}
    else:
        code = exit_code if exit_code is not None else -1
        end = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
    return {"event": {"end": end}}


async def _process_id(call: Call, selector: Any) -> tuple[str, int]:
    if not isinstance(selector, dict) or not selector:
        raise ConnectError("invalid_argument", "process: a pid or a tag is required")
    with mapped():
        listed = (await call.link.list_processes(call.sandbox.id)).processes
    if "tag" in selector:
        tag = _str(selector["tag"], "process.tag")
        process_id = _tags.get((call.sandbox.id, tag or ""))
        for view in listed:
            if view.process_id == process_id:
                return view.process_id, view.pid
        raise ConnectError("not_found", f"process with tag {tag} not found")
    pid = selector.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise ConnectError("invalid_argument", "process.pid: must be an integer")
    for view in listed:
        if view.pid == pid and view.state in LIVE:
            return view.process_id, view.pid
    raise ConnectError("not_found", f"process with pid {pid} not found")


async def _opened(
    call: Call, process_id: str, after: int, *, close_stdin: bool = False
) -> AsyncGenerator[ProcessFrame, None]:
    """The process's stream from output ``after`` on. With ``close_stdin`` its stdin is closed while
    the stream opens (two host calls at once, not one after the other: the stream starts at ``after``,
    so no output is lost to the order)."""
    with mapped():
        opening = call.link.connect_process(call.sandbox.id, process_id, after)
        if not close_stdin:
            return await opening
        opened, closed = await asyncio.gather(
            opening, call.link.close_process_stdin(call.sandbox.id, process_id), return_exceptions=True
        )
        if isinstance(opened, BaseException):
            raise opened
        if isinstance(closed, BaseException):
            await opened.aclose()
            raise closed
        return opened


async def _events(
    call: Call, pid: int, frames: AsyncGenerator[ProcessFrame, None]
) -> AsyncIterator[dict[str, Any]]:
    """An opened stream's frames as envd's events."""
    with Inflight(call.services, call.sandbox.id):
        yield {"event": {"start": {"pid": pid}}}
        try:
            async for frame in frames:
                if frame.type == "data" and frame.data_base64:
                    yield {"event": {"data": {frame.stream or "stdout": frame.data_base64}}}
                elif frame.type == "heartbeat":
                    yield {"event": {"keepalive": {}}}
                elif frame.type == "exit":
                    yield _end_event(None, frame)
                    return
                elif frame.type == "error":
                    raise ConnectError("unavailable", f"lost the process stream: {frame.error}")
        finally:
            await frames.aclose()  # the process runs on
    raise ConnectError("unavailable", "the process stream ended before the process did")


def command_env(call: Call, given: dict[str, str]) -> dict[str, str]:
    """The sandbox's env with the command's over it. E2B lets a command set any variable (Paddock's
    ``/v1`` exec only overrides declared ones); the whole is bounded as a sandbox's env is."""
    return validation.envs({**envs.open_sealed(call.services, call.sandbox), **given}, "process.envs")


async def _start_streaming(
    call: Call, body: ProcessStreamBody
) -> tuple[ProcessView, AsyncGenerator[ProcessFrame, None]]:
    """Starts the process and opens its stream from its first output: one host call (the host's
    streamed start), or, with an agent from before it, a start then the stream and stdin's close at
    once — the same process and events either way."""
    started = await call.link.start_streaming(call.sandbox.id, body)
    if started is not None:
        return started
    view = await call.link.start_process(
        call.sandbox.id, ProcessStartBody(**body.model_dump(exclude={"close_stdin"}))
    )
    return view, await _opened(call, view.process_id, 0, close_stdin=body.close_stdin)


async def _start_as(
    call: Call, body: ProcessStreamBody
) -> tuple[ProcessView, AsyncGenerator[ProcessFrame, None]]:
    """Starts the process as the E2B user the SDK named (``context.Call.user``). E2B's ``user`` is an
    account Paddock's images need not have: where the sandbox has none, the process runs as the image's
    user, as it does when the SDK names nobody (docs/e2b.md, Users)."""
    try:
        return await _start_streaming(call, body)
    except errors.ValidationFailed as exc:
        if body.user != DEFAULT_USER or "user" not in exc.fields:
            raise
    return await _start_streaming(call, body.model_copy(update={"user": None}))


async def start(call: Call, req: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    config = req.get("process")
    if not isinstance(config, dict):
        raise ConnectError("invalid_argument", "process: is required")
    cmd = _str(config.get("cmd"), "process.cmd")
    if not cmd:
        raise ConnectError("invalid_argument", "process.cmd: is required")
    args = config.get("args") or []
    if not isinstance(args, list) or len(args) > MAX_ARG_COUNT or not all(isinstance(a, str) for a in args):
        raise ConnectError("invalid_argument", "process.args: must be a list of strings")
    env = config.get("envs") or {}
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConnectError("invalid_argument", "process.envs: must map names to strings")
    cwd = _str(config.get("cwd"), "process.cwd", optional=True) or None
    tag = _str(req.get("tag"), "tag", optional=True)
    pty = _size(req.get("pty"))
    close_stdin = pty is None and req.get("stdin") is not True
    with mapped():
        body = ProcessStreamBody(
            cmd=cmd,
            args=args,
            env=command_env(call, env),
            cwd=cwd,
            pty=pty,
            user=call.user,
            close_stdin=close_stdin,
        )
        view, frames = await _start_as(call, body)
    processes.audit_started(
        call.services,
        call.sandbox,
        cmd,
        args,
        cwd=cwd,
        user=call.user,
        pty=pty is not None,
        process_id=view.process_id,
        actor=call.actor,
    )
    if tag:
        _tags[(call.sandbox.id, tag)] = view.process_id
        while len(_tags) > MAX_TAGS:
            _tags.popitem(last=False)
    async for event in _events(call, view.pid, frames):
        yield event


async def connect(call: Call, req: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    process_id, pid = await _process_id(call, req.get("process"))
    with mapped():
        view = await call.link.get_process(call.sandbox.id, process_id)
    frames = await _opened(call, process_id, view.output.newest_seq)
    async for event in _events(call, pid, frames):
        yield event


async def list_(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    with mapped():
        listed = (await call.link.list_processes(call.sandbox.id)).processes
    tags = {pid: tag for (sandbox_id, tag), pid in _tags.items() if sandbox_id == call.sandbox.id}
    out = []
    for view in listed:
        if view.state not in LIVE:
            continue
        info: dict[str, Any] = {
            "config": {"cmd": view.cmd, "args": view.args, "envs": {}, "cwd": view.cwd},
            "pid": view.pid,
        }
        if view.process_id in tags:
            info["tag"] = tags[view.process_id]
        out.append(info)
    return {"processes": out}


def _input(data: Any, field: str = "input") -> str:
    """A ``ProcessInput`` (``stdin`` or ``pty`` bytes) as the strict base64 the host takes, at most 1 MiB."""
    if not isinstance(data, dict) or not ({"stdin", "pty"} & data.keys()):
        raise ConnectError("invalid_argument", f"{field}: stdin or pty is required")
    kind = "stdin" if "stdin" in data else "pty"
    encoded = _bytes(data[kind], f"{field}.{kind}")
    if len(encoded) > (1 << 20) * 4 // 3 + 4:
        raise ConnectError("resource_exhausted", f"{field}.{kind}: is over 1 MiB")
    return encoded


async def send_input(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    process_id, _ = await _process_id(call, req.get("process"))
    encoded = _input(req.get("input"))
    with mapped():
        await call.link.process_input(call.sandbox.id, process_id, encoded)
    return {}


async def stream_input(call: Call, messages: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """envd's client stream: a ``start`` naming the process, then ``data`` (each written to the process's
    stdin or PTY as it arrives, in order) and ``keepalive`` messages, until the client ends the request.
    The answer, once it has, is the empty ``StreamInputResponse``."""
    process_id: str | None = None
    with Inflight(call.services, call.sandbox.id):
        async for message in messages:
            if "start" in message:
                if process_id is not None:
                    raise ConnectError("invalid_argument", "start: only the first message may be start")
                start = message["start"]
                process_id, _ = await _process_id(
                    call, start.get("process") if isinstance(start, dict) else None
                )
            elif "data" in message:
                if process_id is None:
                    raise ConnectError("invalid_argument", "start: the first message must name the process")
                data = message["data"]
                encoded = _input(data.get("input") if isinstance(data, dict) else None, "data.input")
                with mapped():
                    await call.link.process_input(call.sandbox.id, process_id, encoded)
            elif "keepalive" not in message:
                raise ConnectError("invalid_argument", "event: one of start, data or keepalive is required")
    return {}


async def send_signal(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    process_id, _ = await _process_id(call, req.get("process"))
    signal = SIGNALS.get(req.get("signal"))
    if signal is None:
        raise ConnectError("invalid_argument", "signal: must be SIGNAL_SIGTERM or SIGNAL_SIGKILL")
    try:
        with mapped():
            await call.link.signal_process(call.sandbox.id, process_id, ProcessSignalBody(signal=signal))  # type: ignore[arg-type]
    except ConnectError as exc:
        # A process that has exited but is still listed (its output draining) is gone to envd, which
        # drops it at exit: the SDKs read not_found as "nothing to kill" (kill() returns false).
        if exc.code != "failed_precondition":
            raise
        raise ConnectError("not_found", f"process {process_id}: has exited") from None
    return {}


async def close_stdin(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    process_id, _ = await _process_id(call, req.get("process"))
    with mapped():
        await call.link.close_process_stdin(call.sandbox.id, process_id)
    return {}


async def update(call: Call, req: dict[str, Any]) -> dict[str, Any]:
    process_id, _ = await _process_id(call, req.get("process"))
    pty = _size(req.get("pty"))
    if pty is not None:
        with mapped():
            await call.link.resize_process(
                call.sandbox.id, process_id, ProcessResizeBody(rows=pty.rows, cols=pty.cols)
            )
    return {}


UNARY = {
    "List": list_,
    "SendInput": send_input,
    "SendSignal": send_signal,
    "CloseStdin": close_stdin,
    "Update": update,
}
#: The calls that only read (``filesystem.READS`` says why).
READS = frozenset({"List"})
STREAMS = {"Start": start, "Connect": connect}
CLIENT_STREAMS = {"StreamInput": stream_input}
