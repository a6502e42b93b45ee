"""E2B's template catalog on Paddock's templates: the caller's templates (``GET /templates``, ``GET
/v2/templates``), E2B's own (``GET /default-templates``), one with its builds (``GET /templates/{id}``),
its visibility (``PATCH /templates/{id}``, ``PATCH /v2/templates/{id}``), a build's log (``GET
/templates/{id}/builds/{buildID}/logs``) and the tag queries (``…/tags/count``, ``/tags/exists``,
``/tags/groups``, ``/tags/{tag}/assignments``). The build routes (templates.py) make what these read.

Where Paddock keeps less than E2B, the answers say so (docs/e2b.md has the table):

- ``templateID`` is the template's name, as the build routes take it; ``buildID`` is the E2B build that
  made the live Paddock template of that name or, for one no E2B build made (``/v1``),
  ``templates.derived_build_id`` of its id, which the build routes (status, logs) answer too.
- A build replaces the template of its name, so a template's ``builds`` are those whose Paddock
  template is still live: the latest (and, while a ``/v1`` rebuild of it runs, the one it replaces).
- ``spawnCount``/``lastSpawnedAt`` count the sandboxes booted from the template's image (forks
  included, whatever their state now), so a rebuild starts them again; one grouped query a page.
- A tag names its current build only (``e2b_template_tags`` keeps no history): its one "assignment" is
  that row, so a tag group holds at most one and ``hasMore`` is false.
- Templates are private to their account: ``public: true`` is a 501.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import StrictBool
from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.edge.api.routes.bodies import optional_body
from paddock_controlplane.edge.e2b import errors as e2b_errors
from paddock_controlplane.edge.e2b import identity
from paddock_controlplane.edge.e2b import templates as e2b_templates
from paddock_controlplane.edge.e2b.params import LAST_UNIX_MS, LOG_LEVELS, choice_param, int_param
from paddock_controlplane.edge.e2b.schemas import Body
from paddock_controlplane.edge.e2b.templates import E2bTemplateBuild, E2bTemplateTag
from paddock_controlplane.records.models import Sandbox, Template, TemplateLogLine
from paddock_controlplane.resources import catalog
from paddock_controlplane.resources.templates import REPLACED
from paddock_core import errors
from paddock_core.timeutil import as_utc, rfc3339

router = APIRouter()

#: ``GET /templates`` lists at most this many (E2B's own cap); past it, a 400 points at ``/v2/templates``.
MAX_UNPAGED = 5000
#: A page of ``/v2/templates`` or of a template's builds (E2B's ``limit``: at most 100).
MAX_LIMIT = 100
#: Lines a build-log page holds at most (E2B's maximum ``limit``).
MAX_LOG_LIMIT = 100
#: Tag groups a page and assignments a group or a page (E2B's defaults are 25, 6 and 50; it publishes no
#: maximum, so this is Paddock's).
MAX_TAG_PAGE = 100
#: A cursor this API gave is short; longer is not one.
MAX_CURSOR_CHARS = 512
#: ``createdAt`` of E2B's own templates: catalog images carry no date.
CATALOG_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
TAG_SORTS = ("latest_desc", "latest_asc", "name_asc", "name_desc")
#: The namespace of an assignment's id (a UUID of the user, name, tag and build).
ASSIGNMENTS = uuid.UUID("9b4f3c1a-7d2e-4a86-b0c5-2e6f8a1d4c37")


class UpdateRequest(Body):
    """``PATCH /templates/{id}`` and ``PATCH /v2/templates/{id}`` (``TemplateUpdateRequest``)."""

    public: StrictBool | None = None


@dataclass(frozen=True)
class Resources:
    """What a sandbox of an E2B template boots with: the shape its build asked, else the E2B API's
    (:func:`install`)."""

    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    #: The most CPUs a create may ask (a resizable template's ``maxCpuCount``); None: fixed-size.
    max_cpu_count: int | None = None

    @classmethod
    def of(cls, shape_id: str, max_cpu_count: int | None = None) -> Resources:
        shape = catalog.SHAPES_BY_ID[shape_id]
        return cls(shape.vcpu, shape.mem_mib, shape.default_disk_mib, max_cpu_count)

    def view(self) -> dict[str, int]:
        view = {"cpuCount": self.cpu_count, "memoryMB": self.memory_mb, "diskSizeMB": self.disk_size_mb}
        if self.max_cpu_count is not None:  # E2B sets it only for resizable templates
            view["maxCpuCount"] = self.max_cpu_count
        return view


@dataclass(frozen=True)
class Usage:
    """How often a template's image was booted, and when last."""

    spawn_count: int = 0
    last_spawned_at: dt.datetime | None = None


