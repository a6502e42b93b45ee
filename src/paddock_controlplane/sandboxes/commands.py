"""Commands and files inside a running sandbox (§11.5, §11.6).

Both go to the sandbox's host through :mod:`hostlink`; the host agent hands them to the guest agent
living in the sandbox's namespaces. Streams are passed through frame by frame with a heartbeat every
5 s; a client that goes away takes its command with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import audit, validation
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.queries import running_sandbox
from paddock_controlplane.records.schemas.commands import ExecRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import envs
from paddock_controlplane.sandboxes.activity import Inflight, touch
from paddock_core import errors
from paddock_core.timeutil import utcnow

HEARTBEAT_S = 5.0
# Set by the host agent when a buffered stream was cut at its cap (4 MiB each): the command ran to its
# end, the rest of its output was dropped. ``stream: true`` returns everything.
TRUNCATION_FLAGS = ("stdout_truncated", "stderr_truncated")
UPLOAD_PIECE_BYTES = 1 << 20
#: An exec's ``stdin``, in bytes of UTF-8. It travels inside the request's JSON, which the control plane
#: and the host agent each parse whole: one exec with a 1 GiB stdin took the control plane from 204 to
#: 5,324 MiB and another tenant's ``exec true`` took 4 s. Bigger input goes in a file (``PUT /files``,
#: streamed) that the command reads.
MAX_EXEC_STDIN_BYTES = 8 << 20
#: The whole JSON body of an exec, refused as it is read (``paddock_core.bodylimit``), before it is
#: parsed: room for ``MAX_EXEC_STDIN_BYTES`` of stdin with JSON's escapes, and the command.
MAX_EXEC_BODY_BYTES = 32 << 20


async def prepare_exec(
    services: Services, user_id: str, sandbox_id: str, req: ExecRequest
) -> tuple[Sandbox, dict[str, str]]:
    if not req.cmd:
        raise errors.ValidationFailed.field("cmd", "is required")
    if req.cwd is not None:
        in_directory(req)
    req.user = check_user(req.user)
    check_stdin_size(req)
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    env = envs.merged(services, sandbox, req.env)
    check_command_size(req, env)
    return sandbox, env


#: An exec's ``cwd``: the command runs through the sandbox's ``/bin/sh``, which changes to it and then
#: execs the command; the directory and the command are its positional arguments, never part of the
#: script, so no character of theirs is shell syntax. A directory that is not there exits 127.
CWD_SCRIPT = 'cd -- "$1" || exit 127; shift; exec "$@"'
MAX_CWD_BYTES = 4096


def in_directory(req: ExecRequest) -> None:
    """Rewrites ``req`` to run in ``req.cwd``; a 400 names ``cwd`` when it is not an absolute path."""
    cwd = req.cwd or ""
    if not cwd.startswith("/") or "\x00" in cwd or len(cwd.encode("utf-8", "surrogatepass")) > MAX_CWD_BYTES:
        raise errors.ValidationFailed.field(
            "cwd", f"must be an absolute path of at most {MAX_CWD_BYTES} bytes"
        )
    req.args = ["-c", CWD_SCRIPT, "sh", cwd, req.cmd, *(req.args or [])]
    req.cmd = "/bin/sh"
    req.cwd = None


#: An exec's or a process's ``user``: a name as the sandbox's /etc/passwd may spell it (POSIX's portable
#: characters, not starting with '-', an optional trailing '$' as Samba's machine accounts have) or a
#: numeric uid. The guest resolves it inside the sandbox; one it does not find is a 400 naming ``user``.
MAX_USER_NAME_BYTES = 64
MAX_UID = 2**31 - 1
_USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?")


def check_user(user: str | int | None) -> str | None:
    """The ``user`` field as the host takes it (a string), or a 400 naming ``user``."""
    if user is None:
        return None
    if isinstance(user, int):
        user = str(user) if 0 <= user <= MAX_UID else "-"
    if user.isdigit() and user.isascii():
        if int(user) > MAX_UID:
            raise errors.ValidationFailed.field("user", f"a uid must be between 0 and {MAX_UID}")
        return str(int(user))
    if len(user) > MAX_USER_NAME_BYTES or not _USER_NAME.fullmatch(user):
        raise errors.ValidationFailed.field(
            "user",
            f"must be a user name (letters, digits, '_', '.', '-', not starting with '-', at most "
            f"{MAX_USER_NAME_BYTES} characters) or a uid between 0 and {MAX_UID}",
        )
    return user


def check_stdin_size(req: ExecRequest) -> None:
    """413 naming ``stdin`` when it is over ``MAX_EXEC_STDIN_BYTES`` of UTF-8."""
    stdin = req.stdin
    if stdin is None or len(stdin) * 4 <= MAX_EXEC_STDIN_BYTES:  # no UTF-8 character takes more than 4
        return
    if (
        len(stdin) if stdin.isascii() else len(stdin.encode("utf-8", "surrogatepass"))
    ) > MAX_EXEC_STDIN_BYTES:
        reason = f"is over {MAX_EXEC_STDIN_BYTES} bytes; upload bulk input as a file (PUT /files) and read it"
        raise errors.PayloadTooLarge(f"stdin: {reason}", fields={"stdin": reason})


def check_command_size(req: ExecRequest, env: dict[str, str]) -> None:
    """413 naming the biggest part when cmd + args + env is over the limit (stdin does not count)."""
    sizes = validation.exec_command_bytes(req.cmd, req.args or [], env)
    limit = validation.MAX_EXEC_COMMAND_BYTES
    if sum(sizes.values()) > limit:
        biggest = max(sizes, key=lambda part: sizes[part])
        reason = f"cmd, args and env together are over {limit} bytes; send bulk input as stdin or a file"
        raise errors.PayloadTooLarge(f"{biggest}: {reason}", fields={biggest: reason})


def audit_command(
    services: Services, sandbox: Sandbox, req: ExecRequest, exit_code: int, started: float, *, stream: bool
) -> None:
    """The audit trail's ``command`` event: argv (bounded), cwd, user, exit code, duration; never env
    or stdin. A command ``in_directory`` wrapped is recorded as it was asked for."""
    cmd, args, cwd = req.cmd, list(req.args or []), None
    if cmd == "/bin/sh" and len(args) >= 5 and args[:3] == ["-c", CWD_SCRIPT, "sh"]:
        cwd, cmd, args = args[3], args[4], args[5:]
    detail = audit.argv_detail(cmd, args)
    duration_ms = audit.elapsed_ms(started)
    detail.update(cwd=cwd, user=req.user, exit_code=exit_code, duration_ms=duration_ms)
    if stream:
        detail["stream"] = True
    at = utcnow() - dt.timedelta(milliseconds=duration_ms)  # when it started
    services.audit.record(sandbox.id, sandbox.user_id, "command", detail, at=at)


def audit_file(
    services: Services, sandbox: Sandbox, path: str, size: int, direction: str, *, what: str = "file"
) -> None:
    """The audit trail's ``file`` event: a file (or a directory's tar) written or read through the API."""
    detail = {"path": audit.bounded(path, audit.MAX_PATH_CHARS), "bytes": size, "direction": direction}
    if what != "file":
        detail["as"] = what
    services.audit.record(sandbox.id, sandbox.user_id, "file", detail)


def _as(req: ExecRequest) -> dict[str, Any]:
    """The user to run as, for the host link, only when one was asked for."""
    return {} if req.user is None else {"user": str(req.user)}


async def exec_buffered(
    services: Services, sandbox: Sandbox, req: ExecRequest, env: dict[str, str]
) -> dict[str, Any]:
    link = await hostlink.for_host(services, sandbox.host_id)
    started = time.perf_counter()
    with Inflight(services, sandbox.id):
        try:
            result = await link.exec(sandbox.id, req.cmd, req.args or [], env, req.stdin, **_as(req))
        except hostlink.SandboxGoneError as exc:
            result = {"stdout": "", "stderr": "", "exit_code": -1, "error": str(exc)}
    exec_ms = round((time.perf_counter() - started) * 1000, 3)
    out: dict[str, Any] = {
        "stdout": result.get("stdout", ""),
        "stderr": result.get("stderr", ""),
        "exit_code": int(result.get("exit_code", -1)),
    }
    if result.get("error"):
        out["error"] = str(result["error"])
        out["exit_code"] = -1
    for flag in TRUNCATION_FLAGS:
        if result.get(flag):
            out[flag] = True
    audit_command(services, sandbox, req, out["exit_code"], started, stream=False)
    return {"result": out, "exec_ms": exec_ms}


async def exec_stream(
    services: Services, sandbox: Sandbox, req: ExecRequest, env: dict[str, str]
) -> AsyncIterator[bytes]:
    """NDJSON frames: a heartbeat at once and every 5 s, output as it comes, one final exit_code."""
    link = await hostlink.for_host(services, sandbox.host_id)
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    started, exit_code = time.perf_counter(), -1

    async def pump() -> None:
        try:
            async for frame in link.exec_stream(
                sandbox.id, req.cmd, req.args or [], env, req.stdin, **_as(req)
            ):
                await queue.put(frame)
        except (
            hostlink.HostError,
            hostlink.SandboxGoneError,
            errors.ValidationFailed,
            errors.InvalidState,
        ) as exc:
            # The stream's 200 has gone: an unknown user (the guest's 400) or an old guest's 409 is its
            # error frame.
            await queue.put({"error": str(exc)})
            await queue.put({"exit_code": -1})
        finally:
            await queue.put(None)

    with Inflight(services, sandbox.id):
        task = asyncio.create_task(pump())
        try:
            yield b'{"hb":true}\n'
            saw_exit = False
            while True:
                try:
                    frame = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
                except TimeoutError:
                    yield b'{"hb":true}\n'
                    continue
                if frame is None:
                    break
                if "exit_code" in frame:
                    if saw_exit:
                        continue
                    saw_exit = True
                    with contextlib.suppress(TypeError, ValueError):
                        exit_code = int(frame["exit_code"])
                yield json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
            if not saw_exit:
                yield b'{"error":"command stream ended without an exit code"}\n{"exit_code":-1}\n'
        finally:
            audit_command(services, sandbox, req, exit_code, started, stream=True)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def upload(
    services: Services,
    user_id: str,
    sandbox_id: str,
    path: str,
    body: AsyncIterator[bytes],
    length: int | None,
    *,
    audited_as: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Writes ``body`` to ``path``; the audit trail's event names ``audited_as`` (path, what) when the
    file is a step of something else (a tar's scratch file)."""
    limit = services.settings.max_upload_bytes
    if length is not None and length > limit:
        raise errors.PayloadTooLarge(f"upload is over the {limit}-byte limit")
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    link = await hostlink.for_host(services, sandbox.host_id)
    size = await write_file(services, link, sandbox.id, path, body, limit)
    shown, what = audited_as or (path, "file")
    audit_file(services, sandbox, shown, size, "write", what=what)
    return {"path": path, "size": size}


