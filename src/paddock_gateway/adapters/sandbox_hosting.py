"""``SandboxHosting``: the ``HostingPlatform`` built on Paddock sandboxes.

A deployment is one sandbox with ingress enabled. ``create_deployment`` creates the sandbox and writes
the upload into ``<workspace>/app`` (one tar archive, unpacked in the sandbox), records the deployment as ``queued`` and wakes the build worker;
an upload with a Dockerfile instead submits a template build (the Dockerfile, the upload's directory as
its build context) and the worker waits for it, then boots the sandbox from the template (and deletes
the template: the sandbox keeps its image) before it starts the app the same way;
the worker (fed from the ``gw_sandbox_deployments`` table) runs install and build, starts the app in the
background, and waits until something accepts connections on the port:

    queued → building → deploying → active      (url = the sandbox's ingress URL for the port)
                   ↘          ↘
                    failed (reason: the step that failed and the tail of its log)

The app answers once ``curl http://127.0.0.1:<port>/`` inside the sandbox gets any HTTP response (a
connection that accepts but never speaks HTTP is not ready) and, with an ``IngressProbe``, once its
ingress URL reaches it from the gateway's side too. A deployment's environment (``buildVars``,
``runEnvs``) is sealed at rest with the gateway's ``SecretBox`` (``plan["sealed_env"]``) and opened only
to hand it to the sandbox; it is never logged.

Pausing a project pauses its sandbox (status ``sleeping``); resuming resumes it. On start-up,
deployments left in ``building``/``deploying`` by a previous process are queued again (the files are
already in the sandbox). One gateway process per database is assumed for that recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import io
import json
import shlex
import tarfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_core.crypto import SecretBox
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import Clock, utcnow
from paddock_gateway.adapters.hosting import (
    AccessCheck,
    DeploymentHandle,
    DeploymentState,
    DeployOptions,
    HostingAccessDenied,
    HostingError,
    HostingUnavailable,
    ProjectSpec,
    Sandbox,
    SandboxAccessDenied,
    SandboxError,
    SandboxProvider,
    SandboxUnavailable,
    TemplateProvider,
    TemplateRefused,
    UploadedFile,
    ingress_url,
)
from paddock_gateway.adapters.ingress import IngressProbe
from paddock_gateway.models import SandboxDeployment
from paddock_gateway.runtimes import BuildPlan, PlanError, infer_plan

log = get_logger("paddock.gateway.hosting")
LOG_TAIL_CHARS = 2000
RUNNING = ("building", "deploying")
#: Where a Dockerfile deployment's run log goes: the image's USER may not write to the workspace.
IMAGE_LOGS = "/tmp/.paddock-deploy"


def tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


class BuildFailed(Exception):
    pass


def tar_of(files: Sequence[UploadedFile]) -> bytes:
    """The upload as one uncompressed tar of regular files (paths are already validated relative
    paths): one file write and one ``tar -x`` instead of a request per file."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for item in files:
            info = tarfile.TarInfo(item.path)
            info.size = len(item.data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(item.data))
    return buffer.getvalue()


def seal_plan(box: SecretBox, plan: BuildPlan) -> dict[str, Any]:
    """The plan as stored: commands in clear, the environment sealed."""
    data = plan.to_json()
    env = {"build": data.pop("build_env"), "run": data.pop("run_env")}
    data["sealed_env"] = box.seal(json.dumps(env))
    return data


def open_plan(box: SecretBox, stored: dict[str, Any]) -> BuildPlan:
    data = dict(stored)
    if "sealed_env" not in data:  # recorded before sealing existed
        return BuildPlan.from_json(data)
    env = json.loads(box.open(str(data.pop("sealed_env"))))
    return BuildPlan.from_json({**data, "build_env": env["build"], "run_env": env["run"]})


