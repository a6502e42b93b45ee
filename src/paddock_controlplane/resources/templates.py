"""Templates (§10.12, §11.13): a Dockerfile a user submits, built into an image sandboxes boot.

Submitting validates the request once and records a ``pending`` row (plan caps under the user's row
lock, like sandboxes); the build worker (``template_builds.py``) drives the build on a host and
appends its log lines here. ``POST /v1/sandboxes`` with ``rootfs`` = a ready template's id or name
boots its image (``resolve``).

The Dockerfile is not interpreted here — buildah does that on the host — but it is read once at the
boundary so that bad input is a 400 naming ``dockerfile`` with nothing recorded: instructions are
split as the Dockerfile reference defines them (comments, ``\\`` continuations), every keyword must be
one buildah knows, there is exactly one ``FROM`` and it comes first. ``FROM`` must name an image that
can be built from: ``base`` (the request's ``base``), a catalog image some host offers, or a ready
template of the same user.

``COPY``/``ADD`` need files to copy: §11.13 has no build context, so they are refused unless the request
carries the optional ``context`` (an extension: standard base64 of a tar archive, gzip-compressed or
not, of regular files and directories). The archive is checked here once (size, entry types, relative
paths), kept with the template while its build needs it, and unpacked on the build host as the build's
context directory. ``COPY --from`` (multi-stage) and ``ADD`` of a URL are refused.

This check is a convenience (a clear 400 early), never the boundary: buildah parses the Dockerfile its
own way (``# escape=``, ARG/ENV substitution), so whatever slips past here is held by the host instead —
buildah runs inside the build's network namespace (a URL leaves from there, under the egress rules), in
the account's own builder storage (no other account's image to name), on a size-capped filesystem.

A template's log lines are deleted with it.

Rebuilding (an extension): ``POST /v1/templates`` naming an existing template with ``"rebuild": true``
starts a new build of that name, with an id of its own; the name then answers with the new build (its
status, its log). Until it is ready, the image it replaces stays what the name boots (``rootfs``) and
builds ``FROM``: that row is kept live under the hidden name ``~<new id>`` (``~`` cannot start a
user's name), so the unique live name holds without a schema change. When the new build is ready, the
replaced row is deleted like any template (hosts drop its image once no sandbox boots from it, so
sandboxes booted from it keep it); when it fails, the name keeps booting the old image and a further
rebuild replaces the failed one. A second rebuild while one is running is a 409.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import io
import json
import posixpath
import re
import tarfile
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.hosts import hostlink, hosts
from paddock_controlplane.records.models import Host, Template, TemplateLogLine
from paddock_controlplane.records.schemas.templates import TemplateCreateRequest
from paddock_controlplane.records.services import Services
from paddock_controlplane.resources import accounts, webhooks
from paddock_core import errors
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.logging import get_logger
from paddock_core.rootfs import ROOT_IMAGES_BY_NAME
from paddock_core.timeutil import rfc3339
from paddock_hostagent import schemas as hostschemas

log = get_logger("paddock.templates")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAX_DOCKERFILE_BYTES = 65536
#: The build context: its archive as sent (decoded), what it unpacks to, and how many entries.
MAX_CONTEXT_BYTES = 32 * 1024 * 1024
MAX_CONTEXT_UNPACKED_BYTES = 256 * 1024 * 1024
MAX_CONTEXT_ENTRIES = 10000
#: Instructions buildah accepts; ONBUILD is refused (it would run in a later template unseen), COPY and
#: ADD need a ``context``.
INSTRUCTIONS = frozenset(
    {
        "FROM",
        "RUN",
        "CMD",
        "LABEL",
        "EXPOSE",
        "ENV",
        "ENTRYPOINT",
        "VOLUME",
        "USER",
        "WORKDIR",
        "ARG",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "SHELL",
        "MAINTAINER",
    }
)
REFUSED = {"ONBUILD": "ONBUILD is not supported"}
#: COPY/ADD flags that only change owner or mode; ``--from`` (another stage or image), ``--link`` …
#: are refused.
COPY_FLAGS = ("--chown=", "--chmod=")
NO_CONTEXT = "{keyword} needs a build context: send context (a tar of the files) or write files with RUN"
TERMINAL = ("ready", "failed")
KEEPALIVE_S = 15.0
FOLLOW_POLL_S = 0.25


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int  # 1-based line where it starts


# --- views ---------------------------------------------------------------------------------------


#: A failed template's ``error`` in its view, in characters (the logs hold the rest).
MAX_VIEW_ERROR = 1000
#: The hidden name of a template a rebuild replaces: ``~`` and the rebuild's id.
REPLACED = "~"


def replaced_name(rebuild_id: str) -> str:
    return f"{REPLACED}{rebuild_id}"


def template_view(template: Template, *, include_dockerfile: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": template.id,
        "name": template.name,
        "base": template.base,
        "status": template.status,
        "ext4_size_bytes": int(template.ext4_size_bytes or 0),
        "created_at": rfc3339(template.created_at),
    }
    if template.built_at is not None and template.status == "ready":
        out["built_at"] = rfc3339(template.built_at)
    if template.status == "failed" and template.error:
        out["error"] = template.error[:MAX_VIEW_ERROR]  # why, as the last attempt ended (an extension)
    if template.name.startswith(REPLACED):  # booted by its name until its rebuild is ready (extension)
        out["replaced_by"] = template.name[len(REPLACED) :]
    if include_dockerfile:
        out["dockerfile"] = template.dockerfile
    return out


# --- reading the Dockerfile ----------------------------------------------------------------------


def parse_dockerfile(text: str, *, has_context: bool = False) -> list[Instruction]:
    """Splits ``text`` into instructions (400 naming ``dockerfile`` when it is not a Dockerfile).
    ``COPY``/``ADD`` are accepted only with a build context."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue  # blank lines and comments between instructions
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped, as Docker does
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        out.append(_instruction(" ".join(part for part in pending if part), start, has_context))
        pending = []
    if pending:
        out.append(_instruction(" ".join(pending), start, has_context))
    if not out:
        raise errors.ValidationFailed.field("dockerfile", "has no instructions")
    froms = [item for item in out if item.keyword == "FROM"]
    if len(froms) != 1:
        raise errors.ValidationFailed.field("dockerfile", f"must have exactly one FROM (has {len(froms)})")
    if out[0].keyword != "FROM":
        raise errors.ValidationFailed.field(
            "dockerfile", f"line {out[0].line}: the first instruction must be FROM"
        )
    return out


