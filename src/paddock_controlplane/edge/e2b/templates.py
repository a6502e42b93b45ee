"""E2B's template build system v2 on Paddock's template builds (``templates``, ``template_builds``).

``POST /v3/templates`` names a build; the SDK then asks, for each ``COPY`` step, whether the server
holds the archive of its files (``GET /templates/{id}/files/{hash}``) and uploads it to the URL it is
given, which authorises itself (an HMAC of the user, the hash and an expiry, so the upload needs no
key); ``POST /v2/templates/{id}/builds/{buildID}`` turns the steps into a Dockerfile and the uploaded
archives into one build context and submits it as ``POST /v1/templates`` would; the status route reads
the template's state and build log from ``logsOffset``. The E2B ``templateID`` is the template's name,
which is also what ``Sandbox.create("<name>")`` boots. A template no E2B build made (``/v1``) answers
to the build id :func:`derived_build_id` gives it, the one the catalog lists (template_catalog.py).

E2B's tags (``e2b_template_tags``, migration 0024) name builds: a build of ``name`` with ``tags`` gets
those (``default`` when it names none), ``POST /templates/tags`` points more tags at the build a
``name:tag`` names, ``DELETE /templates/tags`` removes some, ``GET /templates/{name}/tags`` lists them,
and ``Sandbox.create("name:tag")`` boots the Paddock template of the tag's build. A build still replaces
the template of its name (``name`` alone boots the latest): a tag whose build was replaced names nothing
and its create is a 404, where E2B keeps every build.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import hmac
import io
import json
import os
import posixpath
import re
import tarfile
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field, StrictBool, StrictInt, StrictStr
from sqlalchemy import ForeignKey, String, select
from sqlalchemy import delete as sql_delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.edge.e2b import callers, identity
from paddock_controlplane.edge.e2b import errors as e2b_errors
from paddock_controlplane.edge.e2b import snapshots as e2b_snapshots
from paddock_controlplane.edge.e2b.schemas import Body
from paddock_controlplane.edge.e2b.start_command import MAX_COMMAND_CHARS, StartCommand
from paddock_controlplane.records.models import Base, Template, TemplateLogLine
from paddock_controlplane.records.schemas.templates import TemplateCreateRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.snapshots import ID_PREFIX as SNAPSHOT_PREFIX
from paddock_controlplane.records.snapshots import Snapshot
from paddock_controlplane.resources import catalog, templates
from paddock_core import errors
from paddock_core.crypto import purpose_key
from paddock_core.db import transaction
from paddock_core.rootfs import ROOT_IMAGES_BY_NAME
from paddock_core.timeutil import rfc3339

router = APIRouter()

#: How long an upload URL stays valid.
UPLOAD_TTL_S = 3600
#: One COPY step's archive, as uploaded (the whole build context has the same cap, ``templates``).
MAX_UPLOAD_BYTES = templates.MAX_CONTEXT_BYTES
#: Archives kept per account; past it the least recently uploaded go (a later build re-uploads them).
MAX_STORED_UPLOADS = 128
#: Log entries per status answer (E2B's own page).
LOG_PAGE = 100
#: Steps per build (bounded input).
MAX_STEPS = 512
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")
#: E2B's base images, as the SDK names them, and the catalog images they are built from.
BASE_IMAGES = {
    "e2bdev/base": identity.BASE_IMAGE,
    "e2bdev/base:latest": identity.BASE_IMAGE,
    "e2bdev/code-interpreter": "code-interpreter:1",
    "e2bdev/code-interpreter:latest": "code-interpreter:1",
    # ``Template().from_debian_image()`` asks for ``debian:stable``. Debian 13 (trixie) is stable, so
    # these tags name the tree debian:13 holds; when Debian 14 is released they move on, and so must this.
    "debian": "debian:13",
    "debian:latest": "debian:13",
    "debian:stable": "debian:13",
    "debian:trixie": "debian:13",
}
#: Tags per request (bounded input).
MAX_TAGS = 16
#: E2B's tag for a build given none.
DEFAULT_TAG = "default"
#: A tag: what a template name may be (letters, digits, ``.``, ``_``, ``-``).
TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
STATUS = {"pending": "waiting", "building": "building", "ready": "ready", "failed": "error"}
#: The namespace of :func:`derived_build_id`'s UUIDs (a constant: the ids must not change).
DERIVED_BUILDS = uuid.UUID("5d0b6a52-3f43-4c1e-9a4e-1d3c8f2b7e61")


class E2bTemplateBuild(Base):
    __tablename__ = "e2b_template_builds"

    build_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(40), ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    #: The Paddock template, once the build was started.
    template_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column()
    #: Its start and ready commands (``StartCommand.as_json``, migration 0032), run at each create.
    start: Mapped[dict[str, Any] | None] = mapped_column(nullable=True)
    #: The shape its sandboxes boot with (``shape_for``, migration 0033); None: the E2B API's.
    shape: Mapped[str | None] = mapped_column(String(40), nullable=True)
    #: The most CPUs a create may ask (``maxCpuCount``, migration 0034); None: only the template's own.
    max_cpu_count: Mapped[int | None] = mapped_column(nullable=True)


class E2bTemplateTag(Base):
    """E2B's ``name:tag`` of a template build. The build's Paddock template may be gone (replaced by a
    later build of the name, or deleted): such a tag names nothing."""

    __tablename__ = "e2b_template_tags"

    user_id: Mapped[str] = mapped_column(String(40), ForeignKey("users.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    build_id: Mapped[str] = mapped_column(String(40), index=True)
    created_at: Mapped[dt.datetime] = mapped_column()


class AssignTags(Body):
    """``POST /templates/tags`` (``AssignTemplateTagsRequest``)."""

    target: StrictStr = Field(max_length=128)
    tags: list[StrictStr] = Field(max_length=MAX_TAGS)


class RemoveTags(Body):
    """``DELETE /templates/tags`` (``DeleteTemplateTagsRequest``)."""

    name: StrictStr = Field(max_length=128)
    tags: list[StrictStr] = Field(max_length=MAX_TAGS)


class BuildRequest(Body):
    """``POST /v3/templates`` (``TemplateBuildRequestV3``); the resources are the sandbox's, not the build's."""

    name: StrictStr | None = Field(default=None, max_length=63)
    alias: StrictStr | None = Field(default=None, max_length=63)
    tags: list[StrictStr] | None = Field(default=None, max_length=MAX_TAGS)
    cpu_count: StrictInt | None = Field(default=None, alias="cpuCount")
    memory_mb: StrictInt | None = Field(default=None, alias="memoryMB")
    #: Makes the template resizable: a create may ask from 1 to this many CPUs (``cpus_for``).
    max_cpu_count: StrictInt | None = Field(default=None, alias="maxCpuCount")


class Step(Body):
    type: StrictStr
    args: list[StrictStr] = Field(default_factory=list, max_length=1024)
    files_hash: StrictStr | None = Field(default=None, alias="filesHash")
    force: StrictBool | None = None


class BuildStart(Body):
    """``POST /v2/templates/{id}/builds/{buildID}`` (``TemplateBuildStartV2``)."""

    from_image: StrictStr | None = Field(default=None, alias="fromImage")
    from_template: StrictStr | None = Field(default=None, alias="fromTemplate")
    from_image_registry: dict[str, Any] | None = Field(default=None, alias="fromImageRegistry")
    force: StrictBool | None = None
    steps: list[Step] = Field(default_factory=list, max_length=MAX_STEPS)
    start_cmd: StrictStr | None = Field(default=None, alias="startCmd", max_length=MAX_COMMAND_CHARS)
    ready_cmd: StrictStr | None = Field(default=None, alias="readyCmd", max_length=MAX_COMMAND_CHARS)


async def caller(request: Request) -> tuple[Services, str]:
    services, principal = await callers.caller(request.scope, None)
    return services, principal.user_id


def _files_dir(services: Services, user_id: str) -> Path:
    path = services.settings.data_dir / "e2b-files" / user_id
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _upload_key(services: Services) -> bytes:
    return purpose_key(services.settings.secret_key.get_secret_value(), b"paddock-e2b-upload")


def upload_token(services: Services, user_id: str, files_hash: str, expires: int) -> str:
    payload = f"{user_id}.{files_hash}.{expires}"
    mac = hmac.new(_upload_key(services), payload.encode(), hashlib.sha256).hexdigest()
    return f"{payload}.{mac}"


def check_upload_token(services: Services, token: str) -> tuple[str, str]:
    """The user and hash a token names, or 403 for a forged, altered or expired one."""
    parts = token.split(".")
    if len(parts) != 4 or not _HASH_RE.match(parts[1]) or not parts[2].isdigit():
        raise errors.Forbidden("upload URL is not valid")
    user_id, files_hash, expires, mac = parts
    expected = hmac.new(_upload_key(services), f"{user_id}.{files_hash}.{expires}".encode(), hashlib.sha256)
    if not hmac.compare_digest(mac, expected.hexdigest()):
        raise errors.Forbidden("upload URL is not valid")
    if int(expires) < services.clock().timestamp():
        raise errors.Forbidden("upload URL has expired")
    return user_id, files_hash


def plain_name(raw: str | None, field: str) -> str:
    name = (raw or "").strip()
    if "/" in name:
        raise errors.ValidationFailed.field(field, "namespaces ('team/name') are not served; give a name")
    if not templates.NAME.fullmatch(name):
        raise errors.ValidationFailed.field(field, "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    return name


def _check_name(raw: str | None, field: str = "name") -> str:
    name = plain_name(raw, field)
    if name in identity.TEMPLATES:
        raise errors.AlreadyExists(f"{field}: {name!r} is one of E2B's own templates")
    return name


def _check_tags(raw: list[str], field: str = "tags") -> list[str]:
    if not raw:
        raise errors.ValidationFailed.field(field, "must name at least one tag")
    for index, tag in enumerate(raw):
        if not TAG.match(tag):
            raise errors.ValidationFailed.field(
                f"{field}[{index}]", "a tag must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
            )
    return list(dict.fromkeys(raw))


def _split(raw: str, field: str) -> tuple[str, str]:
    """``name:tag`` as ``(name, tag)``, ``name`` as ``(name, "default")``; a 400 naming ``field``."""
    name, sep, tag = raw.partition(":")
    name = plain_name(name, field)
    if sep and not TAG.match(tag):
        raise errors.ValidationFailed.field(field, "a tag must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    return name, (tag if sep else DEFAULT_TAG)


async def _point(
    session: AsyncSession, user_id: str, name: str, tags: list[str], build_id: str, now: dt.datetime
) -> None:
    """Points each of ``name``'s ``tags`` at ``build_id`` (moving it from the build it named). One
    upsert: two requests moving the same tag at once both succeed, the later one's build winning,
    where a delete then an insert made the later one a duplicate key (a 500)."""
    rows = [
        {"user_id": user_id, "name": name, "tag": tag, "build_id": build_id, "created_at": now}
        for tag in tags
    ]
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    insert = dialect.insert(E2bTemplateTag).values(rows)
    await session.execute(
        insert.on_conflict_do_update(
            index_elements=["user_id", "name", "tag"],
            set_={"build_id": insert.excluded.build_id, "created_at": insert.excluded.created_at},
        )
    )


async def _has_tags(session: AsyncSession, user_id: str, name: str) -> bool:
    found = await session.scalar(
        select(E2bTemplateTag.tag)
        .where(E2bTemplateTag.user_id == user_id, E2bTemplateTag.name == name)
        .limit(1)
    )
    return found is not None


async def template_for(session: AsyncSession, user_id: str, ref: str) -> str | None:
    """For a create's ``templateID``: the Paddock template id of the build ``name:tag`` names; for
    ``name:default`` of a name no tag names (a template made through ``/v1``), the template ``name``;
    None when ``ref`` is no tag of the caller's (it then resolves as it always did: ``debian:13`` is
    the catalog image, and an unknown one is a 404)."""
    if ":" not in ref or len(ref) > 128:
        return None
    name, _, tag = ref.partition(":")
    row = await session.get(E2bTemplateTag, (user_id, name, tag))
    if row is None:
        if tag != DEFAULT_TAG or await _has_tags(session, user_id, name):
            return None
        template = await templates.find(session, user_id, name)
        return template.id if template is not None and template.name == name else None
    build = await session.get(E2bTemplateBuild, row.build_id)
    return build.template_id if build is not None else None


#: What a build may ask: E2B's own bounds on ``cpuCount`` and ``memoryMB``, within Paddock's largest shape.
CPU_RANGE = (1, 8)
#: E2B's default ``cpuCount``, a build's when it asks none (its CLI and SDK send 2).
DEFAULT_CPUS = 2
MEMORY_RANGE_MB = (128, 16384)


def shape_for(cpu_count: int | None, memory_mb: int | None) -> str | None:
    """The smallest of Paddock's whole-CPU shapes with at least ``cpu_count`` CPUs and ``memory_mb`` MiB
    (the CPUs first: E2B's sizes are CPU and memory, Paddock's shapes fixed pairs of them, so 3 CPUs
    boot with 4); None when the build asked neither, for the E2B API's shape. A missing one of the two
    is E2B's default (2 CPUs, 1024 MB, as its CLI sends). Out of range is a 400 naming the field."""
    if cpu_count is None and memory_mb is None:
        return None
    cpus, memory = DEFAULT_CPUS if cpu_count is None else cpu_count, 1024 if memory_mb is None else memory_mb
    if not CPU_RANGE[0] <= cpus <= CPU_RANGE[1]:
        raise errors.ValidationFailed.field("cpuCount", f"must be between {CPU_RANGE[0]} and {CPU_RANGE[1]}")
    if not MEMORY_RANGE_MB[0] <= memory <= MEMORY_RANGE_MB[1]:
        raise errors.ValidationFailed.field(
            "memoryMB", f"must be between {MEMORY_RANGE_MB[0]} and {MEMORY_RANGE_MB[1]}"
        )
    fits = [
        shape
        for shape in catalog.SHAPES
        if shape.cpu_quota_pct is None and shape.vcpu >= cpus and shape.mem_mib >= memory
    ]
    return min(fits, key=lambda shape: (shape.vcpu, shape.mem_mib)).id


