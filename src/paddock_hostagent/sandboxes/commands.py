"""Commands and files in this host's sandboxes: an exec as the guest agent runs it (the template's
environment, directory and user applied), and files written and read through the guest agent.

A command or file transfer does not take the sandbox's lock, but a pause or destroy ends every
exchange still in flight (``Entry.end_exchanges``: an exec ends with ``{"error": "sandbox paused"}``
and exit code -1; the guest agent then kills the command when it thaws).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator

from paddock_hostagent import errors
from paddock_hostagent.drivers.base import RuntimeState
from paddock_hostagent.drivers.runtime.ocispec import DEFAULT_PATH
from paddock_hostagent.execution import ExecStream
from paddock_hostagent.guest import ExecRequest, GuestError
from paddock_hostagent.guest.client import GuestBusyError
from paddock_hostagent.guest.protocol import GuestTooOldError, GuestUserError
from paddock_hostagent.images import CommandAsked
from paddock_hostagent.sandboxes.checks import check_no_nul, check_path, guest_file_errors
from paddock_hostagent.sandboxes.registry import Entry, Registry
from paddock_hostagent.schemas import ExecBody


class Commands:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def open_exec(self, sandbox_id: str, body: ExecBody) -> ExecStream:
        """Starts a command; raises (404/409) before anything runs if the sandbox cannot take it."""
        registry = self.registry
        entry = registry.entry(sandbox_id)
        # The recorded state, not the runtime's probe (a /proc and a cgroup read per command): a
        # sandbox whose init has died refuses the guest's connection, and is probed then (below).
        if entry.record.state != RuntimeState.RUNNING:
            registry.running_entry(sandbox_id)  # the 409, with the state the probe finds
        base = {"PATH": DEFAULT_PATH, "HOSTNAME": entry.record.name, "LANG": "C.UTF-8"}
        # A template's ENV, WORKDIR and USER apply to every command, under what the caller sets.
        run = registry.images.config(entry.record.image).command(
            base,
            CommandAsked(body.cmd, body.args, body.env, body.cwd, body.user),
            registry.settings.default_cwd,
        )
        request = ExecRequest(
            cmd=run.cmd,
            args=run.args,
            env=run.env,
            cwd=run.cwd,
            stdin=body.stdin.encode() if body.stdin is not None else None,
            user=run.user,
        )
        check_no_nul([run.cmd, *run.args, *run.env, *run.env.values(), run.cwd, run.user or ""])
        session = registry.runtime.guest(entry.record).exec(request)
        try:
            await session.__aenter__()
        except GuestBusyError as exc:
            raise errors.Busy(f"sandbox {sandbox_id} is busy: {exc}; retry") from exc
        except GuestUserError as exc:
            raise errors.UnknownUser(f"user: {exc}") from exc
        except GuestTooOldError as exc:
            raise errors.UnsupportedOnTier(f"user: {exc}") from exc
        except GuestError as exc:
            registry.running_entry(sandbox_id)  # one that stopped is a 409, as above
            raise errors.SandboxFailed(f"guest agent of {sandbox_id} unreachable: {exc}") from exc
        entry.active += 1
        entry.touch()

        def finished(stream: ExecStream) -> None:
            entry.streams.discard(stream)
            entry.active -= 1
            entry.touch()

        stream = ExecStream(session, finished)
        entry.streams.add(stream)
        return stream

    async def write_file(self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes]) -> int:
        entry = self.registry.running_entry(sandbox_id)
        check_path(path)
        async with _activity(entry), guest_file_errors(sandbox_id):
            return await self.registry.runtime.guest(entry.record).write_file(path, chunks)

    @contextlib.asynccontextmanager
    async def read_file(
        self, sandbox_id: str, path: str
    ) -> AsyncIterator[tuple[int | None, AsyncIterator[bytes]]]:
        """Yields (size or None, chunk iterator); errors are raised on entering."""
        entry = self.registry.running_entry(sandbox_id)
        check_path(path)
        async with _activity(entry):
            download = self.registry.runtime.guest(entry.record).read_file(path)
            async with guest_file_errors(sandbox_id):
                await download.__aenter__()
            try:
                yield download.size, aiter(download)
            finally:
                await download.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def _activity(entry: Entry) -> AsyncIterator[None]:
    entry.active += 1
    entry.touch()
    try:
        yield
    finally:
        entry.active -= 1
        entry.touch()