def _instruction(text: str, line: int, has_context: bool) -> Instruction:
    keyword, _, arguments = text.partition(" ")
    upper = keyword.upper()
    if upper in ("COPY", "ADD"):
        _check_copy(upper, arguments, line, has_context)
    if upper in REFUSED:
        raise errors.ValidationFailed.field("dockerfile", f"line {line}: {REFUSED[upper]}")
    if upper not in INSTRUCTIONS and upper not in ("COPY", "ADD"):
        raise errors.ValidationFailed.field("dockerfile", f"line {line}: unknown instruction {keyword!r}")
    if not arguments.strip():
        raise errors.ValidationFailed.field("dockerfile", f"line {line}: {upper} needs arguments")
    if upper in ("CMD", "ENTRYPOINT", "RUN", "SHELL") and arguments.lstrip().startswith("["):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if not isinstance(parsed, list) or not all(isinstance(part, str) for part in parsed):
            raise errors.ValidationFailed.field(
                "dockerfile", f"line {line}: {upper} [...] must be a JSON array of strings"
            )
    return Instruction(upper, arguments.strip(), line)


def _check_copy(keyword: str, arguments: str, line: int, has_context: bool) -> None:
    """``COPY``/``ADD [--chown=…] [--chmod=…] src… dest`` from the context: no other flag, no URL."""
    if not has_context:
        raise errors.ValidationFailed.field(
            "dockerfile", f"line {line}: {NO_CONTEXT.format(keyword=keyword)}"
        )
    words = arguments.split()
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if not flag.startswith(COPY_FLAGS):
            raise errors.ValidationFailed.field(
                "dockerfile", f"line {line}: {keyword} {flag.partition('=')[0]} is not supported"
            )
    rest = " ".join(words)
    sources: list[str] = []
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
        except ValueError:
            parsed = None
        if not isinstance(parsed, list) or not all(isinstance(part, str) for part in parsed):
            raise errors.ValidationFailed.field(
                "dockerfile", f"line {line}: {keyword} [...] must be a JSON array of strings"
            )
        sources = parsed[:-1]
    else:
        sources = words[:-1]
    if not sources:
        raise errors.ValidationFailed.field(
            "dockerfile", f"line {line}: {keyword} needs a source and a destination"
        )
    for source in sources:
        if "://" in source or source.startswith("git@"):
            raise errors.ValidationFailed.field(
                "dockerfile", f"line {line}: {keyword} from a URL is not supported (fetch it with RUN)"
            )