def _check_max_cpus(max_cpu_count: int | None, shape: str | None) -> int | None:
    """A build's ``maxCpuCount``: at least the template's own CPUs (its shape's, else the E2B API's 2)
    and at most Paddock's largest shape's; else a 400 naming it."""
    if max_cpu_count is None:
        return None
    own = catalog.SHAPES_BY_ID[shape].vcpu if shape else DEFAULT_CPUS
    if not own <= max_cpu_count <= CPU_RANGE[1]:
        raise errors.ValidationFailed.field(
            "maxCpuCount", f"must be between the template's cpuCount ({own}) and {CPU_RANGE[1]}"
        )
    return max_cpu_count


def cpus_for(shape: str, max_cpu_count: int | None, cpu_count: int | None) -> str:
    """The shape a create boots with when it asks ``cpu_count`` CPUs (SDK 2.64's ``cpu_count``) of a
    template whose sandboxes boot with ``shape``: that shape when it asks none or the template's own
    number; for a resizable template (``max_cpu_count``) any number from 1 to that, with the template's
    memory (the smallest shape holding both, so 3 CPUs boot with 4, even past a maximum of 3, as
    :func:`shape_for` rounds a build's sizes). A fixed-size template accepts only its own number, as
    on E2B. Else a 400 naming ``cpuCount``."""
    if cpu_count is None:
        return shape
    own = catalog.SHAPES_BY_ID[shape]
    if cpu_count == own.vcpu:
        return shape
    if max_cpu_count is None:
        raise errors.ValidationFailed.field(
            "cpuCount",
            f"the template has {own.vcpu} CPUs and is not resizable (build it with maxCpuCount); "
            f"ask {own.vcpu} or leave cpuCount out",
        )
    if not 1 <= cpu_count <= max_cpu_count:
        raise errors.ValidationFailed.field(
            "cpuCount", f"must be between 1 and the template's maxCpuCount ({max_cpu_count})"
        )
    return shape_for(cpu_count, own.mem_mib) or shape  # both sizes given: always a shape


