"""Interactive terminals into sandboxes: a managed process (§12.2) bridged to a client's byte pipe.

The WebSocket shell (``/v1/sandboxes/{id}/shell-ws``) and the SSH gateway (``sshgate.py``) are both a
``Terminal``: one process in the sandbox's guest agent (with a PTY for a shell, without one for
``ssh host cmd``), its output read from a connect stream, input and window sizes sent as requests.
A terminal that started its process ends it when the client leaves (as a hang-up ends a shell); one
attached to an existing process only detaches. A paused sandbox is resumed first, as the ingress
proxy does, so connecting is enough to wake it.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncGenerator

from sqlalchemy import select

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.queries import running_sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.sandboxes import envs, suspension
from paddock_controlplane.sandboxes.activity import Inflight, touch
from paddock_controlplane.sandboxes.processes import host_errors
from paddock_core import errors
from paddock_hostagent.schemas import (
    ProcessFrame,
    ProcessPty,
    ProcessResizeBody,
    ProcessStartBody,
    ProcessView,
)

LOGIN_SHELL = ("bash", ["-l"])
HANGUP_GRACE_MS = 1000  # SIGTERM and SIGHUP, then SIGKILL: an editor gets a moment to save its swap


async def wake(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    """The caller's sandbox once running; a paused one is resumed (quota, credit, billing, webhook)."""
    async with services.sessions() as session:
        status = (
            await session.scalars(
                select(Sandbox.status).where(Sandbox.id == sandbox_id, Sandbox.user_id == user_id)
            )
        ).first()
    if status is None:
        raise errors.NotFound("sandbox not found")
    if status == SandboxStatus.PAUSED:
        with contextlib.suppress(errors.InvalidState):  # another connection resumed it first
            await suspension.resume(services, user_id, sandbox_id)
    return await running_sandbox(services, user_id, sandbox_id)  # waits while it resumes


class Terminal:
    """One process in a sandbox as a client sees it: ``frames()`` out, ``write``/``resize`` in."""

    def __init__(
        self,
        services: Services,
        sandbox: Sandbox,
        link: hostlink.HostLinkAPI,
        process: ProcessView,
        *,
        owned: bool,
    ) -> None:
        self.services = services
        self.sandbox = sandbox
        self.link = link
        self.process = process
        self.owned = owned
        self.exited = False

    @classmethod
    async def open(
        cls,
        services: Services,
        user_id: str,
        sandbox_id: str,
        *,
        pty: ProcessPty | None,
        command: str | None = None,
        argv: tuple[str, list[str]] | None = None,
        attach_to: str | None = None,
    ) -> Terminal:
        """Starts ``command`` under ``bash -lc`` (a login shell when None), or ``argv`` as it is (no
        shell: nothing a profile prints may mix into a binary protocol), or attaches to a process."""
        sandbox = await wake(services, user_id, sandbox_id)
        link = await hostlink.for_host(services, sandbox.host_id)
        if attach_to is not None:
            with host_errors():
                attached = await link.get_process(sandbox.id, attach_to)
            return cls(services, sandbox, link, attached, owned=False)
        if argv is not None:
            cmd, args = argv
        else:
            cmd, args = LOGIN_SHELL if command is None else ("bash", ["-lc", command])
        env = envs.merged(services, sandbox, None)
        body = ProcessStartBody(cmd=cmd, args=args, env=env, cwd=None, pty=pty)
        with host_errors():
            started = await link.start_process(sandbox.id, body)
        return cls(services, sandbox, link, started, owned=True)

    async def frames(self, after: int = 0) -> AsyncGenerator[ProcessFrame, None]:
        """Output frames (``data``), then one ``exit`` or ``error``; activity while attached."""
        with host_errors():
            stream = await self.link.connect_process(self.sandbox.id, self.process.process_id, after)
        with Inflight(self.services, self.sandbox.id):
            try:
                async for frame in stream:
                    if frame.type == "heartbeat":
                        continue
                    if frame.type in ("exit", "error"):
                        self.exited = frame.type == "exit"
                    yield frame
                    if frame.type in ("exit", "error"):
                        return
            finally:
                await stream.aclose()

    async def write(self, data: bytes) -> None:
        if data:
            touch(self.services, self.sandbox.id)
            encoded = base64.b64encode(data).decode()
            with host_errors():
                await self.link.process_input(self.sandbox.id, self.process.process_id, encoded)

    async def close_stdin(self) -> None:
        with host_errors():
            await self.link.close_process_stdin(self.sandbox.id, self.process.process_id)

    async def resize(self, rows: int, cols: int) -> None:
        body = ProcessResizeBody(rows=max(1, min(rows, 10000)), cols=max(1, min(cols, 10000)))
        with host_errors():
            await self.link.resize_process(self.sandbox.id, self.process.process_id, body)

    async def close(self) -> None:
        """Ends a process this terminal started (a hang-up); leaves an attached one running."""
        if self.owned and not self.exited:
            with contextlib.suppress(Exception):  # the sandbox may be gone: nothing left to end
                await self.link.kill_process(self.sandbox.id, self.process.process_id, HANGUP_GRACE_MS)


def decode(frame: ProcessFrame) -> bytes:
    return base64.b64decode(frame.data_base64 or "")
