"""The control plane's only door to host agents: :class:`paddock_hostagent.client.HostAgentClient`.

This module adapts that client to what the domain needs and maps its errors to ours:
transport failures become :class:`HostError`, a host without room :class:`CapacityError`; guest file
errors become 404/400 domain errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from paddock_controlplane.models import Host, Sandbox
from paddock_controlplane.services import Services
from paddock_core import errors
from paddock_hostagent import client as hostclient


class HostError(Exception):
    """The host could not do what was asked (unreachable, or the runtime failed)."""


class CapacityError(HostError):
    """The host has no room for this sandbox now (its 507): place it elsewhere, or answer 503."""


class SandboxGoneError(Exception):
    """The sandbox disappeared from its host mid-operation (for example paused or destroyed)."""


@dataclass(frozen=True)
class Booted:
    ip: str
    spawn_ms: float


@dataclass(frozen=True)
class Usage:
    """A sandbox's bandwidth as its host counts it in the kernel."""

    egress_bytes: int
    ingress_bytes: int
    capped: bool

    @classmethod
    def of(cls, data: dict[str, Any]) -> Usage:
        return cls(int(data["egress_bytes"]), int(data["ingress_bytes"]), bool(data["capped"]))


@dataclass
class Download:
    size: int | None
    chunks: AsyncIterator[bytes]


def _file_error(exc: Exception) -> errors.PaddockError | None:
    if isinstance(exc, hostclient.GuestFileNotFoundError):
        return errors.NotFound("file not found")
    if isinstance(exc, hostclient.ParentNotFoundError):
        return errors.NotFound("parent directory not found")
    if isinstance(exc, hostclient.IsDirectoryError):
        return errors.ValidationFailed.field("path", "is a directory")
    if isinstance(exc, hostclient.BadPathError):  # the guest's reason: read-only, special file, too long …
        return errors.ValidationFailed.field("path", str(exc) or "cannot be written")
    return None


class HostLink:
    def __init__(self, url: str, client: hostclient.HostAgentClient) -> None:
        self.url = url
        self.client = client

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except hostclient.SandboxMissingError as exc:
            raise SandboxGoneError(str(exc) or "sandbox is gone from its host") from None
        except hostclient.InsufficientCapacityError as exc:
            raise CapacityError(str(exc) or "no capacity left on the host") from None
        except hostclient.HostAgentError as exc:
            mapped = _file_error(exc)
            if mapped is not None:
                raise mapped from None
            raise HostError(str(exc) or type(exc).__name__) from None

    async def create(self, sandbox: Sandbox, *, start_paused: bool) -> Booted:
        out = await self._call(
            self.client.create_sandbox(
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
            )
        )
        return Booted(ip=str(out["ip"]), spawn_ms=float(out.get("spawn_ms", 0.0)))

    async def fork(self, source: Sandbox, child: Sandbox, *, start_paused: bool) -> Booted:
        out = await self._call(
            self.client.fork_sandbox(
                source.id,
                new_id=child.id,
                name=child.name,
                start_paused=start_paused,
                egress=list(child.egress or []),
                bandwidth_quota_bytes=int(child.bandwidth_quota_bytes),
            )
        )
        return Booted(ip=str(out["ip"]), spawn_ms=float(out.get("spawn_ms", 0.0)))

    async def destroy(self, sandbox_id: str) -> None:
        try:
            await self._call(self.client.destroy_sandbox(sandbox_id))
        except SandboxGoneError:
            return

    async def pause(self, sandbox_id: str) -> None:
        await self._call(self.client.pause_sandbox(sandbox_id))

    async def resume(self, sandbox_id: str, *, disk_mib: int) -> None:
        await self._call(self.client.resume_sandbox(sandbox_id))

    async def resize(self, sandbox_id: str, disk_mib: int) -> None:
        await self._call(self.client.resize_sandbox(sandbox_id, disk_mib))

    async def attach_network(self, sandbox_id: str, *, network_id: str, ip: str, prefixlen: int) -> None:
        await self._call(
            self.client.attach_network(sandbox_id, network_id=network_id, ip=ip, prefixlen=prefixlen)
        )

    async def detach_network(self, sandbox_id: str, network_id: str) -> None:
        await self._call(self.client.detach_network(sandbox_id, network_id))

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> None:
        await self._call(self.client.set_egress(sandbox_id, rules))

    async def bandwidth(self, sandbox_id: str) -> Usage:
        return Usage.of(await self._call(self.client.get_bandwidth(sandbox_id)))

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> Usage:
        return Usage.of(await self._call(self.client.set_bandwidth(sandbox_id, quota_bytes)))

    async def exec(
        self, sandbox_id: str, cmd: str, args: list[str], env: dict[str, str], stdin: str | None
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            self.client.exec(sandbox_id, cmd=cmd, args=args, env=env, stdin=stdin)
        )
        return result

    async def exec_stream(
        self, sandbox_id: str, cmd: str, args: list[str], env: dict[str, str], stdin: str | None
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            async for frame in self.client.exec_stream(sandbox_id, cmd=cmd, args=args, env=env, stdin=stdin):
                yield frame
        except hostclient.SandboxMissingError as exc:
            raise SandboxGoneError(str(exc) or "sandbox is gone") from None
        except hostclient.HostAgentError as exc:
            raise HostError(str(exc) or type(exc).__name__) from None

    async def upload(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(self.client.upload(sandbox_id, path, chunks))
        return result

    async def download(self, sandbox_id: str, path: str) -> Download:
        size, chunks = await self._call(self.client.download(sandbox_id, path))
        return Download(size=size, chunks=chunks)


async def for_host(services: Services, host_id: str | None) -> HostLink:
    if host_id is None:
        raise HostError("sandbox has no host")
    links = services.hostlinks
    link = links.get(host_id)
    if link is None:
        async with services.sessions() as session:
            host = await session.get(Host, host_id)
        if host is None:
            raise HostError(f"unknown host {host_id}")
        link = HostLink(
            host.url, hostclient.HostAgentClient(host.url, services.settings.host_token.get_secret_value())
        )
        links[host_id] = link
    return link


def forget_if_moved(services: Services, host_id: str, url: str) -> None:
    """A host that re-registers at another address gets a fresh client."""
    links = services.hostlinks
    link = links.get(host_id)
    if link is not None and link.url != url:
        links.pop(host_id, None)


async def close_all(services: Services) -> None:
    links, services.hostlinks = services.hostlinks, {}
    for link in links.values():
        await link.client.aclose()