async def build_of(session: AsyncSession, user_id: str, ref: str) -> E2bTemplateBuild | None:
    """The E2B build that made the template a create of ``ref`` boots (a template's id or name, as
    ``rootfs`` takes it): its shape and start command, read once per create. None for a catalog image,
    a snapshot or a template no E2B build made."""
    if ref in ROOT_IMAGES_BY_NAME:  # a catalog image (E2B's ``base`` …): no query on the common create
        return None
    template = await templates.bootable(session, user_id, ref)
    if template is None:
        return None
    return await session.scalar(
        select(E2bTemplateBuild)
        .where(E2bTemplateBuild.user_id == user_id, E2bTemplateBuild.template_id == template.id)
        .limit(1)
    )


async def _live_id(session: AsyncSession, user_id: str, name: str) -> str | None:
    template = await templates.find(session, user_id, name)
    return template.id if template is not None else None


#: How many snapshots deep ``start_of`` follows a snapshot to its template (one of a sandbox booted
#: from a snapshot holds the earlier one's id as its image).
MAX_SNAPSHOT_DEPTH = 32


async def start_of(services: Services, user_id: str, template_id: str) -> StartCommand | None:
    """The start command of the user's Paddock template ``template_id`` (``tpl_…``), or of the template
    the user's snapshot ``template_id`` (``snap_…``) was taken of a sandbox of, if an E2B build that
    asked one (or inherited one) made it; None for a catalog image or any other."""
    if not template_id.startswith(("tpl_", SNAPSHOT_PREFIX)):
        return None  # a catalog image: no session on a fork or a wake of the common sandbox
    async with services.sessions() as session:
        for _ in range(MAX_SNAPSHOT_DEPTH):
            if not template_id.startswith(SNAPSHOT_PREFIX):
                break
            snapshot = await session.get(Snapshot, template_id)
            if snapshot is None or snapshot.user_id != user_id:
                return None
            template_id = snapshot.image
        if not template_id.startswith("tpl_"):
            return None
        raw = await session.scalar(
            select(E2bTemplateBuild.start)
            .where(E2bTemplateBuild.user_id == user_id, E2bTemplateBuild.template_id == template_id)
            .limit(1)
        )
    return StartCommand.from_json(raw)