def decode_context(encoded: str) -> bytes:
    """The archive ``context`` carries, checked: standard base64 of a tar (gzip allowed) of at most
    ``MAX_CONTEXT_BYTES``, holding only regular files and directories under relative paths, unpacking
    to at most ``MAX_CONTEXT_UNPACKED_BYTES`` in at most ``MAX_CONTEXT_ENTRIES`` entries."""
    if len(encoded) > (MAX_CONTEXT_BYTES + 2) // 3 * 4:
        raise errors.ValidationFailed.field("context", f"must be at most {MAX_CONTEXT_BYTES} bytes (decoded)")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise errors.ValidationFailed.field("context", "must be standard base64 (RFC 4648)") from None
    if not data:
        raise errors.ValidationFailed.field("context", "must not be empty")
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            for count, member in enumerate(archive, start=1):
                if count > MAX_CONTEXT_ENTRIES:
                    raise errors.ValidationFailed.field(
                        "context", f"has more than {MAX_CONTEXT_ENTRIES} entries"
                    )
                name = posixpath.normpath(member.name)
                if name.startswith(("/", "../")) or name == ".." or member.name.startswith("/"):
                    raise errors.ValidationFailed.field(
                        "context", f"entry {member.name!r}: paths must be relative, inside the context"
                    )
                if not (member.isfile() or member.isdir()):
                    raise errors.ValidationFailed.field(
                        "context", f"entry {member.name!r}: only regular files and directories are allowed"
                    )
                total += member.size
                if total > MAX_CONTEXT_UNPACKED_BYTES:
                    raise errors.ValidationFailed.field(
                        "context", f"unpacks to more than {MAX_CONTEXT_UNPACKED_BYTES >> 20} MiB"
                    )
    except (tarfile.TarError, EOFError, OSError, zlib.error):
        raise errors.ValidationFailed.field(
            "context", "must be a tar archive (gzip-compressed or not)"
        ) from None
    return data


def from_reference(instructions: list[Instruction]) -> tuple[str, int]:
    """The image ``FROM`` names, and its line. ``FROM image [AS name]``; flags are refused."""
    item = instructions[0]
    words = item.arguments.split()
    if words[0].startswith("--"):
        raise errors.ValidationFailed.field("dockerfile", f"line {item.line}: FROM flags are not supported")
    if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
        raise errors.ValidationFailed.field("dockerfile", f"line {item.line}: FROM takes one image [AS name]")
    return words[0], item.line


# --- submit, read, delete ------------------------------------------------------------------------