# --- cursors --------------------------------------------------------------------------------------


def encode_cursor(*parts: str) -> str:
    """An opaque cursor holding ``parts`` (where the next page starts)."""
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode().rstrip("=")


def decode_cursor(token: str, field: str, count: int) -> list[str]:
    """The ``count`` parts of a cursor :func:`encode_cursor` made; anything else is a 400 naming ``field``."""
    refused = errors.ValidationFailed.field(field, "is not a cursor this API gave")
    if len(token) > MAX_CURSOR_CHARS:
        raise refused
    try:
        parts = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except ValueError:  # bad base64, bad UTF-8 and bad JSON are all ValueErrors
        raise refused from None
    if not isinstance(parts, list) or len(parts) != count or not all(isinstance(p, str) for p in parts):
        raise refused
    return parts


def cursor_time(text: str, field: str) -> dt.datetime:
    try:
        return as_utc(dt.datetime.fromisoformat(text))
    except ValueError:
        raise errors.ValidationFailed.field(field, "is not a cursor this API gave") from None


# --- views ---------------------------------------------------------------------------------------


def build_status(template: Template) -> str:
    return (
        "error" if template.deleted_at is not None else e2b_templates.STATUS.get(template.status, "building")
    )


def template_view(
    template: Template, build_id: str, usage: Usage, build_count: int, resources: Resources
) -> dict[str, Any]:
    """A live Paddock template as E2B's ``Template``."""
    return {
        "templateID": template.name,
        "buildID": build_id,
        **resources.view(),
        "public": False,
        "aliases": [template.name],
        "names": [template.name],
        "createdAt": rfc3339(template.created_at),
        "updatedAt": rfc3339(template.built_at or template.created_at),
        "createdBy": None,
        "lastSpawnedAt": rfc3339(usage.last_spawned_at) if usage.last_spawned_at else None,
        "spawnCount": usage.spawn_count,
        "buildCount": max(1, build_count),
        "envdVersion": identity.ENVD_VERSION,
        "buildStatus": build_status(template),
        "isDefault": False,
    }


def build_view(
    build_id: str, created_at: dt.datetime, template: Template, resources: Resources
) -> dict[str, Any]:
    """A build as E2B's ``TemplateBuild``; ``created_at`` is when the build was asked for."""
    view: dict[str, Any] = {
        "buildID": build_id,
        "status": build_status(template),
        "createdAt": rfc3339(created_at),
        "updatedAt": rfc3339(template.built_at or template.created_at),
        **resources.view(),
        "envdVersion": identity.ENVD_VERSION,
    }
    if template.built_at is not None:
        view["finishedAt"] = rfc3339(template.built_at)
    return view


def default_templates(resources: Resources) -> list[dict[str, Any]]:
    """E2B's own templates Paddock maps (``identity.TEMPLATES``), one per image, its names together, by
    ``templateID``; they are every account's, so their usage fields are zero."""
    names_by_image: dict[str, list[str]] = {}
    for name, image in identity.TEMPLATES.items():
        names_by_image.setdefault(image, []).append(name)
    views = [
        {
            "templateID": names[0],
            "buildID": e2b_templates.derived_build_id(image),
            **resources.view(),
            "public": True,
            "aliases": names,
            "names": names,
            "createdAt": rfc3339(CATALOG_EPOCH),
            "updatedAt": rfc3339(CATALOG_EPOCH),
            "createdBy": None,
            "lastSpawnedAt": None,
            "spawnCount": 0,
            "buildCount": 0,
            "envdVersion": identity.ENVD_VERSION,
            "buildStatus": "ready",
            "isDefault": True,
        }
        for image, names in names_by_image.items()
    ]
    return sorted(views, key=lambda view: str(view["templateID"]))


def assignment_id(user_id: str, name: str, tag: str, build_id: str) -> str:
    return str(uuid.uuid5(ASSIGNMENTS, "\n".join((user_id, name, tag, build_id))))