def derived_build_id(key: str) -> str:
    """The build id E2B's routes show for what no E2B build made: a template made through ``/v1`` (``key``
    its Paddock id), one of E2B's own templates (its image). A UUID, as the SDK parses one, and the same
    on every call, so a listed id can be asked about."""
    return str(uuid.uuid5(DERIVED_BUILDS, key))


async def find_build(services: Services, user_id: str, name: str, build_id: str) -> E2bTemplateBuild:
    """The caller's build ``build_id`` of ``name``: an E2B build, or the one the catalog shows for the live
    template ``name`` (:func:`derived_build_id` of its id, unsaved) when it answers to that id."""
    async with services.sessions() as session:
        build = await session.get(E2bTemplateBuild, build_id)
        if build is None and templates.NAME.fullmatch(name):
            template = await templates.find(session, user_id, name)
            if template is not None and template.name == name and derived_build_id(template.id) == build_id:
                return E2bTemplateBuild(
                    build_id=build_id,
                    user_id=user_id,
                    name=name,
                    template_id=template.id,
                    created_at=template.created_at,
                )
    if build is None or build.user_id != user_id or build.name != name:
        raise errors.NotFound(f"build {build_id!r} of template {name!r} not found")
    return build


@router.post("/v3/templates", status_code=202)
async def request_build(body: BuildRequest, request: Request) -> dict[str, Any]:
    services, user_id = await caller(request)
    name = _check_name(body.name or body.alias)
    tags = _check_tags(body.tags) if body.tags is not None else [DEFAULT_TAG]
    shape = shape_for(body.cpu_count, body.memory_mb)
    max_cpu_count = _check_max_cpus(body.max_cpu_count, shape)
    build_id = str(uuid.uuid4())  # E2B's build ids are UUIDs (the SDK parses a tag's ``buildID`` as one)
    now = services.clock()
    async with transaction(services.sessions) as session:
        session.add(
            E2bTemplateBuild(
                build_id=build_id,
                user_id=user_id,
                name=name,
                created_at=now,
                shape=shape,
                max_cpu_count=max_cpu_count,
            )
        )
        await _point(session, user_id, name, tags, build_id, now)
    return {
        "templateID": name,
        "buildID": build_id,
        "public": False,
        "names": [name],
        "tags": body.tags or [],
        "aliases": [name],
    }


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
async def file_link(template_id: str, files_hash: str, request: Request) -> dict[str, Any]:
    services, user_id = await caller(request)
    if not _HASH_RE.match(files_hash):
        raise errors.ValidationFailed.field("hash", "must be a SHA-256 in hex")
    present = (_files_dir(services, user_id) / files_hash).is_file()
    expires = int(services.clock().timestamp()) + UPLOAD_TTL_S
    token = upload_token(services, user_id, files_hash, expires)
    # The token rides in the query, which the request log leaves out (it logs the path): it is a credential.
    url = str(request.base_url).rstrip("/") + "/e2b-uploads?" + urllib.parse.urlencode({"token": token})
    return {"present": present, "url": url}


