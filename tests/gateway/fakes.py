"""A local stand-in for the sandbox surface: each "sandbox" is a directory and its commands are plain
processes on this machine, so deployments really run and answer on 127.0.0.1.

Test-only: there is no isolation at all. ``pause``/``resume`` stop and continue the sandbox's process
groups (SIGSTOP/SIGCONT), so a paused app accepts no requests, as a paused Paddock sandbox would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from paddock_gateway.adapters.hosting import CommandResult, SandboxError, SandboxUnavailable


class LocalFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def write(self, path: str, data: bytes) -> None:
        target = Path(path).resolve()
        if not target.is_relative_to(self.root):
            raise SandboxError(f"write outside the sandbox: {path}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


class LocalSandbox:
    def __init__(self, root: Path, ingress_url_template: str = "http://127.0.0.1:<port>") -> None:
        self.id = "sb-" + uuid.uuid4().hex[:12]
        self.root = root
        self.workspace = str(root)
        self.ingress_url_template = ingress_url_template
        self.files = LocalFiles(root)
        self.process_groups: set[int] = set()
        self.paused = False
        self.destroyed = False

    async def run(
        self,
        cmd: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        if self.destroyed:
            raise SandboxError("sandbox destroyed")
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root), "LANG": "C.UTF-8"}
        process = await asyncio.create_subprocess_exec(
            cmd,
            *args,
            cwd=cwd or str(self.root),
            env={**base, **(env or {})},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.process_groups.add(process.pid)
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            return CommandResult(exit_code=124, stderr="timed out")
        return CommandResult(
            exit_code=process.returncode or 0,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
        )

    def _signal(self, sig: signal.Signals) -> None:
        for pgid in list(self.process_groups):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                self.process_groups.discard(pgid)

    async def pause(self) -> None:
        self._signal(signal.SIGSTOP)
        self.paused = True

    async def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    async def destroy(self) -> None:
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        self.destroyed = True
        shutil.rmtree(self.root, ignore_errors=True)


class LocalSandboxProvider:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sandboxes: dict[str, LocalSandbox] = {}
        self.unavailable = False
        #: Where "ingress" points for new sandboxes: the app's own port on loopback by default.
        self.ingress_url_template = "http://127.0.0.1:<port>"

    async def create(self, *, name: str, ingress_enabled: bool = True) -> LocalSandbox:
        if self.unavailable:
            raise SandboxUnavailable("control plane unreachable (test switch)")
        assert ingress_enabled
        sandbox_root = (self.root / uuid.uuid4().hex[:12]).resolve()
        sandbox_root.mkdir(parents=True)
        sandbox = LocalSandbox(sandbox_root, self.ingress_url_template)
        self.sandboxes[sandbox.id] = sandbox
        return sandbox

    async def get(self, sandbox_id: str) -> LocalSandbox:
        if self.unavailable:
            raise SandboxUnavailable("control plane unreachable (test switch)")
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise SandboxError(f"no sandbox {sandbox_id}") from None

    async def aclose(self) -> None:
        for sandbox in self.sandboxes.values():
            if not sandbox.destroyed:
                await sandbox.destroy()