class SandboxHosting:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        provider: SandboxProvider,
        secret_box: SecretBox,
        *,
        clock: Clock = utcnow,
        install_timeout_s: float = 900.0,
        build_timeout_s: float = 900.0,
        ready_timeout_s: float = 120.0,
        max_concurrent_builds: int = 2,
        ingress_probe: IngressProbe | None = None,
    ) -> None:
        self.sessions = sessions
        self.provider = provider
        self.secret_box = secret_box
        self.clock = clock
        self.install_timeout_s = install_timeout_s
        self.build_timeout_s = build_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.ingress_probe = ingress_probe
        self.slots = asyncio.Semaphore(max_concurrent_builds)
        self.wakeup = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.loop_task: asyncio.Task[None] | None = None

    # ---- HostingPlatform -------------------------------------------------------------------------

    async def create_deployment(
        self, project: ProjectSpec, files: Sequence[UploadedFile], options: DeployOptions
    ) -> DeploymentHandle:
        handle = DeploymentHandle(project_id=str(uuid.uuid4()), deployment_id=str(uuid.uuid4()))
        try:
            plan: BuildPlan | None = infer_plan(files, options)
            failure = None
        except PlanError as exc:
            plan, failure = None, str(exc)
        sandbox_id = None
        if plan is not None and plan.kind == "dockerfile":
            plan, failure = await self._submit_template(handle, files, plan)
        elif plan is not None:
            sandbox = await self._create_sandbox(project, files)
            sandbox_id = sandbox.id
        await self._insert(handle, sandbox_id, plan, failure)
        self.wakeup.set()
        log.info("deployment_created", project_id=handle.project_id, deployment_id=handle.deployment_id)
        return handle

    async def check_access(self) -> None:
        """The provider's credentials work (when it can tell); its errors mapped like every call's."""
        if not isinstance(self.provider, AccessCheck):
            return
        try:
            await self.provider.check_access()
        except SandboxAccessDenied as exc:
            raise HostingAccessDenied(str(exc)) from exc
        except SandboxUnavailable as exc:
            raise HostingUnavailable(str(exc)) from exc
        except SandboxError as exc:
            raise HostingError(str(exc)) from exc

    async def deployment_status(self, project_id: str, deployment_id: str) -> DeploymentState:
        async with self.sessions() as session:
            row = await session.get(SandboxDeployment, deployment_id)
        if row is None or row.project_id != project_id:
            raise HostingError("unknown deployment")
        return DeploymentState(status=row.status, url=row.url, message=row.reason)

    async def pause_project(self, project_id: str) -> None:
        for row in await self._rows(project_id):
            if row.sandbox_id and row.status not in ("failed", "deleted"):
                await self._sandbox_call(row.sandbox_id, "pause")
                if row.status == "active":
                    await self._set(row.deployment_id, status="sleeping")

    async def resume_project(self, project_id: str) -> None:
        for row in await self._rows(project_id):
            if row.sandbox_id and row.status not in ("failed", "deleted"):
                await self._sandbox_call(row.sandbox_id, "resume")
                if row.status == "sleeping":
                    await self._set(row.deployment_id, status="active")

    async def delete_project(self, project_id: str) -> None:
        for row in await self._rows(project_id):
            template = row.plan.get("template") if row.status != "deleted" else None
            if template and isinstance(self.provider, TemplateProvider):
                with contextlib.suppress(SandboxError):  # a build still running is cancelled
                    await self.provider.delete_template(str(template))
            if row.sandbox_id and row.status != "deleted":
                await self._sandbox_call(row.sandbox_id, "destroy")
            await self._set(row.deployment_id, status="deleted")

    # ---- the build worker ------------------------------------------------------------------------

    def start(self) -> None:
        self.loop_task = asyncio.create_task(self._loop(), name="sandbox-hosting-builds")

    async def aclose(self) -> None:
        for task in [self.loop_task, *self.tasks]:
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *[t for t in [self.loop_task, *self.tasks] if t is not None], return_exceptions=True
        )
        await self.provider.aclose()

    async def recover(self) -> None:
        """Queue again what a previous process left half-built."""
        async with transaction(self.sessions) as session:
            await session.execute(
                update(SandboxDeployment)
                .where(SandboxDeployment.status.in_(RUNNING))
                .values(status="queued", updated_at=self.clock())
            )

    async def _loop(self) -> None:
        await self.recover()
        while True:
            for deployment_id in await self._queued():
                if await self._claim(deployment_id):
                    task = asyncio.create_task(self._execute(deployment_id))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=5.0)

    async def _queued(self) -> list[str]:
        async with self.sessions() as session:
            rows = await session.scalars(
                select(SandboxDeployment.deployment_id)
                .where(SandboxDeployment.status == "queued")
                .order_by(SandboxDeployment.created_at)
            )
            return list(rows)

    async def _claim(self, deployment_id: str) -> bool:
        async with transaction(self.sessions) as session:
            result = await session.execute(
                update(SandboxDeployment)
                .where(SandboxDeployment.deployment_id == deployment_id, SandboxDeployment.status == "queued")
                .values(status="building", updated_at=self.clock())
            )
        return bool(getattr(result, "rowcount", 0))

    async def _execute(self, deployment_id: str) -> None:
        async with self.slots:
            async with self.sessions() as session:
                row = await session.get(SandboxDeployment, deployment_id)
            if row is None:
                return
            try:
                plan = open_plan(self.secret_box, row.plan)
            except (ValueError, KeyError) as exc:
                reason = "the deployment's settings cannot be opened with this gateway's secret key"
                await self._set(deployment_id, status="failed", reason=reason, only_if=RUNNING)
                log.warning(
                    "deployment_plan_unreadable", deployment_id=deployment_id, error=type(exc).__name__
                )
                return
            if row.sandbox_id is None and plan.template is None:
                return
            try:
                if row.sandbox_id is None:
                    sandbox = await self._boot_template(deployment_id, plan)
                else:
                    sandbox = await self.provider.get(row.sandbox_id)
                url = await self._build_and_start(deployment_id, sandbox, plan)
            except BuildFailed as exc:
                await self._set(deployment_id, status="failed", reason=str(exc), only_if=RUNNING)
                log.info("deployment_failed", deployment_id=deployment_id)
                return
            except SandboxError as exc:
                await self._set(
                    deployment_id, status="failed", reason=f"sandbox error: {exc}", only_if=RUNNING
                )
                log.warning("deployment_sandbox_error", deployment_id=deployment_id, error=str(exc))
                return
            await self._set(deployment_id, status="active", url=url, only_if=RUNNING)
            log.info("deployment_ready", deployment_id=deployment_id)

    async def _boot_template(self, deployment_id: str, plan: BuildPlan) -> Sandbox:
        """Waits for the deployment's template, boots its sandbox and deletes the template (the sandbox
        keeps the image; a deleted template frees the platform's template caps)."""
        assert plan.template is not None
        if not isinstance(self.provider, TemplateProvider):
            raise BuildFailed("this hosting platform cannot build Dockerfiles")
        outcome = await self.provider.wait_template(
            plan.template, timeout_s=self.install_timeout_s + self.build_timeout_s
        )
        if outcome.status != "ready":
            with contextlib.suppress(SandboxError):
                await self.provider.delete_template(plan.template)
            raise BuildFailed(f"the image build failed: {tail(outcome.log_tail)}")
        try:
            sandbox = await self.provider.create(
                name=f"gw-{deployment_id[:8]}", ingress_enabled=True, rootfs=plan.template
            )
        except SandboxError as exc:
            raise BuildFailed(f"the sandbox did not boot from the built image: {exc}") from exc
        await self._set(deployment_id, sandbox_id=sandbox.id)
        with contextlib.suppress(SandboxError):
            await self.provider.delete_template(plan.template)
        return sandbox

    async def _submit_template(
        self, handle: DeploymentHandle, files: Sequence[UploadedFile], plan: BuildPlan
    ) -> tuple[BuildPlan | None, str | None]:
        """Submits the upload's Dockerfile with its directory as the build context: the plan with its
        template, or the reason the deployment fails (the platform refused the Dockerfile)."""
        if not isinstance(self.provider, TemplateProvider):
            return None, "Dockerfile builds need a hosting platform with templates; this one has none"
        prefix = f"{plan.workdir}/" if plan.workdir else ""
        context = [
            UploadedFile(path=f.path[len(prefix) :], data=f.data) for f in files if f.path.startswith(prefix)
        ]
        dockerfile = next(f.data for f in context if f.path == "Dockerfile").decode("utf-8", "replace")
        try:
            template = await self.provider.submit_template(
                name=f"gw-{handle.deployment_id.replace('-', '')}",
                dockerfile=dockerfile,
                context=await asyncio.to_thread(lambda: gzip.compress(tar_of(context), 6)),
            )
        except TemplateRefused as exc:
            return None, f"the platform refused the Dockerfile: {exc}"
        except SandboxUnavailable as exc:
            raise HostingUnavailable(str(exc)) from exc
        except SandboxError as exc:
            raise HostingError(str(exc)) from exc
        return dataclasses.replace(plan, template=template), None

    async def _build_and_start(self, deployment_id: str, sandbox: Sandbox, plan: BuildPlan) -> str:
        # A Dockerfile's image runs from its own WORKDIR, as its USER, logging where any user may.
        from_image = plan.kind == "dockerfile"
        app_dir = (
            None if from_image else f"{sandbox.workspace}/app" + (f"/{plan.workdir}" if plan.workdir else "")
        )
        logs = IMAGE_LOGS if from_image else f"{sandbox.workspace}/logs"
        await sandbox.run("mkdir", ["-p", logs])
        for step, command, timeout_s in (
            ("install", plan.install, self.install_timeout_s),
            ("build", plan.build, self.build_timeout_s),
        ):
            if not command:
                continue
            result = await sandbox.run(
                "sh", ["-c", command], env=plan.build_env, cwd=app_dir, timeout_s=timeout_s
            )
            if result.exit_code != 0:
                output = tail(result.stdout + "\n" + result.stderr)
                raise BuildFailed(f"{step} failed (`{command}` exited with {result.exit_code}): {output}")
        await self._set(deployment_id, status="deploying", only_if=RUNNING)
        launcher = f"nohup sh -c {shlex.quote(plan.run)} > {logs}/run.log 2>&1 < /dev/null & echo $! > {logs}/run.pid"
        result = await sandbox.run("sh", ["-c", launcher], env=plan.run_env, cwd=app_dir, timeout_s=30)
        if result.exit_code != 0:
            raise BuildFailed(f"could not start `{plan.run}`: {tail(result.stderr)}")
        await self._wait_for_port(sandbox, plan, logs)
        url = ingress_url(sandbox, plan.port)
        if self.ingress_probe is not None:
            await self._wait_for_ingress(self.ingress_probe, url)
        return url

    async def _wait_for_ingress(self, probe: IngressProbe, url: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while (problem := await probe.check(url)) is not None:
            if time.monotonic() > deadline:
                raise BuildFailed(
                    f"the app answers inside its sandbox but not at its ingress URL {url}: {problem}"
                )
            await asyncio.sleep(0.5)

    async def _wait_for_port(self, sandbox: Sandbox, plan: BuildPlan, logs: str) -> None:
        # curl where the image has it; bash's /dev/tcp where it does not (a Dockerfile's minimal image).
        probe = (
            f"if command -v curl >/dev/null; then curl -s -o /dev/null --max-time 2 http://127.0.0.1:{plan.port}/"
            f" && exit 0; else (exec 3<>/dev/tcp/127.0.0.1/{plan.port} && printf 'GET / HTTP/1.0\\r\\n\\r\\n'"
            " >&3 && timeout 2 head -c 5 <&3 | grep -q '^HTTP/') 2>/dev/null && exit 0; fi; "
            f'kill -0 "$(cat {logs}/run.pid)" 2>/dev/null && exit 1; exit 2'
        )
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            result = await sandbox.run("bash", ["-c", probe], timeout_s=10)
            if result.exit_code == 0:
                return
            if result.exit_code == 2 or time.monotonic() > deadline:
                output = await sandbox.run(
                    "tail", ["-c", str(LOG_TAIL_CHARS), f"{logs}/run.log"], timeout_s=10
                )
                what = (
                    "exited"
                    if result.exit_code == 2
                    else f"did not answer within {self.ready_timeout_s:.0f} s"
                )
                raise BuildFailed(f"`{plan.run}` {what} on port {plan.port}: {tail(output.stdout)}")
            await asyncio.sleep(0.25)

    # ---- helpers ---------------------------------------------------------------------------------

    async def _create_sandbox(self, project: ProjectSpec, files: Sequence[UploadedFile]) -> Sandbox:
        try:
            sandbox = await self.provider.create(name=f"gw-{project.name.lower()}", ingress_enabled=True)
        except SandboxUnavailable as exc:
            raise HostingUnavailable(str(exc)) from exc
        except SandboxError as exc:
            raise HostingError(str(exc)) from exc
        archive = f"{sandbox.workspace}/.upload.tar"
        try:
            await sandbox.run("mkdir", ["-p", f"{sandbox.workspace}/app"])
            await sandbox.files.write(archive, tar_of(files))
            result = await sandbox.run(
                "tar", ["-xf", archive, "-C", f"{sandbox.workspace}/app", "--no-same-owner"], timeout_s=300
            )
            if result.exit_code != 0:
                raise SandboxError(f"unpacking failed: {tail(result.stderr)}")
            await sandbox.run("rm", ["-f", archive])
        except SandboxError as exc:
            try:
                await sandbox.destroy()
            except SandboxError:
                log.warning("sandbox_destroy_failed", sandbox_id=sandbox.id)
            raise HostingError(f"writing the upload failed: {exc}") from exc
        return sandbox

    async def _insert(
        self, handle: DeploymentHandle, sandbox_id: str | None, plan: BuildPlan | None, failure: str | None
    ) -> None:
        now = self.clock()
        async with transaction(self.sessions) as session:
            session.add(
                SandboxDeployment(
                    deployment_id=handle.deployment_id,
                    project_id=handle.project_id,
                    sandbox_id=sandbox_id,
                    status="failed" if failure else "queued",
                    reason=failure,
                    plan=seal_plan(self.secret_box, plan) if plan else {},
                    created_at=now,
                    updated_at=now,
                )
            )

    async def _rows(self, project_id: str) -> list[SandboxDeployment]:
        async with self.sessions() as session:
            rows = await session.scalars(
                select(SandboxDeployment).where(SandboxDeployment.project_id == project_id)
            )
            return list(rows)

    async def _set(self, deployment_id: str, *, only_if: Sequence[str] = (), **values: Any) -> None:
        statement = update(SandboxDeployment).where(SandboxDeployment.deployment_id == deployment_id)
        if only_if:
            statement = statement.where(SandboxDeployment.status.in_(only_if))
        async with transaction(self.sessions) as session:
            await session.execute(statement.values(updated_at=self.clock(), **values))

    async def _sandbox_call(self, sandbox_id: str, action: str) -> None:
        try:
            sandbox = await self.provider.get(sandbox_id)
            await getattr(sandbox, action)()
        except SandboxUnavailable as exc:
            raise HostingUnavailable(str(exc)) from exc
        except SandboxError as exc:
            raise HostingError(f"{action} failed: {exc}") from exc
