"""The control plane's only door to host agents: :class:`paddock_hostagent.client.HostAgentClient`.

This module adapts that client to what the domain needs and maps its errors to ours by one table
(``DOMAIN_ERRORS``): a sandbox the host does not know :class:`SandboxGoneError`, a host without room
:class:`CapacityError`, guest file errors 404/400 domain errors, anything else (transport failures
included) :class:`HostError`. Every call carries the current request's id to the host agent's log.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.records.models import Host, Sandbox
from paddock_controlplane.records.services import Services
from paddock_core import errors
from paddock_core.http import current_request_id
from paddock_hostagent import client as hostclient
from paddock_hostagent.schemas import (
    BandwidthResult,
    BuildBody,
    BuildView,
    CreateSandboxBody,
    DiskMountBody,
    DiskMountView,
    ForkBody,
    HostStats,
    NetworkAttachBody,
    ProcessFrame,
    ProcessInputResult,
    ProcessList,
    ProcessResizeBody,
    ProcessSignalBody,
    ProcessStartBody,
    ProcessStreamBody,
    ProcessView,
    SandboxLog,
    SnapshotView,
    VolumeCloneBody,
    VolumeCreateBody,
    VolumeDirBody,
    VolumeEntry,
    VolumeEntryMetadata,
    VolumeMetadataBody,
    VolumeMountBody,
    VolumeMountView,
    VolumeView,
)


class HostError(Exception):
    """The host could not do what was asked (unreachable, or the runtime failed)."""


class CapacityError(HostError):
    """The host has no room for this sandbox now (its 507): place it elsewhere, or answer 503."""


#: The one message of the busy 503 (a sandbox's guest takes no more connections now; Retry-After 1).
SANDBOX_BUSY = "the sandbox is busy with other requests; retry"


class TierRefusedError(errors.InvalidState):
    """The host's isolation tier does not offer what was asked (its 409 ``unsupported_on_tier``, in its
    words, naming the tier and the operation); nothing changed there. A 409 ``INVALID_STATE``."""


#: What the VM tier does not offer, in its host's words (drivers/qemu.py; docs/isolation.md). A host
#: refuses these itself; the control plane asks a host's labels first only where it would not call the
#: host at once: a paused sandbox's resize (recorded, not sent), a disk mounted in the background.
DISK_RESIZE = "growing a sandbox's disk"
S3_DISKS = "mounting an S3 disk"
_NOT_ON_VMS = {
    DISK_RESIZE: "the VM's kernel sees its disk's size at boot",
    S3_DISKS: "the VM has its own kernel, and the host cannot mount into it",
}


async def check_tier(session: AsyncSession, host_id: str | None, operation: str) -> None:
    """Raises :class:`TierRefusedError` when the sandbox's host runs the VM tier, which does not offer
    ``operation``."""
    host = await session.get(Host, host_id) if host_id else None
    if host is not None and (host.labels or {}).get("paddock.io/isolation") == "vm":
        why = _NOT_ON_VMS.get(operation)
        if why is not None:
            raise TierRefusedError(f"{operation} is not supported on the vm isolation tier: {why}")


#: The longest one host call that copies a disk or a volume (a snapshot, a volume's copy) runs before
#: its caller gives up: the client's connect and read timeouts, since the agent answers only once the
#: copy is whole. A copy's row older than its calls' bound has no live caller left.
COPY_CALL_BOUND_S = hostclient.CREATE_TIMEOUT_S + hostclient.CONNECT_TIMEOUT_S


class SandboxGoneError(Exception):
    """The sandbox disappeared from its host mid-operation (for example paused or destroyed)."""


@dataclass(frozen=True)
class Booted:
    ip: str
    spawn_ms: float


@dataclass(frozen=True)
class Held:
    """A sandbox as its host holds it now (``status``: running, paused or stopped; ``hibernated``: paused
    with only its disk kept)."""

    status: str
    ip: str
    hibernated: bool = False


class HostLostError(HostError):
    """The host did not answer (a dead agent, a dropped connection): what it did is not known yet."""


@dataclass(frozen=True)
class Usage:
    """A sandbox's bandwidth as its host counts it in the kernel."""

    egress_bytes: int
    ingress_bytes: int
    capped: bool

    @classmethod
    def of(cls, counted: BandwidthResult) -> Usage:
        return cls(counted.egress_bytes, counted.ingress_bytes, counted.capped)


