"""``SandboxProvider`` on the Paddock SDK (``paddock.AsyncClient``) — the production hosting backend.

Maps the gateway's sandbox surface onto the SDK: ``sandboxes.create(shape, rootfs=…, ingress_enabled=True)``,
``sandbox.write_file``, ``sandbox.run``, ``pause/resume/destroy`` and ``info.ingress_url_template``.
The exec API has no working directory or time limit, so ``run`` wraps the command in
``sh -c 'cd "$1" && shift && exec "$@"'`` and coreutils ``timeout``. SDK errors are mapped here:
``paddock.TransportError`` → ``SandboxUnavailable``, any other ``paddock.PaddockError`` → ``SandboxError``.

Not yet covered by an integration test against a running control plane (the gateway's own tests use
the local fake in ``tests/gateway/fakes.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import paddock
from paddock_gateway.adapters.hosting import CommandResult, SandboxError, SandboxFiles, SandboxUnavailable

T = TypeVar("T")
WORKSPACE = "/workspace"
CD_AND_EXEC = 'cd "$1" && shift && exec "$@"'


async def _mapped(call: Awaitable[T]) -> T:
    try:
        return await call
    except paddock.TransportError as exc:
        raise SandboxUnavailable(str(exc)) from exc
    except paddock.PaddockError as exc:
        raise SandboxError(f"{type(exc).__name__}: {exc}") from exc


class _Files:
    def __init__(self, sandbox: paddock.AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def write(self, path: str, data: bytes) -> None:
        await _mapped(self._sandbox.write_file(path, data))


class PaddockSandbox:
    def __init__(self, sandbox: paddock.AsyncSandbox) -> None:
        self._sandbox = sandbox
        self.id = sandbox.id
        self.workspace = WORKSPACE
        self.ingress_url_template = sandbox.info.ingress_url_template or ""
        self.files: SandboxFiles = _Files(sandbox)

    async def run(
        self,
        cmd: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        argv = [cmd, *args]
        if timeout_s:
            argv = ["timeout", "-k", "5", str(int(timeout_s)), *argv]
        if cwd:
            argv = ["sh", "-c", CD_AND_EXEC, "sh", cwd, *argv]
        result: Any = await _mapped(self._sandbox.run(argv[0], argv[1:], env=dict(env) if env else None))
        exit_code = int(result.exit_code)
        if result.error and exit_code == 0:
            exit_code = 1
        return CommandResult(
            exit_code=exit_code, stdout=result.stdout or "", stderr=result.stderr or result.error or ""
        )

    async def pause(self) -> None:
        await _mapped(self._sandbox.pause())

    async def resume(self) -> None:
        await _mapped(self._sandbox.resume())

    async def destroy(self) -> None:
        await _mapped(self._sandbox.destroy())


class PaddockSandboxProvider:
    def __init__(
        self, base_url: str, api_key: str, *, shape: str, rootfs: str, timeout_s: float = 960.0
    ) -> None:
        self.client = paddock.AsyncClient(base_url=base_url, api_key=api_key or None, timeout=timeout_s)
        self.shape = shape
        self.rootfs = rootfs

    async def create(self, *, name: str, ingress_enabled: bool = True) -> PaddockSandbox:
        # ``name`` is not forwarded: sandbox names are unique per control-plane user and a gateway
        # project name may come back after a delete; generated names avoid that collision.
        sandbox = await _mapped(
            self.client.sandboxes.create(self.shape, rootfs=self.rootfs, ingress_enabled=ingress_enabled)
        )
        return PaddockSandbox(sandbox)

    async def get(self, sandbox_id: str) -> PaddockSandbox:
        return PaddockSandbox(await _mapped(self.client.sandboxes.get(sandbox_id)))

    async def aclose(self) -> None:
        await self.client.aclose()