@router.put("/e2b-uploads", status_code=201)
async def upload(request: Request) -> Response:
    """The upload URL ``file_link`` gave: its token is its authority (no key is sent)."""
    services: Services = request.app.state.services
    token = request.query_params.get("token", "")
    user_id, files_hash = check_upload_token(services, token)
    directory = _files_dir(services, user_id)
    partial = directory / f".{files_hash}.{os.getpid()}.{id(request)}"
    size = 0
    try:
        with open(partial, "wb") as out:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_UPLOAD_BYTES:
                    raise errors.PayloadTooLarge(f"body is over the {MAX_UPLOAD_BYTES}-byte limit")
                out.write(chunk)
        os.replace(partial, directory / files_hash)
    finally:
        partial.unlink(missing_ok=True)
    _evict(directory)
    return Response(status_code=201)


def _evict(directory: Path) -> None:
    """Keeps an account's stored archives to ``MAX_STORED_UPLOADS`` (isolation rule 5: bounded)."""
    stored = sorted(
        (entry for entry in directory.iterdir() if _HASH_RE.match(entry.name)),
        key=lambda entry: entry.stat().st_mtime,
    )
    for entry in stored[: max(0, len(stored) - MAX_STORED_UPLOADS)]:
        entry.unlink(missing_ok=True)