def assignment_view(row: E2bTemplateTag, build: E2bTemplateBuild, template: Template) -> dict[str, Any]:
    """A tag's current build as E2B's ``TemplateTagAssignment`` (the only one Paddock keeps)."""
    return {
        "assignmentId": assignment_id(row.user_id, row.name, row.tag, row.build_id),
        "buildId": row.build_id,
        "assignedAt": rfc3339(row.created_at),
        "buildCreatedAt": rfc3339(build.created_at),
        "buildFinishedAt": rfc3339(template.built_at) if template.built_at else None,
    }


# --- reading -------------------------------------------------------------------------------------


def _listed(user_id: str) -> Select[Template]:
    """The caller's live templates, not those a rebuild replaces (listed by their name's new build)."""
    return select(Template).where(
        Template.user_id == user_id, Template.deleted_at.is_(None), Template.name.not_like(f"{REPLACED}%")
    )


async def annotate(
    session: AsyncSession, user_id: str, rows: Sequence[Template], resources: Resources
) -> list[dict[str, Any]]:
    """``rows`` as E2B's ``Template``s, with three grouped queries for the whole page: the E2B build of
    each, the E2B builds of each name, and the sandboxes booted from each."""
    if not rows:
        return []
    ids = [row.id for row in rows]
    names = sorted({row.name for row in rows})
    mine = (E2bTemplateBuild.user_id == user_id, E2bTemplateBuild.name.in_(names))
    made_by = select(
        E2bTemplateBuild.template_id,
        E2bTemplateBuild.build_id,
        E2bTemplateBuild.shape,
        E2bTemplateBuild.max_cpu_count,
    ).where(*mine, E2bTemplateBuild.template_id.in_(ids))
    made = (await session.execute(made_by)).tuples().all()
    build_of = {template_id: build_id for template_id, build_id, _, _ in made}
    # The sizes a build asked (``cpuCount``, ``memoryMB``: templates.shape_for, and ``maxCpuCount``),
    # else the API's.
    sized = {
        template_id: Resources.of(shape, most) if shape else replace(resources, max_cpu_count=most)
        for template_id, _, shape, most in made
        if shape or most
    }
    counted = (
        select(E2bTemplateBuild.name, func.count())
        .where(*mine, E2bTemplateBuild.template_id.is_not(None))
        .group_by(E2bTemplateBuild.name)
    )
    builds_of_name = {name: int(count) for name, count in (await session.execute(counted)).tuples()}
    booted = (
        select(Sandbox.rootfs, func.count(), func.max(Sandbox.created_at))
        .where(Sandbox.user_id == user_id, Sandbox.rootfs.in_(ids))
        .group_by(Sandbox.rootfs)
    )
    usage = {
        rootfs: Usage(int(count), last) for rootfs, count, last in (await session.execute(booted)).tuples()
    }
    return [
        template_view(
            row,
            build_of.get(row.id) or e2b_templates.derived_build_id(row.id),
            usage.get(row.id, Usage()),
            builds_of_name.get(row.name, 0),
            sized.get(row.id, resources),
        )
        for row in rows
    ]


async def all_templates(session: AsyncSession, user_id: str, resources: Resources) -> list[dict[str, Any]]:
    """Every live template of the caller's, newest first; more than :data:`MAX_UNPAGED` is a 400."""
    rows = (await session.scalars(_listed(user_id).order_by(Template.id.desc()).limit(MAX_UNPAGED + 1))).all()
    if len(rows) > MAX_UNPAGED:
        raise errors.ValidationFailed(f"more than {MAX_UNPAGED} templates: page them with GET /v2/templates")
    return await annotate(session, user_id, rows, resources)


