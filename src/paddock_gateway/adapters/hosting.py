"""The hosting side, as the gateway sees it: ``HostingPlatform`` (projects and deployments) and, below
it, the sandbox surface (``SandboxProvider`` / ``Sandbox``) that ``sandbox_hosting.SandboxHosting``
builds deployments on.

The sandbox surface mirrors the Paddock SDK's names so the SDK-backed provider is a thin wrapper:

    SDK                                             here
    client.sandboxes.create(shape, rootfs,          SandboxProvider.create(name=…, ingress_enabled=True)
                            ingress_enabled=True)
    client.sandboxes.get(id)                        SandboxProvider.get(sandbox_id)
    sandbox.files.write(path, bytes)                Sandbox.files.write(path, data)
    sandbox.run(cmd, args)                          Sandbox.run(cmd, args, env=…, cwd=…, timeout_s=…)
    sandbox.pause() / resume() / destroy()          the same
    sandbox.ingress_url_template ("…<port>…")       Sandbox.ingress_url_template
    client.templates.create(name, dockerfile,       TemplateProvider.submit_template(name=…, dockerfile=…,
                            context=tar)                                             context=…)
    client.templates.wait(id) + log_text(id)        TemplateProvider.wait_template(id, timeout_s=…)
    client.templates.delete(id)                     TemplateProvider.delete_template(id)

A provider that builds Dockerfiles also implements ``TemplateProvider``, and its ``create`` takes
``rootfs=`` (the template's id) for the sandbox booted from the result.

Errors below this line are the provider's business: it raises ``SandboxUnavailable`` when the control
plane cannot be reached, ``SandboxAccessDenied`` when it refuses the gateway's key and ``SandboxError``
when it refuses an operation; ``SandboxHosting`` turns them into ``HostingUnavailable`` /
``HostingAccessDenied`` / ``HostingError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class HostingError(Exception):
    """The hosting platform refused or failed an operation."""


class HostingUnavailable(HostingError):
    """The hosting platform could not be reached; nothing changed."""


class HostingAccessDenied(HostingUnavailable):
    """The hosting platform refuses the gateway's own credentials; nothing can be deployed until an
    operator fixes them."""


class SandboxError(Exception):
    """A sandbox operation failed (raised by ``SandboxProvider`` implementations)."""


class SandboxUnavailable(SandboxError):
    """The control plane could not be reached."""


class SandboxAccessDenied(SandboxError):
    """The control plane refuses the gateway's API key (401)."""


class TemplateRefused(SandboxError):
    """The platform refused the Dockerfile or its context (4xx): the user's upload is at fault, and the
    message says why."""


@dataclass(frozen=True)
class ProjectSpec:
    name: str  # uniqueName, the public host name
    display_name: str
    description: str | None
    wallet: str  # lowercase


@dataclass(frozen=True)
class UploadedFile:
    path: str  # relative POSIX path, already validated
    data: bytes


@dataclass(frozen=True)
class DeployOptions:
    """The request's ``settings`` merged over the contract's defaults (§5.3.2)."""

    port: int = 3000
    runtime: str = "build-ai"
    use_build_ai: bool = True
    has_dockerfile: bool = False
    framework: str | None = None
    install_command: str | None = None
    build_command: str | None = None
    run_command: str | None = None
    build_dir: str | None = None
    build_flag: str | None = None
    run_flag: str | None = None
    directory_path: str | None = None
    run_envs: dict[str, str] = field(default_factory=dict)
    build_vars: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DeploymentHandle:
    project_id: str
    deployment_id: str


@dataclass(frozen=True)
class DeploymentState:
    """The platform's view: a lowercase ``status`` (queued, building, deploying, active, sleeping,
    failed …), the public ``url`` once known and a failure ``message``."""

    status: str
    url: str | None = None
    message: str | None = None


@runtime_checkable
class AccessCheck(Protocol):
    """Implemented by platforms (and sandbox providers) that can prove their credentials work: the
    gateway asks before it quotes or takes a payment, and at start-up."""

    async def check_access(self) -> None: ...


class HostingPlatform(Protocol):
    async def create_deployment(
        self, project: ProjectSpec, files: Sequence[UploadedFile], options: DeployOptions
    ) -> DeploymentHandle: ...

    async def deployment_status(self, project_id: str, deployment_id: str) -> DeploymentState: ...

    async def pause_project(self, project_id: str) -> None: ...

    async def resume_project(self, project_id: str) -> None: ...

    async def delete_project(self, project_id: str) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str = ""
    stderr: str = ""


class SandboxFiles(Protocol):
    async def write(self, path: str, data: bytes) -> None: ...


class Sandbox(Protocol):
    id: str
    #: An absolute directory inside the sandbox that the gateway owns (``/workspace`` on Paddock).
    workspace: str
    #: The public URL of a port, with the literal ``<port>`` to replace.
    ingress_url_template: str
    files: SandboxFiles

    async def run(
        self,
        cmd: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
    ) -> CommandResult: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def destroy(self) -> None: ...


class SandboxProvider(Protocol):
    async def create(self, *, name: str, ingress_enabled: bool = True, rootfs: str | None = None) -> Sandbox:
        """A running sandbox; ``rootfs`` (a template id from ``TemplateProvider``) overrides the
        provider's image."""
        ...

    async def get(self, sandbox_id: str) -> Sandbox: ...

    async def aclose(self) -> None: ...


def ingress_url(sandbox: Sandbox, port: int) -> str:
    return sandbox.ingress_url_template.replace("<port>", str(port))


@dataclass(frozen=True)
class TemplateOutcome:
    """How a template build ended: ``ready`` or ``failed`` (with the tail of its build log)."""

    status: str
    log_tail: str = ""


@runtime_checkable
class TemplateProvider(Protocol):
    """Builds a Dockerfile (with its build context, a tar) into an image sandboxes boot."""

    async def submit_template(self, *, name: str, dockerfile: str, context: bytes) -> str: ...

    async def wait_template(self, template_id: str, *, timeout_s: float) -> TemplateOutcome: ...

    async def delete_template(self, template_id: str) -> None: ...