def _from_image(body: BuildStart) -> str:
    if body.from_image_registry:
        raise e2b_errors.NotBuilt("fromImageRegistry: private registries are not served by Paddock yet")
    if body.from_template:
        return identity.rootfs_for_template(body.from_template)
    image = body.from_image or "e2bdev/base"
    if image in BASE_IMAGES:
        return BASE_IMAGES[image]
    if image in ROOT_IMAGES_BY_NAME:
        return image
    raise e2b_errors.NotBuilt(
        f"fromImage: Paddock builds from its catalog images ({', '.join(sorted(ROOT_IMAGES_BY_NAME))}) "
        f"and E2B's base images, not from {image!r}"
    )


def _quote(value: str) -> str:
    return json.dumps(value)


#: E2B's default account, which every E2B template has (its builder provisions it in each one).
E2B_USER = "user"
#: Makes E2B's account where the base lacks it (Paddock's catalog images have only root).
ENSURE_E2B_USER = f"id -u {E2B_USER} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {E2B_USER}"


def _step_user(kind: str, args: list[str]) -> str | None:
    """The user a step names: a ``USER`` step's, or a ``RUN`` step's second argument."""
    if kind == "USER":
        return args[0] if args else None
    if kind == "RUN":
        return args[1] if len(args) > 1 and args[1] else None
    return None


def dockerfile_for(body: BuildStart, base_user: str | None = None) -> tuple[str, list[str]]:
    """The Dockerfile the steps describe, and the archives (by hash) their COPY steps read.

    Two things an E2B build does that a Dockerfile alone does not: every E2B template has the account
    ``user`` (with ``/home/user``), which ``from_dockerfile`` always ends by switching to, so a build
    whose steps name it makes it first where the base lacks it; and a ``WORKDIR`` exists once set, as
    Docker makes it, so the last one is made at the end (buildah makes one only for a later ``RUN``).
    A ``RUN`` as another user, and each of those two, switches back to the user the steps had set, or
    to ``base_user``, the ``USER`` of the template built over (``templates.final_user``; None: root).
    (Switched back to root, a child of a template that runs as ``user`` ran as root.)"""
    lines = [f"FROM {_from_image(body)}"]
    hashes: list[str] = []
    user = base_user or "root"  # the USER the steps set last, or the base's
    workdir: str | None = None
    if any(_step_user(step.type.upper(), step.args) == E2B_USER for step in body.steps):
        lines += ["USER root", f"RUN {ENSURE_E2B_USER}"]
        if user != "root":
            lines.append(f"USER {user}")
    for index, step in enumerate(body.steps):
        field = f"steps[{index}]"
        kind, args = step.type.upper(), step.args
        if any("\n" in arg or "\r" in arg for arg in args):
            raise errors.ValidationFailed.field(f"{field}.args", "must not hold line breaks")
        if kind == "COPY":
            if len(args) < 2 or not step.files_hash or not _HASH_RE.match(step.files_hash):
                raise errors.ValidationFailed.field(field, "COPY needs a source, a destination and filesHash")
            flags = []
            if len(args) > 2 and args[2]:
                flags.append(f"--chown={args[2]}")
            if len(args) > 3 and args[3]:
                flags.append(f"--chmod={args[3]}")
            lines.append(" ".join(["COPY", *flags, json.dumps([args[0], args[1]])]))
            hashes.append(step.files_hash)
        elif kind == "RUN":
            if not args:
                raise errors.ValidationFailed.field(f"{field}.args", "RUN needs a command")
            run_as = _step_user(kind, args)
            if run_as and run_as != user:
                lines += [f"USER {run_as}", f"RUN {args[0]}", f"USER {user}"]
            else:
                lines.append(f"RUN {args[0]}")
        elif kind == "ENV":
            if len(args) % 2:
                raise errors.ValidationFailed.field(f"{field}.args", "ENV takes key, value pairs")
            pairs = [f"{key}={_quote(value)}" for key, value in zip(args[::2], args[1::2], strict=True)]
            if pairs:
                lines.append("ENV " + " ".join(pairs))
        elif kind in ("WORKDIR", "USER"):
            if len(args) != 1 or not args[0]:
                raise errors.ValidationFailed.field(f"{field}.args", f"{kind} takes one argument")
            lines.append(f"{kind} {args[0]}")
            if kind == "USER":
                user = args[0]
            else:
                workdir = posixpath.normpath(posixpath.join(workdir or "/", args[0]))
        else:
            raise e2b_errors.NotBuilt(f"{field}: step type {step.type!r} is not served by Paddock")
    if workdir is not None:
        lines += ["USER root", f"RUN {json.dumps(['mkdir', '-p', '--', workdir])}", f"USER {user}"]
    return "\n".join(lines) + "\n", hashes


