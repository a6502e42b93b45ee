"""E2B's template start and ready commands: ``set_start_cmd``, ``set_ready_cmd``, and a Dockerfile's
``CMD``/``ENTRYPOINT`` under ``from_dockerfile`` (the SDK turns those into a start command).

E2B runs a template's start command once, at its build, polls its ready command until it exits 0, and
snapshots the running sandbox, so every sandbox of the template starts with the process already up.
Paddock's templates are image trees (a container keeps no memory in one), so the E2B edge does the
same at each create of such a template's sandbox: once it runs, the start command is started as a
sandbox process (``/bin/bash -l -c``, E2B's shell, under the template's USER, WORKDIR and ENV with the
create's ``envVars`` over them), and the create answers once the ready command has exited 0. The
process is the sandbox's own: ``commands.list()`` shows it and ``commands.connect(pid)`` reads it.
A fork on containers and gVisor starts its processes afresh, so each child runs it too before it is
answered (api.py's fork); a VM's fork keeps its source's memory, and the process with it.

As E2B's builder does:
- a start command without a ready command is ready after ``sleep 20`` (``DEFAULT_READY``);
- a ready command alone is polled with no process started;
- a start command that ends with a non-zero code before it is ready fails; one that ends with 0 (a
  daemon that forks away) leaves the ready command to decide;
- a template built ``fromTemplate`` without commands of its own inherits its parent's.

Where it differs, and why: the ready command is polled every 20 ms by one process in the sandbox
(E2B's builder: every 2 s, as a build's time, not a create's), and a create waits at most
``READY_TIMEOUT_S`` (E2B's build: 5 min), under the SDKs' 60 s request timeout so that the caller
gets this refusal rather than its own timeout. A create that does not get ready is refused with a 409 naming ``templateID``, with the start
command's last output, and the sandbox is destroyed: nothing is left running or billed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from dataclasses import dataclass
from typing import Any

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import envs
from paddock_core import errors
from paddock_hostagent.schemas import ProcessStartBody

#: E2B's ready command for a start command given without one (its builder's ``defaultReadyWait``).
DEFAULT_READY = "sleep 20"
#: The longest a create waits for the ready command: under the SDKs' 60 s request timeout.
READY_TIMEOUT_S = 50.0
#: Each of ``startCmd`` and ``readyCmd`` is at most this long (a shell line, not a script upload).
MAX_COMMAND_CHARS = 16384
#: How much of the start command's output a refusal quotes.
OUTPUT_TAIL_CHARS = 1000
#: E2B runs every command through a login shell.
SHELL = ("/bin/bash", "-l", "-c")
#: The poll, run in the sandbox as one login shell (E2B's, read once): the ready command (``$1``) in a
#: subshell of it (an ``exit`` in it, or a ``cd``, ends or changes only that try) until it exits 0,
#: every 20 ms, so a server that listens is seen within ~25 ms (a create waits on it).
READY_LOOP = 'until ( eval "$1" ); do sleep 0.02; done'
#: How long each wait on the poll lasts before the start command is looked at again.
WATCH_SLICE_MS = 250


@dataclass(frozen=True)
class StartCommand:
    """What a template's sandboxes run at their create: ``cmd`` ("" for a ready command alone) and the
    command whose exit 0 says it is ready."""

    cmd: str
    ready: str

    @classmethod
    def asked(cls, start_cmd: str | None, ready_cmd: str | None) -> StartCommand | None:
        """A build's ``startCmd`` and ``readyCmd`` with E2B's defaults; None when it asks neither."""
        if not start_cmd and not ready_cmd:
            return None
        return cls(start_cmd or "", ready_cmd or DEFAULT_READY)

    def as_json(self) -> dict[str, str]:
        return {"cmd": self.cmd, "ready": self.ready}

    @classmethod
    def from_json(cls, raw: Any) -> StartCommand | None:
        if not isinstance(raw, dict) or not isinstance(raw.get("ready"), str):
            return None
        return cls(str(raw.get("cmd") or ""), raw["ready"])


class NotReady(errors.InvalidState):
    """The template's start command failed, or its ready command did not pass in time."""


