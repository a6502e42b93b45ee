"""``SandboxProvider`` on the Paddock SDK (``paddock.AsyncClient``) — the production hosting backend.

Written against the SDK surface agreed with the control-plane work (``sandboxes.create(shape, rootfs,
ingress_enabled=True)``, ``sandbox.files.write``, ``sandbox.run``, ``pause/resume/destroy``,
``ingress_url_template``). The SDK did not exist yet when this was written, so this module is
**untested**; the gateway's tests use the local fake in ``tests/gateway/fakes.py``. SDK errors are
mapped here: transport failures → ``SandboxUnavailable``, everything else → ``SandboxError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from paddock_gateway.adapters.hosting import CommandResult, SandboxError, SandboxUnavailable

T = TypeVar("T")
WORKSPACE = "/workspace"


async def _mapped(call: Awaitable[T]) -> T:
    try:
        return await call
    except SandboxError:
        raise
    except Exception as exc:
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & {"TransportError", "ConnectError", "TimeoutException", "APIConnectionError", "OSError"}:
            raise SandboxUnavailable(str(exc)) from exc
        raise SandboxError(f"{type(exc).__name__}: {exc}") from exc


class _Files:
    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox

    async def write(self, path: str, data: bytes) -> None:
        await _mapped(self._sandbox.files.write(path, data))


class PaddockSandbox:
    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox
        self.id = str(sandbox.id)
        self.workspace = WORKSPACE
        self.ingress_url_template = str(getattr(sandbox, "ingress_url_template", "") or "")
        self.files = _Files(sandbox)

    async def run(
        self,
        cmd: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult:
        result = await _mapped(
            self._sandbox.run(cmd, list(args), env=dict(env or {}), cwd=cwd, timeout=timeout_s)
        )
        return CommandResult(
            exit_code=int(getattr(result, "exit_code", 1)),
            stdout=str(getattr(result, "stdout", "") or ""),
            stderr=str(getattr(result, "stderr", "") or ""),
        )

    async def pause(self) -> None:
        await _mapped(self._sandbox.pause())

    async def resume(self) -> None:
        await _mapped(self._sandbox.resume())

    async def destroy(self) -> None:
        await _mapped(self._sandbox.destroy())


class PaddockSandboxProvider:
    def __init__(self, base_url: str, api_key: str, *, shape: str, rootfs: str) -> None:
        import paddock

        self.client = paddock.AsyncClient(base_url=base_url, api_key=api_key)  # type: ignore[attr-defined]
        self.shape = shape
        self.rootfs = rootfs

    async def create(self, *, name: str, ingress_enabled: bool = True) -> PaddockSandbox:
        sandbox = await _mapped(
            self.client.sandboxes.create(
                shape=self.shape, rootfs=self.rootfs, ingress_enabled=ingress_enabled
            )
        )
        return PaddockSandbox(sandbox)

    async def get(self, sandbox_id: str) -> PaddockSandbox:
        return PaddockSandbox(await _mapped(self.client.sandboxes.get(sandbox_id)))

    async def aclose(self) -> None:
        await self.client.aclose()


class UnconfiguredSandboxProvider:
    """Used when the SDK cannot be loaded: every call reports the platform as unavailable."""

    def __init__(self, why: str) -> None:
        self.why = why

    async def create(self, *, name: str, ingress_enabled: bool = True) -> PaddockSandbox:
        raise SandboxUnavailable(self.why)

    async def get(self, sandbox_id: str) -> PaddockSandbox:
        raise SandboxUnavailable(self.why)

    async def aclose(self) -> None:
        return None