def _validate(services: Services, req: TemplateCreateRequest) -> tuple[str, str, str, str, int, bytes | None]:
    name = (req.name or "").strip()
    if not NAME.fullmatch(name):
        raise errors.ValidationFailed.field("name", "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    dockerfile = req.dockerfile or ""
    if not dockerfile.strip():
        raise errors.ValidationFailed.field("dockerfile", "must not be empty")
    if len(dockerfile.encode()) > MAX_DOCKERFILE_BYTES:
        raise errors.ValidationFailed.field("dockerfile", f"must be at most {MAX_DOCKERFILE_BYTES} bytes")
    base = (req.base or "").strip() or services.settings.default_rootfs
    if base not in ROOT_IMAGES_BY_NAME:
        raise errors.ValidationFailed.field("base", "must be a catalog image name; see GET /v1/rootfs")
    reference, line = from_reference(parse_dockerfile(dockerfile, has_context=req.context is not None))
    context = decode_context(req.context) if req.context is not None else None
    return name, dockerfile, base, reference, line, context


async def _resolve_from(session: AsyncSession, user_id: str, reference: str, line: int, base: str) -> str:
    """A catalog name some host offers, or the id of one of the user's ready templates."""
    name = base if reference == "base" else reference
    if name in ROOT_IMAGES_BY_NAME:
        if name in await hosts.available_images(session):
            return name
        raise errors.ValidationFailed.field(
            "base" if reference == "base" else "dockerfile",
            f"line {line}: image {name!r} is not available on any host; see GET /v1/rootfs",
        )
    template = await bootable(session, user_id, name)
    if template is None or template.status != "ready":
        state = "is not ready" if template is not None else "is neither a catalog image nor your template"
        raise errors.ValidationFailed.field("dockerfile", f"line {line}: FROM {name!r} {state}")
    return template.id


async def find(session: AsyncSession, user_id: str, ref: str, *, for_update: bool = False) -> Template | None:
    """The user's live template with this id or, failing that, this name."""
    query = (
        select(Template)
        .where(Template.user_id == user_id, Template.deleted_at.is_(None))
        .where(or_(Template.id == ref, Template.name == ref))
        .order_by((Template.id == ref).desc())
        .limit(1)
    )
    if for_update:
        query = query.with_for_update()
    return (await session.scalars(query)).first()


async def get_owned(session: AsyncSession, user_id: str, ref: str, *, for_update: bool = False) -> Template:
    template = await find(session, user_id, ref, for_update=for_update)
    if template is None:
        raise errors.NotFound("template not found")
    return template


async def bootable(session: AsyncSession, user_id: str, ref: str) -> Template | None:
    """The template ``ref`` names, or, while its rebuild is not ready, the ready one it replaces."""
    template = await find(session, user_id, ref)
    if template is not None and template.status != "ready":
        replaced = await _replaced(session, user_id, template.id, for_update=False)
        if replaced is not None and replaced.status == "ready":
            return replaced
    return template


#: How many templates deep ``final_user`` follows ``FROM`` (a chain is acyclic: each FROM is an older one).
MAX_FROM_DEPTH = 32


async def final_user(session: AsyncSession, template: Template) -> str | None:
    """The ``USER`` a template's sandboxes run as: its Dockerfile's last, else its ``FROM`` template's;
    None at a catalog image (root). A build over it that switches to root for steps of its own switches
    back to this one."""
    for _ in range(MAX_FROM_DEPTH):
        instructions = parse_dockerfile(template.dockerfile, has_context=True)
        users = [item.arguments.strip() for item in instructions if item.keyword == "USER"]
        if users:
            return users[-1]
        if template.from_image in ROOT_IMAGES_BY_NAME:
            return None
        parent = await session.get(Template, template.from_image)
        if parent is None:
            return None
        template = parent
    return None


async def _replaced(
    session: AsyncSession, user_id: str, rebuild_id: str, *, for_update: bool = True
) -> Template | None:
    query = select(Template).where(
        Template.user_id == user_id,
        Template.deleted_at.is_(None),
        Template.name == replaced_name(rebuild_id),
    )
    if for_update:
        query = query.with_for_update()
    return (await session.scalars(query)).first()


def _retire(services: Services, session: AsyncSession, template: Template) -> None:
    """Marks a template deleted (the caller's transaction); its image goes by ``forget``."""
    template.deleted_at = services.clock()
    template.context = None


async def _make_room_for_rebuild(
    session: AsyncSession, user_id: str, current: Template
) -> tuple[Template | None, list[Template]]:
    """Before a rebuild of ``current``'s name: the template the rebuild will replace (renamed later),
    and the templates to retire now (a failed rebuild, or a failed first build)."""
    if current.status not in TERMINAL:
        raise errors.AlreadyExists(
            f"name: template {current.name!r} is {current.status}; wait for it ({current.id}) or delete it"
        )
    previous = await _replaced(session, user_id, current.id)
    if current.status == "ready":
        return current, []
    # current failed: it gives way; the image it would have replaced (if any) stays the one to replace
    return previous, [current]


async def create(services: Services, user_id: str, req: TemplateCreateRequest) -> dict[str, Any]:
    name, dockerfile, base, reference, line, context = await asyncio.to_thread(_validate, services, req)
    retired: list[Template] = []
    async with transaction(services.sessions) as session:
        account = await accounts.lock_user(session, user_id)
        plan = await accounts.cached_plan(session, account.plan_id)
        if plan.templates_concurrent <= 0:
            raise errors.PlanLimit(f"the {plan.name} plan includes no templates")
        live = await session.scalar(
            select(func.count()).where(
                Template.user_id == user_id,
                Template.deleted_at.is_(None),
                Template.name.not_like(f"{REPLACED}%"),  # a rebuild's predecessor is on its way out
            )
        )
        current = await find(session, user_id, name, for_update=True)
        if current is not None and current.name != name:
            current = None  # ``name`` is another template's id; names and ids never mix
        # a rebuild takes the place of the template of its name (hidden once it is replaced)
        taking_place = 1 if current is not None and req.rebuild else 0
        if int(live or 0) - taking_place >= plan.templates_concurrent:
            raise errors.QuotaExceeded(f"concurrent template cap reached: limit {plan.templates_concurrent}")
        today = await session.scalar(
            select(func.count()).where(
                Template.user_id == user_id, Template.created_at >= accounts.day_start(services.clock())
            )
        )
        if int(today or 0) >= plan.templates_per_day:
            raise errors.QuotaExceeded(f"daily template cap reached: limit {plan.templates_per_day} per day")
        accounts.require_credit(account)
        replaced: Template | None = None
        if current is not None:
            if not req.rebuild:
                raise errors.AlreadyExists(
                    f"name: a template named {name!r} already exists; send rebuild: true to build it again"
                    " (the current image stays bootable until the new one is ready)"
                )
            replaced, retired = await _make_room_for_rebuild(session, user_id, current)
        from_image = await _resolve_from(session, user_id, reference, line, base)
        new_template_id = new_id("tpl_")
        for old in retired:
            _retire(services, session, old)
            await session.execute(delete(TemplateLogLine).where(TemplateLogLine.template_id == old.id))
        if replaced is not None:
            replaced.name = replaced_name(new_template_id)
        await session.flush()  # the name is free before the new row takes it
        template = Template(
            id=new_template_id,
            user_id=user_id,
            name=name,
            base=base,
            from_image=from_image,
            dockerfile=dockerfile,
            context=context,
            status="pending",
            attempt=0,
            ext4_size_bytes=0,
            created_at=services.clock(),
        )
        session.add(template)
        await session.flush()
        await webhooks.emit(
            session,
            user_id=user_id,
            action="template.submit",
            data={"template_id": template.id, "user_id": user_id, "name": name, "base": base},
        )
    services.template_wake.set()
    for old in retired:
        await forget(services, old)
    return template_view(template)


async def page(
    session: AsyncSession, user_id: str, *, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    # a template a rebuild replaces is listed by its id only while it boots the name: not in the list
    where = (
        Template.user_id == user_id,
        Template.deleted_at.is_(None),
        Template.name.not_like(f"{REPLACED}%"),
    )
    total = await session.scalar(select(func.count()).select_from(Template).where(*where))
    rows = (
        await session.scalars(
            select(Template)
            .where(*where)
            .order_by(Template.created_at, Template.id)
            .limit(limit)
            .offset(offset)
        )
    ).all()
    return [template_view(row) for row in rows], int(total or 0)


async def delete_template(services: Services, user_id: str, ref: str) -> Template:
    """Marks it deleted (its name is free at once); the worker cancels a running build, and the host
    drops the image once no sandbox boots from it (§13.2: never blocked by sandboxes). Deleting a
    rebuild deletes the template it was replacing too (the name goes)."""
    replaced: Template | None = None
    async with transaction(services.sessions) as session:
        template = await get_owned(session, user_id, ref, for_update=True)
        _retire(services, session, template)
        await session.execute(delete(TemplateLogLine).where(TemplateLogLine.template_id == template.id))
        replaced = await _replaced(session, user_id, template.id)
        if replaced is not None:
            _retire(services, session, replaced)
            await session.execute(delete(TemplateLogLine).where(TemplateLogLine.template_id == replaced.id))
        await webhooks.emit(
            session,
            user_id=user_id,
            action="template.delete",
            data={"template_id": template.id, "user_id": user_id, "name": template.name},
        )
    if replaced is not None:
        await forget(services, replaced)
    return template


async def forget(services: Services, template: Template) -> None:
    """After a delete: the building host cancels a running attempt at once, and every host holding the
    image (its builder, and hosts that fetched it) drops it once no sandbox of theirs boots from it."""
    async with services.sessions() as session:
        holders = [
            host.id
            for host in (await session.scalars(select(Host))).all()
            if host.id == template.host_id or template.id in (host.rootfses or [])
        ]
    for host_id in holders:
        with contextlib.suppress(hostlink.HostError, hostlink.SandboxGoneError):
            link = await hostlink.for_host(services, host_id)
            await link.delete_build(template.id)


async def retire_replaced(services: Services, rebuild: Template) -> None:
    """A rebuild is ready: the template it replaced goes (its image once no sandbox boots from it)."""
    async with transaction(services.sessions) as session:
        replaced = await _replaced(session, rebuild.user_id, rebuild.id)
        if replaced is None:
            return
        _retire(services, session, replaced)
        await session.execute(delete(TemplateLogLine).where(TemplateLogLine.template_id == replaced.id))
        await webhooks.emit(
            session,
            user_id=rebuild.user_id,
            action="template.delete",
            data={"template_id": replaced.id, "user_id": rebuild.user_id, "name": rebuild.name},
        )
    log.info("template_replaced", template_id=replaced.id, rebuild_id=rebuild.id, name=rebuild.name)
    await forget(services, replaced)


async def resolve(session: AsyncSession, user_id: str, ref: str) -> Template | None:
    """For ``POST /v1/sandboxes``: the user's template named by ``rootfs`` (409 unless ready); while a
    rebuild of that name is not ready, the template it replaces."""
    template = await bootable(session, user_id, ref)
    if template is not None and template.status != "ready":
        raise errors.InvalidState(f"template {template.name!r} is {template.status}, not ready")
    return template


async def ensure_image(services: Services, link: hostlink.HostLink, host_id: str, image: str) -> None:
    """Before a sandbox of a template boots on a host that lacks its image, that host fetches it from
    the host that built it (``paddock_hostagent.image_transfer``). Catalog images: nothing to do."""
    if not image.startswith("tpl_"):
        return
    async with services.sessions() as session:
        host = await session.get(Host, host_id)
        template = await session.get(Template, image)
        source = await session.get(Host, template.host_id) if template and template.host_id else None
    if host is None or image in (host.rootfses or []) or source is None or source.id == host_id:
        return
    # Bounded by what the build recorded (the host's own setting bounds it too).
    recorded = template.ext4_size_bytes if template else 0
    await link.fetch_image(image, source.url, hostschemas.fetch_limit(recorded) if recorded else None)
    log.info("template_image_fetched", template_id=image, host_id=host_id, source_host_id=source.id)


# --- the build log -------------------------------------------------------------------------------


def _frame(line: TemplateLogLine) -> dict[str, Any]:
    return {"ts": rfc3339(line.ts), "level": line.level, "line": line.line, "attempt": line.attempt}


def final_frame(template: Template, now: dt.datetime, attempt: int | None = None) -> dict[str, Any]:
    """The terminal frame; for one earlier attempt (``?attempt=``) it says how that one ended, and an
    attempt that was followed by another has failed."""
    status = "failed" if attempt is not None and attempt < template.attempt else template.status
    return {"ts": rfc3339(now), "attempt": attempt or template.attempt, "final": True, "status": status}


def check_attempt(template: Template, attempt: int | None) -> None:
    if attempt is not None and (attempt < 1 or attempt > template.attempt):
        raise errors.NotFound(f"template {template.id} has no attempt {attempt}")


async def _lines(
    session: AsyncSession, template_id: str, attempt: int | None, after_id: int
) -> list[TemplateLogLine]:
    query = select(TemplateLogLine).where(
        TemplateLogLine.template_id == template_id, TemplateLogLine.id > after_id
    )
    if attempt is not None:
        query = query.where(TemplateLogLine.attempt == attempt)
    return list((await session.scalars(query.order_by(TemplateLogLine.id).limit(2000))).all())


async def open_log(services: Services, user_id: str, ref: str, attempt: int | None) -> Template:
    """The template whose log is asked for (404 for another user's, or for an attempt never run)."""
    async with services.sessions() as session:
        template = await get_owned(session, user_id, ref)
    check_attempt(template, attempt)
    return template


async def log_text(services: Services, template_id: str, attempt: int | None) -> str:
    """Every frame recorded so far, then the terminal frame if the build has ended."""
    out: list[str] = []
    after = 0
    async with services.sessions() as session:
        template = await session.get(Template, template_id)
        assert template is not None
        while True:
            lines = await _lines(session, template_id, attempt, after)
            if not lines:
                break
            out.extend(json.dumps(_frame(line)) for line in lines)
            after = lines[-1].id
    if template.status in TERMINAL:
        out.append(json.dumps(final_frame(template, services.clock(), attempt)))
    return "".join(item + "\n" for item in out)


async def follow(services: Services, template_id: str, attempt: int | None) -> AsyncIterator[bytes]:
    """Replays, then streams new frames until the build ends (terminal frame) or the template is
    deleted; a blank line every ``KEEPALIVE_S`` while nothing happens (§11.13)."""
    after = 0
    loop = asyncio.get_running_loop()
    last_sent = loop.time()
    while True:
        async with services.sessions() as session:
            # Status first, then lines: a build's last lines commit with (or before) its end, so a
            # terminal status read here means the lines read next are all there are.
            template = await session.get(Template, template_id)
            lines = await _lines(session, template_id, attempt, after)
        if lines:
            after = lines[-1].id
            yield "".join(json.dumps(_frame(line)) + "\n" for line in lines).encode()
            last_sent = loop.time()
            continue
        if template is None or template.deleted_at is not None:
            return
        if template.status in TERMINAL:
            yield (json.dumps(final_frame(template, services.clock(), attempt)) + "\n").encode()
            return
        if loop.time() - last_sent >= KEEPALIVE_S:
            yield b"\n"
            last_sent = loop.time()
        await asyncio.sleep(FOLLOW_POLL_S)