async def template_page(
    session: AsyncSession, user_id: str, after_id: str | None, limit: int, resources: Resources
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the caller's live templates, newest first, after the template ``after_id``, and the
    next page's token. Ids are ULIDs: their order is their creation order."""
    statement = _listed(user_id)
    if after_id is not None:
        statement = statement.where(Template.id < after_id)
    rows = (await session.scalars(statement.order_by(Template.id.desc()).limit(limit + 1))).all()
    page = await annotate(session, user_id, rows[:limit], resources)
    return page, (rows[limit - 1].id if len(rows) > limit else None)


async def live_template(session: AsyncSession, user_id: str, name: str) -> Template:
    """The caller's live template ``name``; a 404 for any other account's, or none."""
    template = (await session.scalars(_listed(user_id).where(Template.name == name))).first()
    if template is None:
        raise errors.NotFound(f"template {name!r} not found")
    return template


@dataclass(frozen=True)
class Build:
    """One of a template's builds: when it was asked for, its id, and the Paddock template it made."""

    created_at: dt.datetime
    build_id: str
    template: Template

    @property
    def key(self) -> tuple[dt.datetime, str]:
        return self.created_at, self.build_id


async def live_builds(session: AsyncSession, user_id: str, template: Template) -> list[Build]:
    """The builds of ``template``'s name whose Paddock template is live, newest first: its E2B builds,
    and the one the catalog shows for a template no E2B build made. At most two (the latest, and the
    one a running ``/v1`` rebuild replaces); bounded all the same."""
    rows = (
        await session.execute(
            select(E2bTemplateBuild, Template)
            .join(Template, Template.id == E2bTemplateBuild.template_id)
            .where(
                E2bTemplateBuild.user_id == user_id,
                E2bTemplateBuild.name == template.name,
                Template.user_id == user_id,
                Template.deleted_at.is_(None),
            )
            .limit(MAX_LIMIT)
        )
    ).tuples()
    builds = [Build(as_utc(build.created_at), build.build_id, made) for build, made in rows]
    if not any(build.template.id == template.id for build in builds):
        derived = e2b_templates.derived_build_id(template.id)
        builds.append(Build(as_utc(template.created_at), derived, template))
    return sorted(builds, key=lambda build: build.key, reverse=True)


async def template_with_builds(
    session: AsyncSession,
    user_id: str,
    name: str,
    after: tuple[dt.datetime, str] | None,
    limit: int,
    resources: Resources,
) -> tuple[dict[str, Any], str | None]:
    """``TemplateWithBuilds`` of the caller's template ``name``, with the page of its live builds after
    ``after``, and the next page's cursor."""
    template = await live_template(session, user_id, name)
    view = (await annotate(session, user_id, [template], resources))[0]
    builds = [
        build for build in await live_builds(session, user_id, template) if after is None or build.key < after
    ]
    page = builds[:limit]
    # The template's own sizes
    own = Resources(view["cpuCount"], view["memoryMB"], view["diskSizeMB"], view.get("maxCpuCount"))
    view["builds"] = [build_view(build.build_id, build.created_at, build.template, own) for build in page]
    more = len(builds) > limit
    return view, (encode_cursor(page[-1].created_at.isoformat(), page[-1].build_id) if more else None)


async def check_known(session: AsyncSession, user_id: str, name: str) -> None:
    """A 404 for a name with neither a live template nor a tag of the caller's (``GET …/tags``'s rule)."""
    tagged = await session.scalar(
        select(E2bTemplateTag.tag)
        .where(E2bTemplateTag.user_id == user_id, E2bTemplateTag.name == name)
        .limit(1)
    )
    if tagged is None:
        await live_template(session, user_id, name)


def ready_tags(user_id: str, name: str) -> Select[E2bTemplateTag, E2bTemplateBuild, Template]:
    """``name``'s tags whose build's Paddock template is live and ready, with that build and template."""
    return (
        select(E2bTemplateTag, E2bTemplateBuild, Template)
        .join(E2bTemplateBuild, E2bTemplateBuild.build_id == E2bTemplateTag.build_id)
        .join(Template, Template.id == E2bTemplateBuild.template_id)
        .where(
            E2bTemplateTag.user_id == user_id,
            E2bTemplateTag.name == name,
            E2bTemplateBuild.user_id == user_id,
            Template.user_id == user_id,
            Template.deleted_at.is_(None),
            Template.status == "ready",
        )
    )


async def count_ready_tags(session: AsyncSession, user_id: str, name: str) -> int:
    await check_known(session, user_id, name)
    total = await session.scalar(select(func.count()).select_from(ready_tags(user_id, name).subquery()))
    return int(total or 0)


async def ready_tag(session: AsyncSession, user_id: str, name: str, tag: str) -> dict[str, Any] | None:
    """The assignment of ``name:tag`` while its build is ready, else None (a 404 for an unknown name)."""
    await check_known(session, user_id, name)
    found = (
        (await session.execute(ready_tags(user_id, name).where(E2bTemplateTag.tag == tag))).tuples().first()
    )
    return assignment_view(*found) if found is not None else None


@dataclass(frozen=True)
class TagQuery:
    """What ``GET …/tags/groups`` asks: the order, a substring of the tag, where the page starts."""

    sort: str = "latest_desc"
    search: str = ""
    after: tuple[dt.datetime | None, str] | None = None

    @property
    def descending(self) -> bool:
        return self.sort.endswith("_desc")

    @property
    def by_time(self) -> bool:
        return self.sort.startswith("latest")


def parse_tags_cursor(token: str, sort: str) -> tuple[dt.datetime | None, str]:
    """Where a ``tagsCursor`` this API gave for ``sort`` starts; a 400 naming it otherwise."""
    cursor_sort, at_text, tag = decode_cursor(token, "tagsCursor", 3)
    if cursor_sort != sort:
        raise errors.ValidationFailed.field("tagsCursor", f"was given for sort {cursor_sort}, not {sort}")
    return (cursor_time(at_text, "tagsCursor") if sort.startswith("latest") else None), tag


async def tag_group_page(
    session: AsyncSession, user_id: str, name: str, query: TagQuery, limit: int
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of ``name``'s ready tags as E2B's ``TemplateTagGroup``s, and the next page's cursor."""
    await check_known(session, user_id, name)
    statement = ready_tags(user_id, name)
    if query.search:
        statement = statement.where(E2bTemplateTag.tag.contains(query.search, autoescape=True))
    if query.after is not None:
        at, tag = query.after
        beyond = E2bTemplateTag.tag < tag if query.descending else E2bTemplateTag.tag > tag
        if at is not None:
            past = E2bTemplateTag.created_at < at if query.descending else E2bTemplateTag.created_at > at
            beyond = or_(past, and_(E2bTemplateTag.created_at == at, beyond))
        statement = statement.where(beyond)
    keys = [E2bTemplateTag.created_at, E2bTemplateTag.tag] if query.by_time else [E2bTemplateTag.tag]
    ordered = statement.order_by(*(key.desc() if query.descending else key.asc() for key in keys))
    rows = (await session.execute(ordered.limit(limit + 1))).tuples().all()
    page = rows[:limit]
    groups = [
        {"tag": row.tag, "assignments": [assignment_view(row, build, made)], "hasMore": False}
        for row, build, made in page
    ]
    if len(rows) <= limit:
        return groups, None
    last = page[-1][0]
    return groups, encode_cursor(query.sort, as_utc(last.created_at).isoformat(), last.tag)


async def log_page(
    session: AsyncSession,
    template_id: str,
    *,
    since_ms: int | None,
    backward: bool,
    errors_only: bool,
    limit: int,
) -> list[dict[str, Any]]:
    """``limit`` of a Paddock template's build log lines as E2B's ``BuildLogEntry``s: from ``since_ms``
    on, oldest first, or (``backward``) up to it, newest first."""
    statement = select(TemplateLogLine).where(TemplateLogLine.template_id == template_id)
    if errors_only:  # Paddock's lines are info or error
        statement = statement.where(TemplateLogLine.level == "error")
    if since_ms is not None:
        at = CATALOG_EPOCH + dt.timedelta(milliseconds=since_ms)
        statement = statement.where(TemplateLogLine.ts <= at if backward else TemplateLogLine.ts >= at)
    if backward:
        statement = statement.order_by(TemplateLogLine.ts.desc(), TemplateLogLine.id.desc())
    else:
        statement = statement.order_by(TemplateLogLine.ts, TemplateLogLine.id)
    lines = (await session.scalars(statement.limit(limit))).all()
    return [
        {
            "timestamp": rfc3339(line.ts),
            "level": "error" if line.level == "error" else "info",
            "message": line.line,
        }
        for line in lines
    ]


# --- routes --------------------------------------------------------------------------------------


def install(app: FastAPI, shape_id: str) -> None:
    """Serves these routes on the E2B API's ``app``, whose sandboxes boot with the shape ``shape_id``:
    its templates say so."""
    app.state.e2b_template_resources = Resources.of(shape_id)
    app.include_router(router)


def _resources(request: Request) -> Resources:
    resources: Resources = request.app.state.e2b_template_resources
    return resources


@router.get("/templates")
async def list_templates(request: Request) -> list[dict[str, Any]]:
    """Every live template of the caller's, newest first (``teamID`` is accepted and not acted on)."""
    services, user_id = await e2b_templates.caller(request)
    async with services.sessions() as session:
        return await all_templates(session, user_id, _resources(request))


@router.get("/v2/templates")
async def list_templates_v2(request: Request) -> JSONResponse:
    """A page of the caller's live templates, newest first: ``limit`` (at most 100) and ``nextToken``,
    the next one in ``x-next-token``."""
    services, user_id = await e2b_templates.caller(request)
    query = request.query_params
    limit = int_param(query, "limit", 1, MAX_LIMIT) or MAX_LIMIT
    token = query.get("nextToken") or None
    if token is not None and (not token.startswith("tpl_") or len(token) > 40):
        raise errors.ValidationFailed.field("nextToken", "is not a token this API gave")
    async with services.sessions() as session:
        page, next_token = await template_page(session, user_id, token, limit, _resources(request))
    return JSONResponse(page, headers={"x-next-token": next_token} if next_token else {})


@router.get("/default-templates")
async def list_default_templates(request: Request) -> list[dict[str, Any]]:
    await e2b_templates.caller(request)
    return default_templates(_resources(request))


@router.get("/templates/{template_id}")
async def get_template(template_id: str, request: Request) -> JSONResponse:
    """A template with a page of its live builds, newest first (``limit`` at most 100, ``nextToken``; the
    next one in ``x-next-token``). One of E2B's own names answers that template with no builds (its
    image is not the account's build); a snapshot is not a template here (404; ``GET /snapshots``)."""
    services, user_id = await e2b_templates.caller(request)
    query = request.query_params
    limit = int_param(query, "limit", 1, MAX_LIMIT) or MAX_LIMIT
    token = query.get("nextToken")
    after = None
    if token:
        at_text, build_id = decode_cursor(token, "nextToken", 2)
        after = (cursor_time(at_text, "nextToken"), build_id)
    name = e2b_templates.plain_name(template_id, "templateID")
    if name in identity.TEMPLATES:
        own = next(view for view in default_templates(_resources(request)) if name in view["names"])
        return JSONResponse({**own, "builds": []})
    async with services.sessions() as session:
        view, next_token = await template_with_builds(
            session, user_id, name, after, limit, _resources(request)
        )
    return JSONResponse(view, headers={"x-next-token": next_token} if next_token else {})


async def _update(template_id: str, request: Request) -> str:
    """A ``PATCH``'s checks: the body (400), the template (404), ``public: true`` (501). Nothing changes:
    Paddock's templates are private to their account, which ``public: false`` asks for."""
    services, user_id = await e2b_templates.caller(request)
    body = await optional_body(request, UpdateRequest)
    name = e2b_templates.plain_name(template_id, "templateID")
    if name in identity.TEMPLATES:
        raise errors.Forbidden(f"templateID: {name!r} is one of E2B's own templates, not the caller's")
    async with services.sessions() as session:
        await live_template(session, user_id, name)
    if body.public:
        raise e2b_errors.NotBuilt(
            "public: Paddock's templates are private to their account (publishing one would let other "
            "accounts boot an image a tenant built); not built"
        )
    return name


@router.patch("/templates/{template_id}")
async def update_template(template_id: str, request: Request) -> Response:
    """E2B's older route: 200 with no body, as its client reads it."""
    await _update(template_id, request)
    return Response(status_code=200)


@router.patch("/v2/templates/{template_id}")
async def update_template_v2(template_id: str, request: Request) -> dict[str, Any]:
    return {"names": [await _update(template_id, request)]}


@router.get("/templates/{template_id}/builds/{build_id}/logs")
async def build_logs(template_id: str, build_id: str, request: Request) -> dict[str, Any]:
    """A build's log lines from ``cursor`` (milliseconds since the epoch), ``direction`` ``forward``
    (oldest first, from the cursor on) or ``backward`` (newest first, up to it), at ``level`` or above,
    ``limit`` (at most 100) of them. Paddock keeps one log, so ``source`` is accepted and not acted on."""
    services, user_id = await e2b_templates.caller(request)
    query = request.query_params
    since_ms = int_param(query, "cursor", 0, LAST_UNIX_MS)
    limit = int_param(query, "limit", 0, MAX_LOG_LIMIT)
    backward = choice_param(query, "direction", ("forward", "backward")) == "backward"
    level = choice_param(query, "level", LOG_LEVELS)
    choice_param(query, "source", ("temporary", "persistent"))
    build = await e2b_templates.find_build(services, user_id, template_id, build_id)
    if build.template_id is None:  # asked for, not started
        return {"logs": []}
    async with services.sessions() as session:
        if await session.get(Template, build.template_id) is None:
            raise errors.NotFound(f"build {build_id!r} not found")
        logs = await log_page(
            session,
            build.template_id,
            since_ms=since_ms,
            backward=backward,
            errors_only=level in ("warn", "error"),
            limit=MAX_LOG_LIMIT if limit is None else limit,
        )
    return {"logs": logs}


@router.get("/templates/{template_id}/tags/count")
async def count_tags(template_id: str, request: Request) -> dict[str, Any]:
    """How many of the template's tags name a ready build."""
    services, user_id = await e2b_templates.caller(request)
    name = e2b_templates.plain_name(template_id, "templateID")
    async with services.sessions() as session:
        return {"total": await count_ready_tags(session, user_id, name)}


def _tag(raw: str) -> str:
    tag = raw.strip()
    if not e2b_templates.TAG.match(tag):
        raise errors.ValidationFailed.field("tag", "a tag must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    return tag


@router.get("/templates/{template_id}/tags/exists")
async def tag_exists(template_id: str, request: Request) -> dict[str, Any]:
    """Whether ``tag`` (trimmed: ``normalizedTag``) names a ready build of the template."""
    services, user_id = await e2b_templates.caller(request)
    name = e2b_templates.plain_name(template_id, "templateID")
    tag = _tag(request.query_params.get("tag") or "")
    async with services.sessions() as session:
        found = await ready_tag(session, user_id, name, tag)
    return {"exists": found is not None, "normalizedTag": tag}


@router.get("/templates/{template_id}/tags/groups")
async def tag_groups(template_id: str, request: Request) -> dict[str, Any]:
    """The template's tags that name a ready build, each with its assignment (the one Paddock keeps),
    ``sort``ed (``latest_*`` by when the tag was last pointed, ``name_*`` by tag), ``search`` a substring
    of the tag, ``tagsLimit`` a page (at most 100) from ``tagsCursor``."""
    services, user_id = await e2b_templates.caller(request)
    query = request.query_params
    name = e2b_templates.plain_name(template_id, "templateID")
    int_param(query, "assignmentLimit", 1, MAX_TAG_PAGE)  # checked; a group holds one at most
    limit = int_param(query, "tagsLimit", 1, MAX_TAG_PAGE) or 25
    sort = choice_param(query, "sort", TAG_SORTS) or "latest_desc"
    search = query.get("search") or ""
    if len(search) > 64:
        raise errors.ValidationFailed.field("search", "at most 64 characters (a tag is at most 63)")
    token = query.get("tagsCursor")
    tag_query = TagQuery(sort, search, parse_tags_cursor(token, sort) if token else None)
    async with services.sessions() as session:
        groups, next_cursor = await tag_group_page(session, user_id, name, tag_query, limit)
    return {"tags": groups, "nextCursor": next_cursor}


@router.get("/templates/{template_id}/tags/{tag}/assignments")
async def tag_assignments(template_id: str, tag: str, request: Request) -> dict[str, Any]:
    """A tag's assignments: the one Paddock keeps (its current build, while that build's template is
    ready), so there is never a next page and no ``cursor`` this API gave (one is a 400); ``limit`` is
    checked (1 to 100)."""
    services, user_id = await e2b_templates.caller(request)
    query = request.query_params
    name = e2b_templates.plain_name(template_id, "templateID")
    tag = _tag(tag)
    int_param(query, "limit", 1, MAX_TAG_PAGE)
    if query.get("cursor"):
        raise errors.ValidationFailed.field("cursor", "is not a cursor this API gave (it gives none)")
    async with services.sessions() as session:
        found = await ready_tag(session, user_id, name, tag)
    return {"data": [found] if found is not None else [], "nextCursor": None}