async def write_file(
    services: Services,
    link: hostlink.HostLinkAPI,
    sandbox_id: str,
    path: str,
    body: AsyncIterator[bytes],
    limit: int,
) -> int:
    """Streams ``body`` to ``path`` in the sandbox, refused (413) as it passes ``limit`` bytes; the
    size written. ``/v1``'s upload and the E2B edge's ``POST /files`` both write through it."""
    received = 0

    async def capped() -> AsyncIterator[bytes]:
        """The body in pieces of at least ``UPLOAD_PIECE_BYTES`` (the server hands it over as read
        from the socket, often 64 KiB): each piece costs the host client a chunk's framing and a send."""
        nonlocal received
        pending: list[bytes] = []
        pending_bytes = 0
        async for chunk in body:
            received += len(chunk)
            if received > limit:
                raise errors.PayloadTooLarge(f"upload is over the {limit}-byte limit")
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= UPLOAD_PIECE_BYTES:
                yield b"".join(pending)
                pending, pending_bytes = [], 0
        if pending_bytes:
            yield b"".join(pending)

    with Inflight(services, sandbox_id):
        result = await link.upload(sandbox_id, path, capped())
    return int(result.get("size", received))


async def download(services: Services, user_id: str, sandbox_id: str, path: str) -> hostlink.Download:
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    link = await hostlink.for_host(services, sandbox.host_id)
    touch(services, sandbox.id)
    download = await link.download(sandbox.id, path)
    return audited_download(services, sandbox, path, download)


def audited_download(
    services: Services, sandbox: Sandbox, path: str, download: hostlink.Download, *, what: str = "file"
) -> hostlink.Download:
    """``download`` whose bytes are counted as they go; the ``file`` event is queued when it ends."""
    source = download.chunks

    async def counted() -> AsyncIterator[bytes]:
        sent = 0
        try:
            async for chunk in source:
                sent += len(chunk)
                yield chunk
        finally:
            audit_file(services, sandbox, path, sent, "read", what=what)

    download.chunks = counted()
    return download
