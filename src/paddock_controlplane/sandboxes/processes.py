"""Managed processes in a running sandbox (spec §12.2).

The guest agent inside the sandbox owns the processes and their output (its process manager); the
control plane checks the caller and the sandbox, then asks the sandbox's host through :mod:`hostlink`.
Nothing is stored here: a process lives exactly as long as the sandbox's guest keeps it. A connect
stream is passed through frame by frame with a heartbeat every 5 s of silence, and holds the sandbox
busy (no idle auto-pause) while a client is attached.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import audit
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.queries import running_sandbox
from paddock_controlplane.records.schemas.processes import (
    ProcessInputRequest,
    ProcessResizeRequest,
    ProcessSignalRequest,
    ProcessStartRequest,
)
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import commands, envs
from paddock_controlplane.sandboxes.activity import Inflight, touch
from paddock_core import errors
from paddock_hostagent.schemas import (
    ProcessFrame,
    ProcessResizeBody,
    ProcessSignalBody,
    ProcessStartBody,
    ProcessView,
)

HEARTBEAT_S = 5.0
MAX_WAIT_MS = 3_600_000
MAX_GRACE_MS = 600_000


def view(process: ProcessView) -> dict[str, Any]:
    """The ManagedProcess object: optional fields are left out when unset."""
    return process.model_dump(exclude_none=True)


@contextlib.contextmanager
def host_errors() -> Iterator[None]:
    """The host's failures as the API's: unreachable 503 (retried by clients), sandbox gone 409."""
    try:
        yield
    except hostlink.SandboxGoneError as exc:
        raise errors.InvalidState(f"the sandbox is no longer running on its host: {exc}") from None
    except hostlink.HostError as exc:
        raise errors.Unavailable(f"the sandbox's host did not answer: {exc}") from None


async def _target(services: Services, user_id: str, sandbox_id: str) -> tuple[Sandbox, hostlink.HostLinkAPI]:
    sandbox = await running_sandbox(services, user_id, sandbox_id)  # 404 / 409 as for exec
    touch(services, sandbox.id)
    return sandbox, await hostlink.for_host(services, sandbox.host_id)


async def start(services: Services, user_id: str, sandbox_id: str, req: ProcessStartRequest) -> ProcessView:
    if req.cmd is None and req.pty is None:
        raise errors.ValidationFailed.field("cmd", "is required for a process without a pty")
    run_as = commands.check_user(req.user)
    sandbox, link = await _target(services, user_id, sandbox_id)
    env = envs.merged(services, sandbox, req.env)
    body = ProcessStartBody(cmd=req.cmd, args=req.args or [], env=env, cwd=req.cwd, pty=req.pty, user=run_as)
    with host_errors():
        started = await link.start_process(sandbox.id, body)
    audit_started(
        services,
        sandbox,
        req.cmd or "bash -l",
        req.args or [],
        cwd=req.cwd,
        user=run_as,
        pty=req.pty is not None,
        process_id=started.process_id,
    )
    return started


def audit_started(
    services: Services,
    sandbox: Sandbox,
    cmd: str,
    args: list[str],
    *,
    cwd: str | None,
    user: str | None,
    pty: bool,
    process_id: str,
    actor: str | None = None,
) -> None:
    """The audit trail's ``process`` event: argv (bounded), cwd, user, pty; never env. ``actor`` queues
    it at once under that caller (the E2B edge's: a background process's stream may stay open for
    hours); without one it waits for its request's end, which names the caller."""
    detail = audit.argv_detail(cmd, args)
    detail.update(cwd=cwd, user=user, pty=pty, process_id=process_id)
    services.audit.record(sandbox.id, sandbox.user_id, "process", detail, actor=actor)


async def list_all(services: Services, user_id: str, sandbox_id: str) -> list[ProcessView]:
    sandbox, link = await _target(services, user_id, sandbox_id)
    with host_errors():
        return (await link.list_processes(sandbox.id)).processes


async def get(services: Services, user_id: str, sandbox_id: str, process_id: str) -> ProcessView:
    sandbox, link = await _target(services, user_id, sandbox_id)
    with host_errors():
        return await link.get_process(sandbox.id, process_id)


async def kill(
    services: Services, user_id: str, sandbox_id: str, process_id: str, grace_ms: int
) -> ProcessView:
    sandbox, link = await _target(services, user_id, sandbox_id)
    with host_errors():
        return await link.kill_process(sandbox.id, process_id, grace_ms)


async def send_input(
    services: Services, user_id: str, sandbox_id: str, process_id: str, req: ProcessInputRequest
) -> int:
    sandbox, link = await _target(services, user_id, sandbox_id)
    with host_errors():
        return (await link.process_input(sandbox.id, process_id, req.data_base64)).input_seq


async def close_stdin(services: Services, user_id: str, sandbox_id: str, process_id: str) -> None:
    sandbox, link = await _target(services, user_id, sandbox_id)
    with host_errors():
        await link.close_process_stdin(sandbox.id, process_id)


async def resize(
    services: Services, user_id: str, sandbox_id: str, process_id: str, req: ProcessResizeRequest
) -> ProcessView:
    sandbox, link = await _target(services, user_id, sandbox_id)
    with host_errors():
        return await link.resize_process(
            sandbox.id, process_id, ProcessResizeBody(rows=req.rows, cols=req.cols)
        )


async def send_signal(
    services: Services, user_id: str, sandbox_id: str, process_id: str, req: ProcessSignalRequest
) -> ProcessView:
    sandbox, link = await _target(services, user_id, sandbox_id)
    with host_errors():
        return await link.signal_process(sandbox.id, process_id, ProcessSignalBody(signal=req.signal))


async def wait(
    services: Services, user_id: str, sandbox_id: str, process_id: str, *, scope: str, timeout_ms: int
) -> ProcessView:
    sandbox, link = await _target(services, user_id, sandbox_id)
    with Inflight(services, sandbox.id), host_errors():
        return await link.wait_process(sandbox.id, process_id, scope=scope, timeout_ms=timeout_ms)


async def connect(
    services: Services, user_id: str, sandbox_id: str, process_id: str, after: int
) -> AsyncIterator[bytes]:
    """Opens the stream (404/409 raised here, before the response starts) and returns its NDJSON."""
    sandbox, link = await _target(services, user_id, sandbox_id)
    with host_errors():
        frames = await link.connect_process(sandbox.id, process_id, after)
    return _ndjson(services, sandbox.id, frames)


async def _ndjson(
    services: Services, sandbox_id: str, frames: AsyncGenerator[ProcessFrame, None]
) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[ProcessFrame | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for frame in frames:
                await queue.put(frame)
        except (hostlink.HostError, hostlink.SandboxGoneError, errors.PaddockError) as exc:
            await queue.put(ProcessFrame(type="error", error=f"lost the process stream: {exc}"))
        finally:
            await queue.put(None)

    with Inflight(services, sandbox_id):
        task = asyncio.create_task(pump())
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
                except TimeoutError:
                    yield b'{"type":"heartbeat"}\n'
                    continue
                if frame is None:
                    return
                yield frame.model_dump_json(exclude_none=True).encode() + b"\n"
                if frame.type in ("exit", "error"):
                    return
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            with contextlib.suppress(Exception):
                await frames.aclose()  # closes the host's stream; the process runs on