@dataclass
class Download:
    size: int | None
    chunks: AsyncIterator[bytes]


#: The client's errors (``paddock_hostagent.client``) to ours; the most specific class listed wins.
DOMAIN_ERRORS: dict[type[hostclient.HostAgentError], Callable[[hostclient.HostAgentError], Exception]] = {
    hostclient.SandboxMissingError: lambda exc: SandboxGoneError(str(exc) or "sandbox is gone from its host"),
    hostclient.InsufficientCapacityError: lambda exc: CapacityError(
        str(exc) or "no capacity left on the host"
    ),
    hostclient.GuestFileNotFoundError: lambda exc: errors.NotFound("file not found"),
    hostclient.ParentNotFoundError: lambda exc: errors.NotFound("parent directory not found"),
    hostclient.IsDirectoryError: lambda exc: errors.ValidationFailed.field("path", "is a directory"),
    # The guest's reason: read-only, special file, too long …
    hostclient.BadPathError: lambda exc: errors.ValidationFailed.field(
        "path", str(exc) or "cannot be written"
    ),
    # Managed processes (§12.2): the guest's refusals, in the words of the guest.
    hostclient.ProcessMissingError: lambda exc: errors.NotFound("process not found"),
    hostclient.ProcessStateError: lambda exc: errors.InvalidState(
        str(exc) or "the process cannot do that now"
    ),
    # An operation the sandbox's isolation tier does not offer (the host's words name both): nothing
    # changed there, so a 409 the caller can act on, not a 500.
    hostclient.UnsupportedOnTierError: lambda exc: TierRefusedError(str(exc)),
    # The user to run as is not in the sandbox's /etc/passwd (the guest's words; nothing ran).
    hostclient.UnknownUserError: lambda exc: errors.ValidationFailed.field(
        "user", str(exc).removeprefix("user: ") or "no such user in the sandbox"
    ),
    hostclient.SpawnFailedError: lambda exc: errors.ValidationFailed.field(
        "cmd", str(exc) or "did not start"
    ),
    # Overload of one sandbox (its guest takes no more connections now): the caller may retry.
    hostclient.HostBusyError: lambda exc: errors.Unavailable(SANDBOX_BUSY, retry_after_s=1),
    hostclient.TooLargeError: lambda exc: errors.PayloadTooLarge(str(exc) or "over the host's limit"),
    hostclient.SandboxDiskFullError: lambda exc: errors.InsufficientStorage(
        "the sandbox's disk is full: nothing was written; free space in the sandbox or resize its disk"
    ),
    hostclient.HostAgentError: lambda exc: HostError(str(exc) or type(exc).__name__),
}


def domain_error(exc: hostclient.HostAgentError) -> Exception:
    for cls in type(exc).__mro__:
        make = DOMAIN_ERRORS.get(cls)
        if make is not None:
            return make(exc)
    raise AssertionError("HostAgentError is in the table")  # pragma: no cover


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except hostclient.HostAgentError as exc:
        raise domain_error(exc) from None