def merge_context(directory: Path, hashes: list[str]) -> bytes | None:
    """One tar of every COPY step's archive (each holds its files under paths relative to the context),
    bounded as ``POST /v1/templates``'s context is (``templates.decode_context`` checks it again)."""
    if not hashes:
        return None
    out = io.BytesIO()
    seen: set[str] = set()
    total = 0
    with tarfile.open(fileobj=out, mode="w:gz") as merged:
        for files_hash in dict.fromkeys(hashes):
            path = directory / files_hash
            if not path.is_file():
                raise errors.ValidationFailed.field(
                    "steps", f"the files of hash {files_hash} were not uploaded"
                )
            try:
                with tarfile.open(path, mode="r:*") as archive:
                    for member in archive:
                        if member.name in seen or not (member.isfile() or member.isdir()):
                            continue
                        total += member.size
                        if total > templates.MAX_CONTEXT_UNPACKED_BYTES:
                            raise errors.ValidationFailed.field("steps", "the COPY files unpack to too much")
                        seen.add(member.name)
                        data = archive.extractfile(member) if member.isfile() else None
                        merged.addfile(member, data)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise errors.ValidationFailed.field(
                    "steps", f"the files of hash {files_hash}: {exc}"
                ) from None
    if out.tell() > templates.MAX_CONTEXT_BYTES:
        raise errors.ValidationFailed.field(
            "steps", f"the COPY files are over {templates.MAX_CONTEXT_BYTES} bytes"
        )
    return out.getvalue()


async def _base_user(services: Services, user_id: str, body: BuildStart) -> str | None:
    """The ``USER`` of the template a build is over (``fromTemplate`` naming one of the caller's); None:
    a catalog image's, root. A parent that is not there is left to the build to refuse."""
    base = _from_image(body)
    if base in ROOT_IMAGES_BY_NAME:
        return None
    async with services.sessions() as session:
        parent = await templates.bootable(session, user_id, base)
        return await templates.final_user(session, parent) if parent is not None else None


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
async def start_build(template_id: str, build_id: str, body: BuildStart, request: Request) -> Response:
    services, user_id = await caller(request)
    build = await find_build(services, user_id, template_id, build_id)
    if build.template_id is not None:
        raise errors.InvalidState(f"build {build_id!r} has already started")
    dockerfile, hashes = dockerfile_for(body, await _base_user(services, user_id, body))
    start = StartCommand.asked(body.start_cmd, body.ready_cmd)
    if start is None and body.from_template:  # E2B's rule: a child without commands runs its parent's
        async with services.sessions() as session:
            parent = await template_for(session, user_id, body.from_template) or await _live_id(
                session, user_id, body.from_template
            )
        start = await start_of(services, user_id, parent) if parent else None
    context = await asyncio.to_thread(merge_context, _files_dir(services, user_id), hashes)
    async with services.sessions() as session:
        old = await templates.find(session, user_id, template_id)
    if old is not None:  # a rebuild replaces the template; sandboxes booted from the old one keep it
        if old.status not in templates.TERMINAL:
            raise errors.InvalidState(f"template {template_id!r} is still building")
        await templates.delete_template(services, user_id, old.id)
    made = await templates.create(
        services,
        user_id,
        TemplateCreateRequest(
            name=template_id,
            dockerfile=dockerfile,
            context=base64.b64encode(context).decode() if context is not None else None,
        ),
    )
    async with transaction(services.sessions) as session:
        row = await session.get(E2bTemplateBuild, build_id)
        assert row is not None
        row.template_id = str(made["id"])
        row.start = start.as_json() if start is not None else None
    return Response(status_code=202)


@router.get("/templates/{template_id}/builds/{build_id}/status")
async def build_status(template_id: str, build_id: str, request: Request) -> dict[str, Any]:
    services, user_id = await caller(request)
    build = await find_build(services, user_id, template_id, build_id)
    offset_raw = request.query_params.get("logsOffset") or "0"
    if not offset_raw.isdigit() or int(offset_raw) > 2**31:
        raise errors.ValidationFailed.field("logsOffset", "must be a non-negative integer")
    answer: dict[str, Any] = {"templateID": template_id, "buildID": build_id, "logs": [], "logEntries": []}
    if build.template_id is None:
        return {**answer, "status": "waiting"}
    async with services.sessions() as session:
        template = await session.get(Template, build.template_id)
        if template is None:
            raise errors.NotFound(f"build {build_id!r} not found")
        lines = (
            await session.scalars(
                select(TemplateLogLine)
                .where(TemplateLogLine.template_id == template.id)
                .order_by(TemplateLogLine.id)
                .offset(int(offset_raw))
                .limit(LOG_PAGE)
            )
        ).all()
    entries = [
        {
            "timestamp": rfc3339(line.ts),
            "level": "error" if line.level == "error" else "info",
            "message": line.line,
        }
        for line in lines
    ]
    answer.update(logs=[entry["message"] for entry in entries], logEntries=entries)
    answer["status"] = "error" if template.deleted_at is not None else STATUS.get(template.status, "building")
    if answer["status"] == "error":
        answer["reason"] = {"message": template.error or "the build failed"}
    return answer