async def run(services: Services, sandbox: Sandbox, start: StartCommand, template: str) -> None:
    """Starts ``start.cmd`` in the running ``sandbox`` and returns once ``start.ready`` exits 0; raises
    :class:`NotReady` (409 naming ``templateID``) when the start command fails first or the ready
    command does not pass within ``READY_TIMEOUT_S``. The caller destroys the sandbox then."""
    link = await hostlink.for_host(services, sandbox.host_id)
    env = envs.open_sealed(services, sandbox)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT_S
    started = None
    if start.cmd:
        started = await link.start_process(
            sandbox.id, ProcessStartBody(cmd=SHELL[0], args=[*SHELL[1:], start.cmd], env=env)
        )
    # One process in the sandbox polls the ready command (the command its own argument, never spliced
    # into the script), so a poll costs a shell there, not a start and a wait through the host.
    poller = await link.start_process(
        sandbox.id,
        ProcessStartBody(cmd=SHELL[0], args=[*SHELL[1:], READY_LOOP, "ready", start.ready], env=env),
    )
    while True:
        left_ms = max(0, int((deadline - loop.time()) * 1000))
        polled = await link.wait_process(
            sandbox.id, poller.process_id, scope="leader", timeout_ms=min(left_ms, WATCH_SLICE_MS)
        )
        if polled.state in ("exited", "failed"):
            if polled.exit_code == 0:
                return
            raise NotReady(
                f"templateID: {template!r}'s ready command could not be polled (code {polled.exit_code})",
                fields={"templateID": "ready command failed"},
            )
        if started is not None:
            view = await link.get_process(sandbox.id, started.process_id)
            if view.state in ("exited", "failed") and view.exit_code != 0:
                await _stop(link, sandbox.id, poller.process_id)
                output = await _output_tail(link, sandbox.id, started.process_id)
                raise NotReady(
                    f"templateID: {template!r}'s start command exited with code {view.exit_code} "
                    f"before its ready command passed{_quoted(output)}",
                    fields={"templateID": "start command failed"},
                )
        if loop.time() >= deadline:
            await _stop(link, sandbox.id, poller.process_id)
            output = await _output_tail(link, sandbox.id, started.process_id) if started else ""
            raise NotReady(
                f"templateID: {template!r}'s ready command {start.ready!r} did not pass within "
                f"{READY_TIMEOUT_S:.0f} s{_quoted(output)}",
                fields={"templateID": "not ready in time"},
            )


async def _stop(link: hostlink.HostLinkAPI, sandbox_id: str, process_id: str) -> None:
    with contextlib.suppress(hostlink.HostError, errors.PaddockError):
        await link.kill_process(sandbox_id, process_id, grace_ms=0)


def _quoted(output: str) -> str:
    return f"; its output ends: {output.strip()!r}" if output.strip() else ""


async def _output_tail(link: hostlink.HostLinkAPI, sandbox_id: str, process_id: str) -> str:
    """The last ``OUTPUT_TAIL_CHARS`` of a process's stdout and stderr as the host kept them, read for at
    most 2 s (a process still running streams on)."""
    tail = ""
    with contextlib.suppress(TimeoutError, hostlink.HostError, errors.PaddockError):
        async with asyncio.timeout(2):
            frames = await link.connect_process(sandbox_id, process_id, 0)
            async with contextlib.aclosing(frames):
                async for frame in frames:
                    if frame.type in ("exit", "error"):
                        break
                    if frame.type == "data" and frame.data_base64:
                        with contextlib.suppress(binascii.Error):
                            chunk = base64.b64decode(frame.data_base64).decode(errors="replace")
                            tail = (tail + chunk)[-OUTPUT_TAIL_CHARS:]
    return tail
