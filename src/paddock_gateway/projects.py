"""Projects and deployments as the wallet sees them: status (§5.4, §10), the list (§5.5), delete (§5.6),
name availability and the active count of §9.3."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_core.timeutil import rfc3339
from paddock_gateway import upto
from paddock_gateway.adapters.hosting import (
    DeploymentHandle,
    DeploymentState,
    HostingError,
    HostingUnavailable,
)
from paddock_gateway.auth import Caller
from paddock_gateway.errors import DeleteFailed, NotFound, NotOwner, UpstreamUnavailable
from paddock_gateway.models import Deployment, Project, X402Upto
from paddock_gateway.schemas import (
    DeploymentStatusBody,
    ProjectDeleted,
    ProjectItem,
    ProjectList,
    UptoEntry,
)
from paddock_gateway.services import Services

log = get_logger("paddock.gateway.projects")

READY = ("active", "deployed", "sleeping")
TRANSITIONAL = ("queued", "queue", "pending", "building", "deploying", "promoting")
ACTIVE_PROJECT_STATUSES = ("active", "building", "deploying", "pending", "queued", "promoting")


class NameConflict(Exception):
    """The name was taken between the availability check and the insert."""


def gateway_status(deployment_id: str, state: DeploymentState) -> DeploymentStatusBody:
    """§10: the platform's status and URL → ``deploying`` / ``ready`` / ``failed``."""
    raw = state.status.lower()
    if raw in READY or state.url:
        return DeploymentStatusBody(status="ready", deployment_id=deployment_id, endpoint=state.url)
    if raw in TRANSITIONAL:
        return DeploymentStatusBody(
            status="deploying",
            deployment_id=deployment_id,
            deployment_status=raw,
            message="Deployment in progress",
        )
    return DeploymentStatusBody(
        status="failed",
        deployment_id=deployment_id,
        deployment_status=raw,
        reason=state.message or f"Deployment {raw}",
    )


def project_status(project: Project, state: DeploymentState | None) -> str:
    """A project's status in the contract's closed set. A project paused for lack of credits reads
    ``active``: it still shares the wallet's credits and resumes on the next top-up."""
    if project.state == "deleting":
        return "deleting"
    if state is None:
        return "queued"
    raw = state.status.lower()
    if raw in READY:
        return "active"
    if raw in ("queue",):
        return "queued"
    if raw in TRANSITIONAL:
        return raw
    return "failed"


async def name_taken(services: Services, name: str) -> bool:
    async with services.sessions() as session:
        found = await session.scalar(select(Project.id).where(Project.name_key == name.lower()))
    return found is not None


async def record(
    services: Services, caller: Caller, handle: DeploymentHandle, fields: dict[str, object]
) -> None:
    """Store a new project and its first deployment; ``NameConflict`` if the name was just taken."""
    now = services.clock()
    try:
        async with transaction(services.sessions) as session:
            session.add(
                Project(
                    id=handle.project_id,
                    wallet=caller.wallet,
                    name_key=str(fields["name"]).lower(),
                    state="live",
                    latest_deployment_id=handle.deployment_id,
                    created_at=now,
                    metered_until=now,
                    hours_metered=0,
                    **fields,
                )
            )
            await session.flush()
            session.add(
                Deployment(
                    id=handle.deployment_id,
                    project_id=handle.project_id,
                    wallet=caller.wallet,
                    created_at=now,
                )
            )
    except IntegrityError as exc:
        raise NameConflict(str(fields["name"])) from exc


async def _live_projects(services: Services, wallet: str) -> list[Project]:
    async with services.sessions() as session:
        rows = await session.scalars(
            select(Project)
            .where(Project.wallet == wallet, Project.state != "deleted")
            .order_by(Project.created_at.desc(), Project.id)
        )
        return list(rows)


async def _state(services: Services, project: Project) -> DeploymentState | None:
    if project.latest_deployment_id is None:
        return None
    return await services.hosting.deployment_status(project.id, project.latest_deployment_id)