class HostLinkAPI(Protocol):
    """What the domain may ask of a sandbox's host. :class:`HostLink` implements it over the host
    agent's client; the control plane's unit tests implement it with a fake (tests/controlplane/
    fakehost.py), which mypy holds to this declaration."""

    #: The host's runtime (``paddock.io/runtime``) when its link was made: a VM host's boots get the
    #: longer deadline (``vm_boot_timeout_s``). A host that comes back under another runtime gets a
    #: new link (:func:`forget_if_changed`).
    runtime: str | None

    async def create(
        self,
        sandbox: Sandbox,
        *,
        start_paused: bool,
        networks: Sequence[NetworkAttachBody] = (),
        disks: Sequence[DiskMountBody] = (),
    ) -> Booted: ...

    async def fork(
        self,
        source: Sandbox,
        child: Sandbox,
        *,
        start_paused: bool,
        networks: Sequence[NetworkAttachBody] = (),
    ) -> Booted: ...

    async def destroy(self, sandbox_id: str) -> None: ...

    async def inspect(self, sandbox_id: str) -> Held | None:
        """The sandbox as the host holds it, ``None`` when the host has no such sandbox."""
        ...

    async def pause(self, sandbox_id: str) -> None: ...

    async def resume(self, sandbox_id: str, *, disk_mib: int) -> None: ...

    async def resize(self, sandbox_id: str, disk_mib: int) -> None: ...

    async def attach_network(self, sandbox_id: str, *, network_id: str, ip: str, prefixlen: int) -> None: ...

    async def detach_network(self, sandbox_id: str, network_id: str) -> None: ...

    async def attach_disk(self, sandbox_id: str, body: DiskMountBody) -> DiskMountView: ...

    async def detach_disk(self, sandbox_id: str, mount_path: str) -> None: ...

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> None: ...

    async def bandwidth(self, sandbox_id: str) -> Usage: ...

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> Usage: ...

    async def exec(
        self,
        sandbox_id: str,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        stdin: str | None,
        *,
        user: str | None = None,
    ) -> dict[str, Any]: ...

    def exec_stream(
        self,
        sandbox_id: str,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        stdin: str | None,
        *,
        user: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]: ...

    async def upload(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> dict[str, Any]: ...

    async def download(self, sandbox_id: str, path: str) -> Download: ...

    async def start_build(self, body: BuildBody) -> BuildView: ...

    async def get_build(self, build_id: str, *, after: int) -> BuildView: ...

    async def delete_build(self, build_id: str) -> None: ...

    async def fetch_image(self, image: str, source_url: str, limit_bytes: int | None = None) -> None: ...

    # -- managed processes (§12.2) --

    async def start_process(self, sandbox_id: str, body: ProcessStartBody) -> ProcessView: ...

    async def list_processes(self, sandbox_id: str) -> ProcessList: ...

    async def get_process(self, sandbox_id: str, process_id: str) -> ProcessView: ...

    async def kill_process(self, sandbox_id: str, process_id: str, grace_ms: int) -> ProcessView: ...

    async def process_input(
        self, sandbox_id: str, process_id: str, data_base64: str
    ) -> ProcessInputResult: ...

    async def close_process_stdin(self, sandbox_id: str, process_id: str) -> None: ...

    async def resize_process(
        self, sandbox_id: str, process_id: str, body: ProcessResizeBody
    ) -> ProcessView: ...

    async def signal_process(
        self, sandbox_id: str, process_id: str, body: ProcessSignalBody
    ) -> ProcessView: ...

    async def wait_process(
        self, sandbox_id: str, process_id: str, *, scope: str, timeout_ms: int
    ) -> ProcessView: ...

    async def connect_process(
        self, sandbox_id: str, process_id: str, after: int
    ) -> AsyncGenerator[ProcessFrame, None]: ...

    async def start_streaming(
        self, sandbox_id: str, body: ProcessStreamBody
    ) -> tuple[ProcessView, AsyncGenerator[ProcessFrame, None]] | None: ...


class HostLink(HostLinkAPI):
    def __init__(self, url: str, client: hostclient.HostAgentClient, runtime: str | None = None) -> None:
        self.url = url
        self.client = client
        self.runtime = runtime

    async def aclose(self) -> None:
        """Closes the client: its HTTP sessions and its kept channel."""
        await self.client.aclose()

    async def create(
        self,
        sandbox: Sandbox,
        *,
        start_paused: bool,
        networks: Sequence[NetworkAttachBody] = (),
        disks: Sequence[DiskMountBody] = (),
    ) -> Booted:
        with _mapped():
            out = await self.client.create_sandbox(
                CreateSandboxBody(
                    id=sandbox.id,
                    name=sandbox.name,
                    rootfs=sandbox.rootfs,
                    vcpu=sandbox.vcpu,
                    mem_mib=sandbox.mem_mib,
                    cpu_quota_pct=sandbox.cpu_quota_pct,
                    disk_mib=sandbox.disk_mib,
                    start_paused=start_paused,
                    egress=list(sandbox.egress or []),
                    bandwidth_quota_bytes=int(sandbox.bandwidth_quota_bytes),
                    networks=list(networks),
                    disks=list(disks),
                )
            )
        return Booted(ip=out.ip, spawn_ms=out.spawn_ms)

    async def fork(
        self,
        source: Sandbox,
        child: Sandbox,
        *,
        start_paused: bool,
        networks: Sequence[NetworkAttachBody] = (),
    ) -> Booted:
        with _mapped():
            out = await self.client.fork_sandbox(
                source.id,
                ForkBody(
                    new_id=child.id,
                    name=child.name,
                    start_paused=start_paused,
                    egress=list(child.egress or []),
                    bandwidth_quota_bytes=int(child.bandwidth_quota_bytes),
                    networks=list(networks),
                ),
            )
        return Booted(ip=out.ip, spawn_ms=out.spawn_ms)

    async def destroy(self, sandbox_id: str) -> None:
        with contextlib.suppress(SandboxGoneError), _mapped():
            await self.client.destroy_sandbox(sandbox_id)

    async def inspect(self, sandbox_id: str) -> Held | None:
        try:
            with _mapped():
                view = await self.client.get_sandbox(sandbox_id)
        except SandboxGoneError:
            return None
        return Held(status=view.status, ip=view.ip, hibernated=view.hibernated)

    async def stats(self) -> HostStats:
        """Every live sandbox's resource use on this host (the metrics worker's pull)."""
        with _mapped():
            return await self.client.stats()

    async def logs(self, sandbox_id: str, source: str, tail: int) -> SandboxLog:
        """The last ``tail`` lines of the sandbox's boot log or guest console (the logs route)."""
        with _mapped():
            return await self.client.logs(sandbox_id, source, tail)

    async def pause(self, sandbox_id: str) -> None:
        with _mapped():
            await self.client.pause_sandbox(sandbox_id)

    async def resume(self, sandbox_id: str, *, disk_mib: int) -> None:
        with _mapped():
            await self.client.resume_sandbox(sandbox_id)

    async def resize(self, sandbox_id: str, disk_mib: int) -> None:
        with _mapped():
            await self.client.resize_sandbox(sandbox_id, disk_mib)

    async def hibernate(self, sandbox_id: str) -> None:
        """Stops the sandbox on its host, keeping only its disk (docs/hibernation.md); a host that did
        not answer is :class:`HostLostError` (the hibernation may or may not have been committed)."""
        try:
            await self.client.hibernate_sandbox(sandbox_id)
        except hostclient.HostUnavailableError as exc:
            raise HostLostError(str(exc) or "the host did not answer") from None
        except hostclient.HostAgentError as exc:
            raise domain_error(exc) from None

    async def wake(self, sandbox_id: str) -> Booted:
        """Boots a hibernated sandbox from its kept disk; its address may be new."""
        with _mapped():
            woken = await self.client.wake_sandbox(sandbox_id)
        return Booted(ip=woken.ip, spawn_ms=woken.spawn_ms)

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotView:
        """Copies the sandbox's disk into the snapshot ``snapshot_id`` on this host."""
        with _mapped():
            return await self.client.snapshot_sandbox(sandbox_id, snapshot_id)

    async def held_snapshot(self, snapshot_id: str) -> SnapshotView | None:
        """The snapshot as this host keeps it when it is whole there; None when the host holds none, or
        only a half-written one (which never boots, and goes at the agent's next start)."""
        try:
            return await self.client.get_snapshot(snapshot_id)
        except hostclient.SandboxMissingError:  # its 404
            return None
        except hostclient.HostAgentError as exc:
            raise domain_error(exc) from None

    async def held_volume(self, volume_id: str) -> VolumeView | None:
        """The volume as this host keeps it, or None when the host holds no such volume (its 400 naming
        it; a host that did not answer raises)."""
        try:
            return await self.client.get_volume(volume_id)
        except hostclient.HostAgentError as exc:
            if exc.status in (400, 404):
                return None
            raise domain_error(exc) from None

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Removes the snapshot from this host; one that is not there is no error."""
        with _mapped():
            await self.client.delete_snapshot(snapshot_id)

    async def create_volume(self, volume_id: str, size_mib: int) -> VolumeView:
        """Makes the local volume ``volume_id`` (an XFS filesystem in a file) on this host."""
        with _mapped():
            return await self.client.create_volume(VolumeCreateBody(volume_id=volume_id, size_mib=size_mib))

    async def clone_volume(
        self, source_id: str, volume_id: str, *, snapshot_id: str | None = None
    ) -> VolumeView:
        """Makes the volume ``volume_id`` on this host, a copy of ``source_id`` as it is now (owned by
        the snapshot ``snapshot_id``, when one is named)."""
        body = VolumeCloneBody(volume_id=volume_id, snapshot_id=snapshot_id)
        with _mapped():
            return await self.client.clone_volume(source_id, body)

    async def resize_volume(self, volume_id: str, size_mib: int) -> VolumeView:
        with _mapped():
            return await self.client.resize_volume(volume_id, size_mib)

    async def delete_volume(self, volume_id: str) -> None:
        """Removes the volume from this host; one that is not there is no error."""
        with _mapped():
            await self.client.delete_volume(volume_id)

    # A volume's files without a sandbox (E2B's volume content API, edge/e2b/volume_content.py).

    async def stat_volume_path(self, volume_id: str, path: str) -> VolumeEntry:
        with _mapped():
            return await self.client.stat_volume_path(volume_id, path)

    async def list_volume_dir(self, volume_id: str, path: str, depth: int) -> list[VolumeEntry]:
        with _mapped():
            return (await self.client.list_volume_dir(volume_id, path, depth)).entries

    async def make_volume_dir(self, volume_id: str, body: VolumeDirBody) -> VolumeEntry:
        with _mapped():
            return await self.client.make_volume_dir(volume_id, body)

    async def read_volume_file(self, volume_id: str, path: str) -> bytes:
        with _mapped():
            return await self.client.read_volume_file(volume_id, path)

    async def write_volume_file(
        self, volume_id: str, path: str, data: bytes, metadata: VolumeEntryMetadata
    ) -> VolumeEntry:
        with _mapped():
            return await self.client.write_volume_file(volume_id, path, data, metadata)

    async def update_volume_path(self, volume_id: str, body: VolumeMetadataBody) -> VolumeEntry:
        with _mapped():
            return await self.client.update_volume_path(volume_id, body)

    async def remove_volume_path(self, volume_id: str, path: str) -> None:
        with _mapped():
            await self.client.remove_volume_path(volume_id, path)

    async def attach_volume(self, sandbox_id: str, body: VolumeMountBody) -> VolumeMountView:
        with _mapped():
            return await self.client.attach_volume(sandbox_id, body)

    async def detach_volume(self, sandbox_id: str, volume_id: str) -> None:
        with _mapped():
            await self.client.detach_volume(sandbox_id, volume_id)

    async def attach_network(self, sandbox_id: str, *, network_id: str, ip: str, prefixlen: int) -> None:
        with _mapped():
            await self.client.attach_network(sandbox_id, network_id=network_id, ip=ip, prefixlen=prefixlen)

    async def detach_network(self, sandbox_id: str, network_id: str) -> None:
        with _mapped():
            await self.client.detach_network(sandbox_id, network_id)

    async def attach_disk(self, sandbox_id: str, body: DiskMountBody) -> DiskMountView:
        with _mapped():
            return await self.client.attach_disk(sandbox_id, body)

    async def detach_disk(self, sandbox_id: str, mount_path: str) -> None:
        with _mapped():
            await self.client.detach_disk(sandbox_id, mount_path)

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> None:
        with _mapped():
            await self.client.set_egress(sandbox_id, rules)

    async def bandwidth(self, sandbox_id: str) -> Usage:
        with _mapped():
            return Usage.of(await self.client.get_bandwidth(sandbox_id))

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> Usage:
        with _mapped():
            return Usage.of(await self.client.set_bandwidth(sandbox_id, quota_bytes))

    async def exec(
        self,
        sandbox_id: str,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        stdin: str | None,
        *,
        user: str | None = None,
    ) -> dict[str, Any]:
        """The host's answer as its wire document (``{stdout, stderr, exit_code, error?, …}``);
        ``user`` (a name or uid of the sandbox's /etc/passwd) runs it as that user."""
        with _mapped():
            result = await self.client.exec(sandbox_id, cmd=cmd, args=args, env=env, stdin=stdin, user=user)
        return result.model_dump(exclude_none=True)

    async def exec_stream(
        self,
        sandbox_id: str,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        stdin: str | None,
        *,
        user: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        with _mapped():
            async for frame in self.client.exec_stream(
                sandbox_id, cmd=cmd, args=args, env=env, stdin=stdin, user=user
            ):
                yield frame

    async def upload(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> dict[str, Any]:
        with _mapped():
            written = await self.client.upload(sandbox_id, path, chunks)
        return written.model_dump()

    async def download(self, sandbox_id: str, path: str) -> Download:
        with _mapped():
            size, chunks = await self.client.download(sandbox_id, path)
        return Download(size=size, chunks=chunks)

    async def watch(
        self, sandbox_id: str, path: str, *, recursive: bool
    ) -> AsyncGenerator[dict[str, Any], None]:
        """A directory watch's lines from the guest's inotify (the host agent's ``watches.py``). Opening
        raises domain errors; :class:`TierRefusedError` when the sandbox's guest has no watch to give (the
        caller may poll); one later is raised by the iteration as :class:`HostError`."""
        with _mapped():
            lines = await self.client.watch(sandbox_id, path, recursive=recursive)
        return _mapped_lines(lines)

    async def start_build(self, body: BuildBody) -> BuildView:
        with _mapped():
            return await self.client.start_build(body)

    async def get_build(self, build_id: str, *, after: int) -> BuildView:
        """An attempt the host no longer knows (restarted) is :class:`SandboxGoneError`."""
        with _mapped():
            return await self.client.get_build(build_id, after=after)

    async def delete_build(self, build_id: str) -> None:
        with _mapped():
            await self.client.delete_build(build_id)

    async def fetch_image(self, image: str, source_url: str, limit_bytes: int | None = None) -> None:
        """The host pulls a template's image from the host agent at ``source_url``, which holds it,
        refusing more than ``limit_bytes`` of it."""
        with _mapped():
            await self.client.fetch_image(image, source_url, limit_bytes)

    # -- managed processes (§12.2) --

    async def start_process(self, sandbox_id: str, body: ProcessStartBody) -> ProcessView:
        with _mapped():
            return await self.client.start_process(sandbox_id, body)

    async def list_processes(self, sandbox_id: str) -> ProcessList:
        with _mapped():
            return await self.client.list_processes(sandbox_id)

    async def get_process(self, sandbox_id: str, process_id: str) -> ProcessView:
        with _mapped():
            return await self.client.get_process(sandbox_id, process_id)

    async def kill_process(self, sandbox_id: str, process_id: str, grace_ms: int) -> ProcessView:
        with _mapped():
            return await self.client.kill_process(sandbox_id, process_id, grace_ms)

    async def process_input(self, sandbox_id: str, process_id: str, data_base64: str) -> ProcessInputResult:
        with _mapped():
            return await self.client.process_input(sandbox_id, process_id, data_base64)

    async def close_process_stdin(self, sandbox_id: str, process_id: str) -> None:
        with _mapped():
            await self.client.close_process_stdin(sandbox_id, process_id)

    async def resize_process(self, sandbox_id: str, process_id: str, body: ProcessResizeBody) -> ProcessView:
        with _mapped():
            return await self.client.resize_process(sandbox_id, process_id, body)

    async def signal_process(self, sandbox_id: str, process_id: str, body: ProcessSignalBody) -> ProcessView:
        with _mapped():
            return await self.client.signal_process(sandbox_id, process_id, body)

    async def wait_process(
        self, sandbox_id: str, process_id: str, *, scope: str, timeout_ms: int
    ) -> ProcessView:
        with _mapped():
            return await self.client.wait_process(sandbox_id, process_id, scope=scope, timeout_ms=timeout_ms)

    async def connect_process(
        self, sandbox_id: str, process_id: str, after: int
    ) -> AsyncGenerator[ProcessFrame, None]:
        """Errors opening the stream are domain errors; one later is raised by the iteration as
        :class:`HostError`."""
        with _mapped():
            frames = await self.client.connect_process(sandbox_id, process_id, after)
        return _mapped_frames(frames)

    async def start_streaming(
        self, sandbox_id: str, body: ProcessStreamBody
    ) -> tuple[ProcessView, AsyncGenerator[ProcessFrame, None]] | None:
        """A start and its stream in one call (``start_process``, ``close_process_stdin`` and
        ``connect_process`` from 0 at once); ``None`` from an agent that predates it. Errors as
        ``connect_process``'s."""
        with _mapped():
            started = await self.client.start_streaming(sandbox_id, body)
        if started is None:
            return None
        view, frames = started
        return view, _mapped_frames(frames)


async def _mapped_frames(frames: AsyncGenerator[ProcessFrame, None]) -> AsyncGenerator[ProcessFrame, None]:
    try:
        with _mapped():
            async for frame in frames:
                yield frame
    finally:
        await frames.aclose()


async def _mapped_lines(lines: AsyncGenerator[dict[str, Any], None]) -> AsyncGenerator[dict[str, Any], None]:
    try:
        with _mapped():
            async for line in lines:
                yield line
    finally:
        await lines.aclose()


async def for_host(services: Services, host_id: str | None) -> HostLink:
    if host_id is None:
        raise HostError("sandbox has no host")
    links = services.hostlinks
    link = links.get(host_id)
    if not isinstance(link, HostLink):  # none yet (services.hostlinks holds HostLinks only)
        async with services.sessions() as session:
            host = await session.get(Host, host_id)
        if host is None:
            raise HostError(f"unknown host {host_id}")
        made_meanwhile = links.get(host_id)
        if isinstance(made_meanwhile, HostLink):
            # Another call made it while this one read the row: a second link would replace it and
            # leave its sessions open (a burst of creates to a new host made one each).
            return made_meanwhile
        link = HostLink(
            host.url,
            hostclient.HostAgentClient(
                host.url, services.settings.host_token.get_secret_value(), request_id=current_request_id
            ),
            runtime=(host.labels or {}).get("paddock.io/runtime"),
        )
        links[host_id] = link
    return link


def forget_if_changed(services: Services, host_id: str, url: str, runtime: str | None) -> None:
    """A host that re-registers at another address, or under another runtime, gets a fresh link; the
    old one's client is closed (its HTTP sessions and its kept channel, which would otherwise stay open
    until the far end or the channel's ping gave up). Calls still in flight to the old address fail as
    the move made them."""
    links = services.hostlinks
    link = links.get(host_id)
    if link is not None and (link.url != url or link.runtime != runtime):
        links.pop(host_id, None)
        services.tasks.spawn(link.aclose(), name=f"close the old link to {host_id}")


async def close_all(services: Services) -> None:
    links, services.hostlinks = services.hostlinks, {}
    for link in links.values():
        await link.aclose()
