"""An E2B sandbox whose processes start afresh runs its template's start command again.

E2B keeps a sandbox's memory across a fork, a pause and a snapshot, so the process its template's
start command started (``set_start_cmd``) is running in each. Paddock's containers and gVisor keep no
memory in those cases: a fork boots a copy of the disk, a wake from hibernation
(``pause(mode="filesystem")``, docs/hibernation.md) boots the kept disk, and a create from a snapshot
boots the disk it holds (``api.create``). There the start command runs again, and the call that made
or woke the sandbox answers once its ready command passes, as a create does (``start_command.run``).
A VM keeps its memory through each, and with it the process.

A create that fails its start command destroys the sandbox it made; a fork does the same with its
child. A wake cannot: the sandbox holds the user's files. It stays running, and the explicit connect
answers 409 naming ``templateID`` with the start command's output; an SDK call or port traffic that
woke it goes on (its own answer shows what is missing) and the failure is logged."""

from __future__ import annotations

from paddock_controlplane.edge.e2b import start_command, store
from paddock_controlplane.edge.e2b import templates as e2b_templates
from paddock_controlplane.hosts import hosts
from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import SandboxStatus
from paddock_controlplane.sandboxes import suspension
from paddock_core.logging import get_logger

log = get_logger(__name__)


async def command_for(
    services: Services, user_id: str, sandbox: Sandbox
) -> start_command.StartCommand | None:
    """The start command ``sandbox``'s template asked, where the sandbox's processes start afresh
    (containers, gVisor); None for a template without one, and on a VM, which keeps its memory."""
    start = await e2b_templates.start_of(services, user_id, sandbox.rootfs)
    if start is None:
        return None
    async with services.sessions() as session:
        host = await session.get(Host, sandbox.host_id) if sandbox.host_id else None
    return None if hosts.runtime_of(host) in hosts.VM_RUNTIMES else start


async def _hibernated(services: Services, sandbox_id: str) -> bool:
    """Whether the sandbox is an E2B one (a ``/v1`` create runs no start command, so its wake runs none
    either) and hibernated."""
    async with services.sessions() as session:
        row = await session.get(Sandbox, sandbox_id)
        if row is None or row.status != SandboxStatus.PAUSED or not row.hibernated:
            return False
        return await store.get(session, sandbox_id) is not None


async def _start_if_woken(
    services: Services, user_id: str, woken: bool, resumed: Sandbox, template_id: str
) -> None:
    """Runs the template's start command in ``resumed`` if it was woken from hibernation and runs."""
    if woken and resumed.status == SandboxStatus.RUNNING:
        start = await command_for(services, user_id, resumed)
        if start is not None:
            await start_command.run(services, resumed, start, template_id)


async def resume(services: Services, user_id: str, sandbox_id: str, template_id: str) -> Sandbox:
    """``suspension.resume``; a sandbox woken from hibernation then runs its template's start command
    (``start_command.NotReady``, 409, when it fails: the sandbox stays running)."""
    woken = await _hibernated(services, sandbox_id)
    resumed = await suspension.resume(services, user_id, sandbox_id)
    await _start_if_woken(services, user_id, woken, resumed, template_id)
    return resumed


async def resume_on_activity(services: Services, user_id: str, sandbox_id: str) -> Sandbox:
    """``store.resume_on_activity`` (an SDK call or port traffic found the sandbox paused); a sandbox
    woken from hibernation then runs its template's start command before the activity goes on. One that
    fails is logged, and the activity goes on."""
    woken = await _hibernated(services, sandbox_id)
    resumed = await store.resume_on_activity(services, user_id, sandbox_id)
    try:
        await _start_if_woken(services, user_id, woken, resumed, resumed.rootfs)
    except start_command.NotReady as exc:
        log.warning("e2b_start_command_failed_after_wake", sandbox_id=sandbox_id, error=exc.message)
    return resumed