@router.get("/templates/aliases/{alias}")
async def alias(alias: str, request: Request) -> dict[str, Any]:
    services, user_id = await caller(request)
    if alias in identity.TEMPLATES:
        return {"templateID": alias, "public": True}
    async with services.sessions() as session:
        template = await templates.find(session, user_id, alias)
    if template is None:
        raise errors.NotFound(f"template {alias!r} not found")
    return {"templateID": template.name, "public": False}


@router.post("/templates/tags", status_code=201)
async def assign_tags(body: AssignTags, request: Request) -> dict[str, Any]:
    """Points ``tags`` at the build ``target`` (``name:tag``) names."""
    services, user_id = await caller(request)
    name, tag = _split(body.target, "target")
    tags = _check_tags(body.tags)
    async with transaction(services.sessions) as session:
        row = await session.get(E2bTemplateTag, (user_id, name, tag))
        if row is None:
            raise errors.NotFound(f"target: template {name}:{tag} not found", fields={"target": "not found"})
        build_id = row.build_id
        await _point(session, user_id, name, tags, build_id, services.clock())
    return {"buildID": build_id, "tags": tags}


@router.delete("/templates/tags", status_code=204)
async def remove_tags(body: RemoveTags, request: Request) -> Response:
    """Removes ``tags`` from ``name``; a tag it does not have is a 404 and nothing is removed."""
    services, user_id = await caller(request)
    name = plain_name(body.name, "name")
    tags = _check_tags(body.tags)
    async with transaction(services.sessions) as session:
        held = set(
            (
                await session.scalars(
                    select(E2bTemplateTag.tag).where(
                        E2bTemplateTag.user_id == user_id,
                        E2bTemplateTag.name == name,
                        E2bTemplateTag.tag.in_(tags),
                    )
                )
            ).all()
        )
        missing = [tag for tag in tags if tag not in held]
        if missing:
            raise errors.NotFound(
                f"tags: template {name}:{missing[0]} not found", fields={"tags": "not found"}
            )
        await session.execute(
            sql_delete(E2bTemplateTag).where(
                E2bTemplateTag.user_id == user_id, E2bTemplateTag.name == name, E2bTemplateTag.tag.in_(tags)
            )
        )
    return Response(status_code=204)


@router.get("/templates/{template_id}/tags")
async def list_tags(template_id: str, request: Request) -> list[dict[str, Any]]:
    """The template's tags, by tag: ``[{tag, buildID, createdAt}]``; 404 for a name with neither tags
    nor a template."""
    services, user_id = await caller(request)
    name = plain_name(template_id, "templateID")
    async with services.sessions() as session:
        rows = (
            await session.scalars(
                select(E2bTemplateTag)
                .where(E2bTemplateTag.user_id == user_id, E2bTemplateTag.name == name)
                .order_by(E2bTemplateTag.tag)
            )
        ).all()
        if not rows and await templates.find(session, user_id, name) is None:
            raise errors.NotFound(f"template {name!r} not found")
    return [{"tag": row.tag, "buildID": row.build_id, "createdAt": rfc3339(row.created_at)} for row in rows]


@router.delete("/templates/{template_id}", status_code=204)
async def delete(template_id: str, request: Request) -> Response:
    """A template, or a snapshot (the SDK's ``delete_snapshot`` calls this route): a template's name wins
    over a snapshot's, as in a create's ``rootfs``; a ``snap_`` id is always the snapshot."""
    services, user_id = await caller(request)
    template = None
    if not template_id.startswith(SNAPSHOT_PREFIX):
        async with services.sessions() as session:
            template = await templates.find(session, user_id, template_id)
    if template is None:
        if await e2b_snapshots.delete_if_snapshot(request, user_id, template_id):
            return Response(status_code=204)
        raise errors.NotFound(f"template {template_id!r} not found")
    await templates.delete_template(services, user_id, template.id)
    async with transaction(services.sessions) as session:  # its builds go, and the tags naming them
        await session.execute(
            sql_delete(E2bTemplateTag).where(
                E2bTemplateTag.user_id == user_id, E2bTemplateTag.name == template.name
            )
        )
    return Response(status_code=204)
