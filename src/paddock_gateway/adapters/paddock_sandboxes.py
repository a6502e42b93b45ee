"""``SandboxProvider`` on the Paddock SDK (``paddock.AsyncClient``) — the production hosting backend.

Maps the gateway's sandbox surface onto the SDK: ``sandboxes.create(shape, rootfs=…, ingress_enabled=True)``,
``sandbox.write_file``, ``sandbox.run``, ``pause/resume/destroy`` and ``info.ingress_url_template``.

The exec API has no working directory or time limit, and its per-exec ``env`` may only override keys
declared on the sandbox (§11.5), so ``run`` wraps the command:

- ``env``: the variables are written to a file in the sandbox (``/tmp/.paddock-env-<random>``, mode
  0600) that a small ``sh`` prologue sources with ``set -a`` and deletes before it ``exec``s the command.
  The values never appear in an exec request, an argv or a log line;
- ``cwd``: ``cd "$dir"`` in the same prologue;
- ``timeout_s``: coreutils ``timeout -k 5``.

SDK errors are mapped here: ``paddock.TransportError`` → ``SandboxUnavailable``, any other
``paddock.PaddockError`` → ``SandboxError``. ``pause``/``resume``/``destroy`` are idempotent: a sandbox
already in the wanted state (or already gone, for destroy) is not an error. ``pause`` turns the
sandbox's ingress off before pausing and ``resume`` turns it on again after: the ingress proxy wakes a
paused sandbox on its first request, and a project paused for lack of credits must stay paused.

Exercised against a live control plane and host agent by ``tests/gateway/test_live_deploy.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shlex
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

import paddock
from paddock_core.logging import get_logger
from paddock_gateway.adapters.hosting import (
    CommandResult,
    SandboxAccessDenied,
    SandboxError,
    SandboxFiles,
    SandboxUnavailable,
    TemplateOutcome,
    TemplateRefused,
)

log = get_logger("paddock.gateway.sandboxes")
T = TypeVar("T")
WORKSPACE = "/workspace"
#: ``sh -c PROLOGUE sh <env file or ""> <cwd or ""> cmd args…``
PROLOGUE = (
    'if [ -n "$1" ]; then set -a; . "$1" || exit 126; set +a; rm -f "$1"; fi; '
    'if [ -n "$2" ]; then cd "$2" || exit 126; fi; shift 2; exec "$@"'
)


async def _mapped(call: Awaitable[T]) -> T:
    try:
        return await call
    except paddock.TransportError as exc:
        raise SandboxUnavailable(str(exc)) from exc
    except paddock.PaddockError as exc:
        raise SandboxError(f"{type(exc).__name__}: {exc}") from exc


def env_file(env: Mapping[str, str]) -> bytes:
    """Shell assignments for ``env`` (keys are already ``^[A-Za-z_][A-Za-z0-9_]*$``)."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items()).encode()


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

    @property
    def status(self) -> str:
        return self._sandbox.info.status

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
            argv = ["timeout", "-k", "5", str(max(1, int(timeout_s))), *argv]
        env_path = ""
        if env:
            env_path = f"/tmp/.paddock-env-{secrets.token_hex(8)}"
            await _mapped(self._sandbox.write_file(env_path, env_file(env)))
            await _mapped(self._sandbox.run("chmod", ["600", env_path]))
        if env_path or cwd:
            argv = ["sh", "-c", PROLOGUE, "sh", env_path, cwd or "", *argv]
        result: Any = await _mapped(self._sandbox.run(argv[0], argv[1:]))
        exit_code = int(result.exit_code)
        if result.error and exit_code == 0:
            exit_code = 1
        return CommandResult(
            exit_code=exit_code, stdout=result.stdout or "", stderr=result.stderr or result.error or ""
        )

    async def _transition(self, action: str, done: tuple[str, ...]) -> None:
        try:
            await getattr(self._sandbox, action)()
        except paddock.ConflictError as exc:
            info = await _mapped(self._sandbox.refresh())
            if info.status not in done:
                raise SandboxError(f"{action}: sandbox is {info.status}") from exc
        except paddock.TransportError as exc:
            raise SandboxUnavailable(str(exc)) from exc
        except paddock.PaddockError as exc:
            raise SandboxError(f"{type(exc).__name__}: {exc}") from exc

    async def pause(self) -> None:
        # Ingress off first: the ingress proxy resumes a paused sandbox on the first request, which
        # would let traffic undo a pause for lack of credits.
        await _mapped(self._sandbox.patch(ingress_enabled=False))
        await self._transition("pause", ("paused", "pausing"))

    async def resume(self) -> None:
        await self._transition("resume", ("running", "resuming"))
        await _mapped(self._sandbox.patch(ingress_enabled=True))

    async def destroy(self) -> None:
        try:
            await self._sandbox.destroy()
        except paddock.NotFoundError:
            return  # already gone
        except paddock.TransportError as exc:
            raise SandboxUnavailable(str(exc)) from exc
        except paddock.PaddockError as exc:
            raise SandboxError(f"{type(exc).__name__}: {exc}") from exc