async def list_projects(services: Services, caller: Caller) -> ProjectList:
    items: list[ProjectItem] = []
    for project in await _live_projects(services, caller.wallet):
        try:
            state = await _state(services, project)
        except HostingUnavailable as exc:
            raise UpstreamUnavailable("the hosting platform is unavailable") from exc
        except HostingError:
            state = DeploymentState(status="failed")
        status = project_status(project, state)
        url = state.url if state is not None and status == "active" else None
        items.append(
            ProjectItem(
                id=project.id,
                name=project.name,
                displayName=project.display_name,
                status=status,
                url=url,
                createdAt=rfc3339(project.created_at),
            )
        )
    return ProjectList(wallet=caller.address, count=len(items), projects=items)


async def active_count(services: Services, wallet: str) -> int:
    """How many of the wallet's projects are active (§9.3). Raises on lookup failure (callers fail closed)."""
    count = 0
    for project in await _live_projects(services, wallet):
        if project.state == "deleting":
            continue
        if project_status(project, await _state(services, project)) in ACTIVE_PROJECT_STATUSES:
            count += 1
    return count


async def deployment_status(
    services: Services, caller: Caller, project_id: str, deployment_id: str
) -> DeploymentStatusBody:
    if not (0 < len(project_id) <= 128 and 0 < len(deployment_id) <= 128):
        raise NotFound()
    async with services.sessions() as session:
        deployment = await session.get(Deployment, deployment_id)
    if deployment is None or deployment.project_id != project_id:
        raise NotFound("Deployment not found")
    if deployment.wallet != caller.wallet:
        raise NotOwner()
    try:
        state = await services.hosting.deployment_status(project_id, deployment_id)
    except HostingUnavailable as exc:
        raise UpstreamUnavailable("the hosting platform is unavailable") from exc
    except HostingError:
        state = DeploymentState(status="failed", message="The platform has no record of this deployment")
    body = gateway_status(deployment_id, state)
    ledger = await upto.ledger(services.sessions, project_id)
    if ledger:
        body.upto = [upto_entry(row) for row in ledger]
    return body


def upto_entry(row: X402Upto) -> UptoEntry:
    return UptoEntry(
        network=row.network,
        token=row.token,
        state=row.state,
        authorized_raw=str(row.authorized_raw),
        settled_raw=str(row.settled_raw) if row.state in ("settled", "failed") else None,
        consumed_seconds=row.consumed_s if row.state in ("settled", "failed") else None,
        started_at=rfc3339(row.started_at),
        due_at=rfc3339(row.due_at),
        settled_at=rfc3339(row.settled_at) if row.settled_at is not None else None,
        reason=row.reason,
        error=row.error,
        tx_hash=row.tx_hash,
    )


async def delete_project(services: Services, caller: Caller, project_id: str) -> ProjectDeleted:
    async with services.sessions() as session:
        project = await session.get(Project, project_id)
    if project is None or project.state == "deleted":
        raise NotFound("Project not found")
    if project.wallet != caller.wallet:
        raise NotOwner("Forbidden: wallet is not the deployer")
    previous = project.state
    await _set_state(services, project_id, state="deleting")
    try:
        await services.hosting.delete_project(project_id)
    except HostingError as exc:
        await _set_state(services, project_id, state=previous)
        log.warning("project_delete_failed", project_id=project_id, error=str(exc))
        raise DeleteFailed() from exc
    await _set_state(services, project_id, state="deleted", name_key=None, deleted_at=services.clock())
    if await upto.stop(services.sessions, project_id, services.clock()) and services.metering is not None:
        services.metering.wake()  # its upto authorisation is settled for the runtime consumed, now
    log.info("project_deleted", project_id=project_id, wallet=caller.wallet)
    return ProjectDeleted(projectId=project_id)


async def _set_state(services: Services, project_id: str, **values: object) -> None:
    async with transaction(services.sessions) as session:
        await session.execute(update(Project).where(Project.id == project_id).values(**values))
