"""A unit-test seam for the control plane's host link: records calls, boots instantly.

It implements ``hostlink.HostLinkAPI``, the interface :class:`hostlink.HostLink` implements over a real
host agent; the line at the end has mypy hold it to that declaration. Only the control plane's own
rules are tested with it; tests/integration drives real hosts.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_core import errors
from paddock_hostagent.schemas import (
    BuildBody,
    BuildLine,
    BuildView,
    DiskMountBody,
    DiskMountView,
    NetworkAttachBody,
)
from tests.controlplane.fakeprocesses import FakeProcesses

HOST_BEAT = {
    "id": "host-test-1",
    "url": "http://127.0.0.1:9",
    "free_mib": 64 * 1024,
    "total_mib": 64 * 1024,
    "vm_count": 0,
    "rootfses": ["debian:13"],
    "buildable": ["devbox:1"],
    "labels": {"zone": "a", "disk": "ssd"},
}


class FakeHostLink(FakeProcesses):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.runtime: str | None = None
        self.ips = (f"10.88.0.{n}" for n in itertools.count(2))
        self.fail_boot = False
        self.fail_network = False
        self.boot_delay_s = 0.0
        #: The host refuses creates as one does after a destroy of the id overtook the create: each
        #: create waits (up to 10 s) for that destroy, so a loaded box cannot answer it first.
        self.boot_gone = False
        self._destroyed: dict[str, asyncio.Event] = {}
        self.files: dict[tuple[str, str], bytes] = {}
        self.egress: dict[str, list[str]] = {}
        self.quotas: dict[str, int] = {}
        self.usage: dict[str, hostlink.Usage] = {}
        self.fail_egress = False
        # The memberships each create or fork asked the host to join during its boot.
        self.boot_networks: dict[str, list[str]] = {}
        # Mounts by (sandbox id, mount path); a disk whose bucket is named here fails with this error.
        self.disks: dict[tuple[str, str], DiskMountBody] = {}
        self.failing_buckets: dict[str, str] = {}
        self.mount_delay_s = 0.0
        self.builds: dict[str, BuildView] = {}
        # What the host holds, as ``inspect`` answers: booted by create or fork, gone with destroy.
        self.held: dict[str, hostlink.Held] = {}

    def _joins(self, sandbox_id: str, networks: Sequence[NetworkAttachBody]) -> None:
        """A create or fork joins its networks during the boot; the real host fails the boot (and undoes
        the sandbox) when one cannot be joined."""
        if networks and self.fail_network:
            raise hostlink.HostError("bridge exploded")
        self.boot_networks[sandbox_id] = [f"{n.network_id} {n.ip}/{n.prefixlen}" for n in networks]

    async def create(
        self,
        sandbox: Sandbox,
        *,
        start_paused: bool,
        networks: Sequence[NetworkAttachBody] = (),
        disks: Sequence[DiskMountBody] = (),
    ) -> hostlink.Booted:
        self.calls.append(("create", sandbox.id))
        self._joins(sandbox.id, networks)
        await asyncio.sleep(self.boot_delay_s)
        if self.fail_boot:
            raise hostlink.HostError("runtime exploded")
        if self.boot_gone:
            destroyed = self._destroyed.setdefault(sandbox.id, asyncio.Event())
            await asyncio.wait_for(destroyed.wait(), 10)
            raise hostlink.SandboxGoneError(f"sandbox {sandbox.id} was destroyed before its create arrived")
        return self._booted(sandbox.id, start_paused)

    def _booted(self, sandbox_id: str, start_paused: bool) -> hostlink.Booted:
        ip = next(self.ips)
        self.held[sandbox_id] = hostlink.Held(status="paused" if start_paused else "running", ip=ip)
        return hostlink.Booted(ip=ip, spawn_ms=1.0)

    async def fork(
        self,
        source: Sandbox,
        child: Sandbox,
        *,
        start_paused: bool,
        networks: Sequence[NetworkAttachBody] = (),
    ) -> hostlink.Booted:
        self.calls.append(("fork", child.id))
        self._joins(child.id, networks)
        await asyncio.sleep(self.boot_delay_s)
        return self._booted(child.id, start_paused)

    async def destroy(self, sandbox_id: str) -> None:
        self.calls.append(("destroy", sandbox_id))
        self.held.pop(sandbox_id, None)
        self._destroyed.setdefault(sandbox_id, asyncio.Event()).set()

    async def inspect(self, sandbox_id: str) -> hostlink.Held | None:
        self.calls.append(("inspect", sandbox_id))
        return self.held.get(sandbox_id)

    async def pause(self, sandbox_id: str) -> None:
        self.calls.append(("pause", sandbox_id))

    async def resume(self, sandbox_id: str, *, disk_mib: int) -> None:
        self.calls.append(("resume", sandbox_id))

    async def resize(self, sandbox_id: str, disk_mib: int) -> None:
        self.calls.append(("resize", sandbox_id))

    async def attach_network(self, sandbox_id: str, *, network_id: str, ip: str, prefixlen: int) -> None:
        self.calls.append(("attach_network", f"{sandbox_id} {network_id} {ip}/{prefixlen}"))
        if self.fail_network:
            raise hostlink.HostError("bridge exploded")

    async def detach_network(self, sandbox_id: str, network_id: str) -> None:
        self.calls.append(("detach_network", f"{sandbox_id} {network_id}"))
        if self.fail_network:
            raise hostlink.HostError("bridge exploded")

    async def attach_disk(self, sandbox_id: str, body: DiskMountBody) -> DiskMountView:
        self.calls.append(("attach_disk", f"{sandbox_id} {body.disk_id} {body.mount_path}"))
        await asyncio.sleep(self.mount_delay_s)
        error = self.failing_buckets.get(body.bucket)
        if error is None:
            self.disks[(sandbox_id, body.mount_path)] = body
        if error:
            return DiskMountView(
                disk_id=body.disk_id, mount_path=body.mount_path, status="error", error=error
            )
        return DiskMountView(disk_id=body.disk_id, mount_path=body.mount_path, status="mounted")

    async def detach_disk(self, sandbox_id: str, mount_path: str) -> None:
        self.calls.append(("detach_disk", f"{sandbox_id} {mount_path}"))
        self.disks.pop((sandbox_id, mount_path), None)

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> None:
        self.calls.append(("set_egress", sandbox_id))
        if self.fail_egress:
            raise hostlink.HostError("host agent answered 500")
        self.egress[sandbox_id] = list(rules)

    async def bandwidth(self, sandbox_id: str) -> hostlink.Usage:
        return self.usage.get(sandbox_id, hostlink.Usage(0, 0, False))

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> hostlink.Usage:
        self.calls.append(("set_bandwidth", sandbox_id))
        self.quotas[sandbox_id] = quota_bytes
        return await self.bandwidth(sandbox_id)

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
        self.calls.append(("exec", sandbox_id))
        if cmd == "printenv":
            return {
                "stdout": "".join(f"{k}={v}\n" for k, v in sorted(env.items())),
                "stderr": "",
                "exit_code": 0,
            }
        if cmd == "missing":
            return {"stdout": "", "stderr": "", "exit_code": -1, "error": "executable not found: missing"}
        return {"stdout": " ".join([cmd, *args]) + "\n", "stderr": "", "exit_code": 0}

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
        yield {"stdout": "one\n"}
        yield {"stderr": "two\n"}
        yield {"exit_code": 3}

    async def upload(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> dict[str, Any]:
        data = b"".join([c async for c in chunks])
        self.files[(sandbox_id, path)] = data
        return {"size": len(data)}

    async def download(self, sandbox_id: str, path: str) -> hostlink.Download:
        if (sandbox_id, path) not in self.files:
            raise errors.NotFound("file not found")
        data = self.files[(sandbox_id, path)]

        async def chunks() -> AsyncIterator[bytes]:
            yield data

        return hostlink.Download(size=len(data), chunks=chunks())

    # Template builds: an attempt ends ``ready`` at once unless its Dockerfile contains "FAIL" (failed)
    # or "HOLD" (building until ``release_build``).
    async def start_build(self, body: BuildBody) -> BuildView:
        self.calls.append(("start_build", body.id))
        failed = "FAIL" in body.dockerfile
        held = "HOLD" in body.dockerfile
        lines = [BuildLine(ts=0.0, level="info", line=f"STEP 1/1: attempt {body.attempt}")]
        if failed:
            lines.append(BuildLine(ts=0.0, level="error", line="RUN FAIL: exit status 1"))
        self.builds[body.id] = BuildView(
            id=body.id,
            attempt=body.attempt,
            status="failed" if failed else "building" if held else "ready",
            lines=lines,
            next=len(lines),
            ext4_size_bytes=0 if failed else 4096,
            error="exit status 1" if failed else None,
        )
        return self.builds[body.id]

    def release_build(self, build_id: str) -> None:
        """A held build ends ready."""
        self.builds[build_id] = self.builds[build_id].model_copy(update={"status": "ready"})

    async def get_build(self, build_id: str, *, after: int) -> BuildView:
        view = self.builds.get(build_id)
        if view is None:
            raise hostlink.SandboxGoneError("no build")
        return view.model_copy(update={"lines": view.lines[after:]})

    async def delete_build(self, build_id: str) -> None:
        self.calls.append(("delete_build", build_id))
        self.builds.pop(build_id, None)

    async def fetch_image(self, image: str, source_url: str, limit_bytes: int | None = None) -> None:
        self.calls.append(("fetch_image", image))


_: hostlink.HostLinkAPI = FakeHostLink()  # mypy: the fake keeps the interface's signatures
