"""E2B's snapshots on Paddock's snapshots (``resources.snapshots``, docs/snapshots.md):
``POST /sandboxes/{id}/snapshots`` (``Sandbox.create_snapshot``), ``GET /snapshots``
(``Sandbox.list_snapshots``, paged by ``nextToken``/``x-next-token``), and ``DELETE /templates/{id}``
(``Sandbox.delete_snapshot``) when the id names a snapshot rather than a template. A sandbox boots from
one as the SDK asks, ``Sandbox.create(<snapshotID or name>)``: the create's ``templateID`` is the native
create's ``rootfs``, which takes a snapshot's id or name.

Names carry E2B's tags: ``name:tag`` (``name`` alone is ``name:default``, as E2B's). A tag is kept by the
E2B API (``store.E2bSnapshotTag``); the ``default`` tag's snapshot also has ``name`` as its native name,
so ``/v1``'s ``rootfs`` takes it too. ``Sandbox.create("name:tag")`` boots that tag's snapshot, the
listing's ``name`` filter takes ``name`` (every tag) or ``name:tag``, and ``delete_snapshot("name:tag")``
deletes it.

What differs from E2B (docs/e2b.md): ``snapshotID`` is the native id (``snap_…``) and ``names`` the
snapshot's ``name`` (``name:tag`` for a tag other than ``default``). A container or gVisor snapshot holds the filesystem only,
so ``memory`` unset or false is served (the sandboxes booted from it start their processes afresh, as
E2B's ``mode="filesystem"``) and ``memory: true`` (``mode="full"``) is a 501 naming ``memory``; a VM
host's snapshot holds memory too, so there it is served. A ``name:tag`` already taken is a 409 naming
``name`` (E2B moves the tag to a new build instead); delete the old one first.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, StrictBool, StrictStr
from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.edge.api.routes.bodies import optional_body
from paddock_controlplane.edge.e2b import callers, store
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
from paddock_core.db import transaction

router = APIRouter()

#: A list page is at most this long (E2B's own maximum and default).
MAX_LIMIT = 100
#: The statuses E2B shows a sandbox in (running or paused); a snapshot of any other is a 404 or 409.
_SNAPSHOTTABLE = (SandboxStatus.RUNNING, SandboxStatus.PAUSED)
#: E2B's tag for a name given without one.
DEFAULT_TAG = "default"
#: A tag: what a native snapshot name may be (letters, digits, ``.``, ``_``, ``-``).
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def split_name(raw: str, field: str = "name") -> tuple[str, str | None]:
    """``name:tag`` as ``(name, tag)``, ``name`` as ``(name, None)``; a 400 naming ``field`` for a name or
    tag Paddock's snapshot names do not take (a ``namespace/`` prefix among them: no team namespaces)."""
    name, sep, tag = raw.partition(":")
    if "/" in name:
        raise errors.ValidationFailed.field(
            field, "namespaces ('team/name') are not served; give name or name:tag"
        )
    snapshots.check_name(name)
    if sep and not _TAG.match(tag):
        raise errors.ValidationFailed.field(field, "a tag must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    return name, (tag if sep else None)


def _full_name(name: str, tag: str) -> str:
    return name if tag == DEFAULT_TAG else f"{name}:{tag}"


class NewSnapshot(Body):
    """``POST /sandboxes/{id}/snapshots`` (``SandboxSnapshotRequest``)."""

    name: StrictStr | None = Field(default=None, max_length=128)
    memory: StrictBool | None = None


def view(row: Snapshot, tags: list[tuple[str, str]]) -> dict[str, Any]:
    """E2B's ``SnapshotInfo``: its ``name:tag`` names (``name`` for the default tag), else its native name."""
    names = sorted(_full_name(name, tag) for name, tag in tags) or ([row.name] if row.name else [])
    return {"snapshotID": row.id, "names": names}


async def _live(session: AsyncSession, ids: list[str]) -> list[str]:
    """Those of ``ids`` whose snapshot still exists (a tag outlives a snapshot deleted through /v1)."""
    if not ids:
        return []
    return list((await session.scalars(select(Snapshot.id).where(Snapshot.id.in_(ids)))).all())


async def snapshot_for(session: AsyncSession, user_id: str, ref: str) -> str | None:
    """For a create's ``templateID``: the id of the snapshot ``ref`` names as ``name:tag``, ``name`` for
    ``name:default`` that no tag names (a snapshot named through /v1), or None when ``ref`` is not such a
    name (a catalog image's ``debian:13``, a template) and resolves as it always did."""
    if ":" not in ref or len(ref) > 128:
        return None
    try:
        name, tag = split_name(ref)
    except errors.ValidationFailed:
        return None
    found = await _live(session, await store.tagged(session, user_id, name, tag))
    if found:
        return found[0]
    if tag == DEFAULT_TAG:
        try:
            return (await snapshots.get_owned(session, user_id, name)).id
        except errors.NotFound:
            return None
    return None


def _ref(raw: str, field: str) -> str:
    """A snapshot id or name as the SDK sends it; bounded and printable, or a 400 naming ``field``."""
    if not 1 <= len(raw) <= 128 or not raw.isprintable():
        raise errors.ValidationFailed.field(field, "must be a snapshot id or name (at most 128 characters)")
    return raw


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def create(sandbox_id: str, request: Request) -> dict[str, Any]:
    # As /v1's snapshot route: not opened to a sandbox's access token.
    services, principal = await callers.caller(request.scope, None)
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
    if body.name is None:
        made = await snapshots.create(services, principal.user_id, sandbox_id, SnapshotCreateRequest())
        return {"snapshotID": made["id"], "names": []}
    name, tag = split_name(body.name)
    tag = tag or DEFAULT_TAG
    async with services.sessions() as session:
        if await _live(session, await store.tagged(session, principal.user_id, name, tag)):
            raise errors.AlreadyExists(f"name: a snapshot named {_full_name(name, tag)!r} already exists")
    # The default tag's snapshot has the name as its native name too (/v1's rootfs takes it); the
    # native create refuses a name another snapshot holds.
    native_name = name if tag == DEFAULT_TAG else None
    made = await snapshots.create(
        services, principal.user_id, sandbox_id, SnapshotCreateRequest(name=native_name)
    )
    try:
        async with transaction(services.sessions) as session:
            await store.tag_snapshot(
                session,
                user_id=principal.user_id,
                name=name,
                tag=tag,
                snapshot_id=made["id"],
                now=services.clock(),
            )
    except BaseException:  # taken meanwhile by a create beside this one: this one is undone
        await snapshots.delete_snapshot(services, principal.user_id, made["id"])
        raise
    return {"snapshotID": made["id"], "names": [_full_name(name, tag)]}


@router.get("/snapshots")
async def list_snapshots(request: Request) -> JSONResponse:
    """The caller's ready snapshots, oldest first; ``sandboxID`` and ``name`` (an id or a name) filter,
    ``limit`` (at most 100) and ``nextToken`` page, the next token in ``x-next-token``."""
    services, principal = await callers.caller(request.scope, None)
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
        async with services.sessions() as session:
            tagged = await _tagged_ids(session, principal.user_id, ref)
        statement = statement.where(or_(Snapshot.id == ref, Snapshot.name == ref, Snapshot.id.in_(tagged)))
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
        tags = await store.tags_of(session, [row.id for row in page])
    headers = {"x-next-token": page[-1].id} if len(rows) > limit else {}
    return JSONResponse([view(row, tags.get(row.id, [])) for row in page], headers=headers)


async def _tagged_ids(session: AsyncSession, user_id: str, ref: str) -> list[str]:
    """The snapshots ``name`` (every tag) or ``name:tag`` names; none for what is no such name."""
    try:
        name, tag = split_name(ref)
    except errors.ValidationFailed:
        return []
    return await store.tagged(session, user_id, name, tag)


async def delete_if_snapshot(request: Request, user_id: str, ref: str) -> bool:
    """``DELETE /templates/{id}`` for a snapshot (the SDK's ``delete_snapshot``): True when ``ref`` is one
    of the caller's snapshots and it is deleted, False when it names none."""
    services = request.app.state.services
    if len(ref) > 128:
        return False
    async with services.sessions() as session:
        snapshot_id = await snapshot_for(session, user_id, ref)
        if snapshot_id is None:
            try:
                snapshot_id = (await snapshots.get_owned(session, user_id, ref)).id
            except errors.NotFound:
                return False
    await snapshots.delete_snapshot(services, user_id, snapshot_id)
    async with transaction(services.sessions) as session:
        await store.untag(session, snapshot_id)
    return True