class PaddockSandboxProvider:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        shape: str,
        rootfs: str,
        timeout_s: float = 960.0,
        create_attempts: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.client = paddock.AsyncClient(
            base_url=base_url, api_key=api_key or None, timeout=timeout_s, transport=transport
        )
        self.base_url = base_url
        self.shape = shape
        self.rootfs = rootfs
        self.create_attempts = max(1, create_attempts)

    async def create(
        self, *, name: str, ingress_enabled: bool = True, rootfs: str | None = None
    ) -> PaddockSandbox:
        """A running sandbox. A create the platform answers with a 5xx (a boot that failed on a host;
        the control plane has already cleaned that sandbox up) is tried again, up to
        ``create_attempts`` times in all: the paid deploy call should not fail on one bad boot."""
        # ``name`` is not forwarded: sandbox names are unique per control-plane user and a gateway
        # project name may come back after a delete; generated names avoid that collision.
        for attempt in range(1, self.create_attempts + 1):
            try:
                sandbox = await self.client.sandboxes.create(
                    self.shape, rootfs=rootfs or self.rootfs, ingress_enabled=ingress_enabled
                )
                return PaddockSandbox(sandbox)
            except paddock.ServerError as exc:
                if attempt == self.create_attempts:
                    raise SandboxError(f"{type(exc).__name__}: {exc}") from exc
                log.warning("sandbox_create_retry", attempt=attempt, error=str(exc))
                await asyncio.sleep(0.5 * attempt)
            except paddock.TransportError as exc:
                raise SandboxUnavailable(str(exc)) from exc
            except paddock.PaddockError as exc:
                raise SandboxError(f"{type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    async def check_access(self) -> None:
        """The control plane knows the gateway's key (``GET /v1/whoami``); a key from another database
        (a data directory moved from SQLite to PostgreSQL) is refused here, not after a payment."""
        try:
            await self.client.whoami()
        except paddock.AuthenticationError as exc:
            raise SandboxAccessDenied(
                f"the control plane at {self.base_url} refuses the gateway's API key (PADDOCK_GW_API_KEY)"
            ) from exc
        except paddock.TransportError as exc:
            raise SandboxUnavailable(str(exc)) from exc
        except paddock.PaddockError as exc:
            raise SandboxError(f"{type(exc).__name__}: {exc}") from exc

    async def submit_template(self, *, name: str, dockerfile: str, context: bytes) -> str:
        """Submits the build (``context``: a tar of the files COPY/ADD read); its id. A 4xx (the
        Dockerfile or context refused, the plan's template caps) is ``TemplateRefused``."""
        try:
            template = await self.client.templates.create(name, dockerfile, context=context)
        except paddock.TransportError as exc:
            raise SandboxUnavailable(str(exc)) from exc
        except paddock.APIError as exc:
            if 400 <= exc.status < 500:
                details = "; ".join(f"{key}: {value}" for key, value in exc.fields.items())
                raise TemplateRefused(f"{exc}" + (f" ({details})" if details else "")) from exc
            raise SandboxError(f"{type(exc).__name__}: {exc}") from exc
        except paddock.PaddockError as exc:
            raise SandboxError(f"{type(exc).__name__}: {exc}") from exc
        return template.id

    async def wait_template(self, template_id: str, *, timeout_s: float) -> TemplateOutcome:
        """Waits for the build to end; a failed one comes with the last lines of its log."""
        try:
            template = await _mapped(self.client.templates.wait(template_id, timeout_s=timeout_s))
        except SandboxError as exc:
            if not isinstance(exc.__cause__, paddock.WaitTimeoutError):
                raise
            return TemplateOutcome("failed", f"the image build did not finish within {timeout_s:.0f} s")
        if template.status == "ready":
            return TemplateOutcome("ready")
        text = await _mapped(self.client.templates.log_text(template_id))
        lines = []
        for raw in text.splitlines():
            with contextlib.suppress(ValueError):
                frame = json.loads(raw)
                if isinstance(frame, dict) and isinstance(frame.get("line"), str):
                    lines.append(frame["line"])
        return TemplateOutcome("failed", "\n".join(lines[-40:]))

    async def delete_template(self, template_id: str) -> None:
        try:
            await self.client.templates.delete(template_id)
        except paddock.NotFoundError:
            return
        except paddock.TransportError as exc:
            raise SandboxUnavailable(str(exc)) from exc
        except paddock.PaddockError as exc:
            raise SandboxError(f"{type(exc).__name__}: {exc}") from exc

    async def get(self, sandbox_id: str) -> PaddockSandbox:
        return PaddockSandbox(await _mapped(self.client.sandboxes.get(sandbox_id)))

    async def aclose(self) -> None:
        await self.client.aclose()
