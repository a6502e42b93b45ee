"""E2B's snapshots on Paddock's snapshots (``resources.snapshots``, docs/snapshots.md):
``POST /sandboxes/{id}/snapshots`` (``Sandbox.create_snapshot``), ``GET /snapshots``
(``Sandbox.list_snapshots``, paged by ``nextToken``/``x-next-token``), and ``DELETE /templates/{id}``
(``Sandbox.delete_snapshot``) when the id names a snapshot rather than a template. A sandbox boots from
one as the SDK asks, ``Sandbox.create(<snapshotID or name>)``: the create's ``templateID`` is the native
create's ``rootfs``, which takes a snapshot's id or name.

What differs from E2B (docs/e2b.md): ``snapshotID`` is the native id (``snap_…``, no ``:tag``) and
``names`` the snapshot's name when it has one. A container or gVisor snapshot holds the filesystem only,
so ``memory`` unset or false is served (the sandboxes booted from it start their processes afresh, as
E2B's ``mode="filesystem"``) and ``memory: true`` (``mode="full"``) is a 501 naming ``memory``; a VM
host's snapshot holds memory too, so there it is served. A name already taken is a 409 naming ``name``
(E2B adds a build to the existing snapshot instead); delete the old one first.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, StrictBool, StrictStr
from sqlalchemy import or_, select

from paddock_controlplane.edge.api.deps import scope_caller
from paddock_controlplane.edge.api.routes.bodies import optional_body
from paddock_controlplane.edge.e2b import errors as e2b_errors
from paddock_controlplane.edge.e2b.schemas import Body
from paddock_controlplane.hosts import hosts
from paddock_controlplane.records import queries
from paddock_controlplane.records.models import Host
from paddock_controlplane.records.schemas.snapshots import SnapshotCreateRequest
from paddock_controlplane.records.snapshots import ID_PREFIX, READY, Snapshot
from paddock_controlplane.records.states import CLOSED, SandboxStatus
from paddock_controlplane.resources import snapshots
from paddock_core import errors

router = APIRouter()

#: A list page is at most this long (E2B's own maximum and default).
MAX_LIMIT = 100
#: The statuses E2B shows a sandbox in (running or paused); a snapshot of any other is a 404 or 409.
_SNAPSHOTTABLE = (SandboxStatus.RUNNING, SandboxStatus.PAUSED)


class NewSnapshot(Body):
    """``POST /sandboxes/{id}/snapshots`` (``SandboxSnapshotRequest``)."""

    name: StrictStr | None = Field(default=None, max_length=128)
    memory: StrictBool | None = None


def view(row: Snapshot) -> dict[str, Any]:
    """E2B's ``SnapshotInfo``."""
    return {"snapshotID": row.id, "names": [row.name] if row.name else []}


def _ref(raw: str, field: str) -> str:
    """A snapshot id or name as the SDK sends it; bounded and printable, or a 400 naming ``field``."""
    if not 1 <= len(raw) <= 128 or not raw.isprintable():
        raise errors.ValidationFailed.field(field, "must be a snapshot id or name (at most 128 characters)")
    return raw


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def create(sandbox_id: str, request: Request) -> dict[str, Any]:
    services, principal = await scope_caller(request.scope)
    principal.require_scope(None)  # as /v1's snapshot route: not opened to a sandbox's access token
    body = await optional_body(request, NewSnapshot)
    async with services.sessions() as session:
        sandbox = await queries.get_owned(session, principal.user_id, sandbox_id)
        host = await session.get(Host, sandbox.host_id) if sandbox.host_id else None
    if sandbox.status not in _SNAPSHOTTABLE:
        if sandbox.status in (*CLOSED, SandboxStatus.ERROR):
            raise errors.NotFound(f"sandbox {sandbox_id!r} not found")
        raise errors.InvalidState(f"sandbox {sandbox_id!r} is {sandbox.status}; snapshot it once it runs")
    if body.memory and hosts.runtime_of(host) not in hosts.VM_RUNTIMES:
        raise e2b_errors.NotBuilt(
            "memory: true: a snapshot of a container or gVisor sandbox holds its filesystem only; "
            "ask for mode='filesystem' (sandboxes booted from it start their processes afresh)"
        )
    made = await snapshots.create(
        services, principal.user_id, sandbox_id, SnapshotCreateRequest(name=body.name)
    )
    return {"snapshotID": made["id"], "names": [made["name"]] if made["name"] else []}


@router.get("/snapshots")
async def list_snapshots(request: Request) -> JSONResponse:
    """The caller's ready snapshots, oldest first; ``sandboxID`` and ``name`` (an id or a name) filter,
    ``limit`` (at most 100) and ``nextToken`` page, the next token in ``x-next-token``."""
    services, principal = await scope_caller(request.scope)
    principal.require_scope(None)
    query = request.query_params
    raw_limit = query.get("limit")
    try:
        limit = MAX_LIMIT if not raw_limit else int(raw_limit)
    except ValueError:
        raise errors.ValidationFailed.field("limit", "must be an integer") from None
    if limit < 1:
        raise errors.ValidationFailed.field("limit", "must be at least 1")
    limit = min(limit, MAX_LIMIT)
    statement = select(Snapshot).where(Snapshot.user_id == principal.user_id, Snapshot.status == READY)
    sandbox_id = query.get("sandboxID")
    if sandbox_id:
        statement = statement.where(Snapshot.source_sandbox_id == _ref(sandbox_id, "sandboxID"))
    name = query.get("name")
    if name:
        ref = _ref(name, "name")
        statement = statement.where(or_(Snapshot.id == ref, Snapshot.name == ref))
    token = query.get("nextToken")
    if token:
        if not token.startswith(ID_PREFIX) or len(token) > 40:
            raise errors.ValidationFailed.field("nextToken", "is not a token this API gave")
        statement = statement.where(Snapshot.id > token)
    # Ids are ULIDs: their order is their creation order, and the last one seen is the next token.
    statement = statement.order_by(Snapshot.id).limit(limit + 1)
    async with services.sessions() as session:
        rows = list((await session.scalars(statement)).all())
    page = rows[:limit]
    headers = {"x-next-token": page[-1].id} if len(rows) > limit else {}
    return JSONResponse([view(row) for row in page], headers=headers)


async def delete_if_snapshot(request: Request, user_id: str, ref: str) -> bool:
    """``DELETE /templates/{id}`` for a snapshot (the SDK's ``delete_snapshot``): True when ``ref`` is one
    of the caller's snapshots and it is deleted, False when it names none."""
    services = request.app.state.services
    if len(ref) > 128:
        return False
    async with services.sessions() as session:
        try:
            row = await snapshots.get_owned(session, user_id, ref)
        except errors.NotFound:
            return False
    await snapshots.delete_snapshot(services, user_id, row.id)
    return True
