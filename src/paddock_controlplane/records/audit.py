"""The audit trail of agent actions (issue #35): what was done to and inside each sandbox, by whom.

One row per event in ``audit_events``, of five kinds:

- ``api``: an API call on the sandbox (method, route template, status, the caller's key or access-token
  id, a SHA-256 of its inputs with env values and secret-looking fields taken out first);
- ``command``: a command run (its argv bounded, cwd, user, exit code, duration; never its env);
- ``file``: a file written or read through the API (path, bytes, direction);
- ``process``: a managed process started (its argv bounded, cwd, user, the process id);
- ``egress``: connections the sandbox attempted to the outside, allowed or refused, as the host's
  egress table counted them (address, protocol, port, packets).

and ``dropped``, a marker saying how many events of the sandbox were not recorded because the queue
was full. Requests never wait on the database: ``AuditLog.record`` appends to a bounded in-memory
queue, and ``workers/audit_writer.py`` inserts it in batches (every ``audit_flush_interval_s`` or 500
events), prunes by age and count, and polls the hosts for egress attempts.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from sqlalchemy import JSON, BigInteger, Index, Integer, String, and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.records.models import Base
from paddock_core.timeutil import as_utc, utcnow

KINDS = ("api", "command", "file", "process", "egress", "dropped")
#: An argv or shell string is kept to this many characters (the rest is cut, ``truncated: true``).
MAX_COMMAND_CHARS = 2048
#: A path kept in an event.
MAX_PATH_CHARS = 1024
#: Events waiting for the writer; past this, events are counted as dropped (and a marker is written).
QUEUE_CAPACITY = 20_000
#: A request body up to this size waits in the queue to be hashed by the writer, off the request's
#: path; a bigger one is hashed at once, so the queue holds at most ``QUEUE_CAPACITY`` of these.
DEFERRED_BODY_BYTES = 2048
#: The writer flushes once this many events wait, without waiting for its interval.
FLUSH_BATCH = 500
#: Request bodies over this are not parsed for the digest (``digest`` is then of their size only).
MAX_DIGEST_BODY_BYTES = 1 << 20
#: Sandboxes whose drops are counted one by one; beyond that only the total is (and logged).
MAX_DROP_KEYS = 10_000
#: A field whose name says it holds a secret (or env values) is hashed as ``<redacted>``.
SECRET_FIELD = re.compile(
    r"env|secret|passw|token|credential|private|api_?key|access_?key|auth|cookie|signature", re.IGNORECASE
)
REDACTED = "<redacted>"


class AuditEvent(Base):
    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_sandbox_at", "sandbox_id", "at", "id"),
        Index("ix_audit_events_at", "at"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    sandbox_id: Mapped[str] = mapped_column(String(40))
    #: The sandbox's owner, kept so the trail stays readable after the sandbox's row is purged.
    user_id: Mapped[str] = mapped_column(String(40))
    at: Mapped[dt.datetime]
    kind: Mapped[str] = mapped_column(String(16))
    #: The API key's id (``key_…``) or the access token's id (``sat_…``); never the secret.
    actor: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)


class AuditEgressCursor(Base):
    """How far this control plane (any of them) has read each host agent's egress attempts: the
    agent's run (``epoch``, new at each start) and the last attempt recorded (``seq``)."""

    __tablename__ = "audit_egress_cursors"

    host_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    epoch: Mapped[str] = mapped_column(String(40))
    seq: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))


@dataclass(frozen=True)
class EgressHeard:
    """A host's egress attempts as its last heartbeat to this process told them: the agent's run and
    its last attempt's number (``epoch`` None: an agent that does not say), heard at ``at`` (monotonic)."""

    epoch: str | None
    seq: int
    at: float


@dataclass
class Pending:
    sandbox_id: str
    user_id: str
    at: dt.datetime
    kind: str
    detail: dict[str, Any]
    actor: str | None = None
    #: An API call's inputs, hashed by the writer rather than on the request's path: the raw query
    #: string, the body as kept (None: over ``MAX_DIGEST_BODY_BYTES``), its size, whether it is JSON.
    inputs: tuple[bytes, bytes | None, int, bool] | None = None

    def row(self) -> dict[str, Any]:
        if self.inputs is not None:
            raw_query, body, size, json_body = self.inputs
            query = parse_qsl(raw_query.decode("latin-1"), keep_blank_values=True)[:64] if raw_query else []
            self.detail["input_sha256"] = input_digest(query, body, size, json_body and body is not None)
            self.inputs = None
        return {
            "sandbox_id": self.sandbox_id,
            "user_id": self.user_id,
            "at": self.at,
            "kind": self.kind,
            "actor": self.actor,
            "detail": self.detail,
        }


@dataclass
class RequestAudit:
    """The events a request's work noted (a command, a file), written with the API event when the
    request ends so they carry its caller (``edge/auditing.py`` sets it in ``CURRENT``)."""

    events: list[Pending] = field(default_factory=list)
    #: Set when the request has ended: later notes (a task it set off) are queued at once.
    closed: bool = False


#: The request being served, when it is an API call on a sandbox.
CURRENT: ContextVar[RequestAudit | None] = ContextVar("paddock_audit_request", default=None)


class AuditLog:
    """The bounded queue between requests and the writer. ``record`` never blocks and never fails."""

    def __init__(self, capacity: int = QUEUE_CAPACITY) -> None:
        self.capacity = capacity
        self._queue: list[Pending] = []
        #: (sandbox id, user id) → events of that sandbox dropped since the last flush.
        self._dropped: dict[tuple[str, str], int] = {}
        self.dropped_total = 0
        self.full = asyncio.Event()
        #: The writer's flush (``workers/audit_writer.py``), once it runs.
        self.flusher: Callable[[], Awaitable[int]] | None = None
        #: Host id → where its egress attempts stood at its last heartbeat to this process.
        self.egress_heard: dict[str, EgressHeard] = {}

    def hear_egress(self, host_id: str, position: dict[str, Any] | None) -> None:
        """Notes a heartbeat's ``egress_audit`` (None: an agent that does not send it)."""
        if position is None:
            self.egress_heard[host_id] = EgressHeard(None, 0, time.monotonic())
        else:
            epoch, seq = str(position.get("epoch", "")), int(position.get("seq", 0))
            self.egress_heard[host_id] = EgressHeard(epoch, seq, time.monotonic())

    async def flush_now(self) -> None:
        """Writes what is queued now (a read of the trail sees what this process just did). Called
        even when the queue is empty: the loop may have taken the events and not yet committed them,
        and the flusher waits for that."""
        if self.flusher is not None:
            await self.flusher()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, event: Pending) -> None:
        if len(self._queue) >= self.capacity:
            self.dropped_total += 1
            key = (event.sandbox_id, event.user_id)
            if key in self._dropped or len(self._dropped) < MAX_DROP_KEYS:
                self._dropped[key] = self._dropped.get(key, 0) + 1
            return
        self._queue.append(event)
        if len(self._queue) >= FLUSH_BATCH:
            self.full.set()

    def record(
        self,
        sandbox_id: str,
        user_id: str,
        kind: str,
        detail: dict[str, Any],
        *,
        actor: str | None = None,
        at: dt.datetime | None = None,
    ) -> None:
        """Queues an event; inside an API request on the sandbox it waits for the request's end, to
        be written with its caller and in order after the API event."""
        event = Pending(sandbox_id, user_id, at or utcnow(), kind, detail, actor)
        noted = CURRENT.get()
        if noted is not None and not noted.closed and actor is None:
            noted.events.append(event)
        else:
            self.add(event)

    def take(self) -> list[Pending]:
        """Everything queued, with a ``dropped`` marker for each sandbox that lost events."""
        events, self._queue = self._queue, []
        self.full.clear()
        if self._dropped:
            now = utcnow()
            events += [
                Pending(sandbox_id, user_id, now, "dropped", {"dropped": count, "reason": "queue full"})
                for (sandbox_id, user_id), count in self._dropped.items()
            ]
            self._dropped = {}
        return events

    def putback(self, events: Sequence[Pending]) -> None:
        """Events a failed flush could not write go first again (as many as fit)."""
        room = max(self.capacity - len(self._queue), 0)
        kept = list(events[:room])
        for event in events[room:]:
            self.dropped_total += 1
            key = (event.sandbox_id, event.user_id)
            self._dropped[key] = self._dropped.get(key, 0) + 1
        self._queue = kept + self._queue


# -- what an event holds -----------------------------------------------------------------------------


def bounded(text: str, limit: int = MAX_COMMAND_CHARS) -> str:
    return text if len(text) <= limit else text[:limit]


def argv_detail(cmd: str, args: Sequence[str]) -> dict[str, Any]:
    """``argv`` cut to ``MAX_COMMAND_CHARS`` characters in all (``truncated`` says so)."""
    argv: list[str] = []
    left = MAX_COMMAND_CHARS
    truncated = False
    for part in (cmd, *args):
        if left <= 0:
            truncated = True
            break
        if len(part) > left:
            truncated = True
        argv.append(part[:left])
        left -= len(part)
    out: dict[str, Any] = {"argv": argv}
    if truncated:
        out["truncated"] = True
    return out


def redacted(value: Any, key: str = "") -> Any:
    """``value`` with every field whose name looks secret (env, secret, password, token, key …) replaced
    by ``<redacted>``; a redacted map keeps its keys (env names stay, their values go)."""
    if key and SECRET_FIELD.search(key):
        if isinstance(value, dict):
            return {str(k): REDACTED for k in value}
        return REDACTED
    if isinstance(value, dict):
        return {str(k): redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value


def input_digest(
    query: Sequence[tuple[str, str]], body: bytes | None, body_bytes: int, json_body: bool
) -> str:
    """SHA-256 (hex) of a request's inputs with secrets taken out: its query parameters and its JSON
    body, each field named like a secret or env replaced by ``<redacted>``. A body that is not JSON (an
    upload) or is over ``MAX_DIGEST_BODY_BYTES`` counts by its size only: its bytes are the file's."""
    parsed: Any = {"bytes": body_bytes}
    if json_body and body is not None and body.strip():
        try:
            parsed = redacted(json.loads(body))
        except ValueError:
            parsed = {"bytes": body_bytes, "json": "invalid"}
    material = {"query": [[k, REDACTED if SECRET_FIELD.search(k) else v] for k, v in query], "body": parsed}
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


# -- reading --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: the last event's time and id (events are ordered by both)."""

    at: dt.datetime
    id: int

    def encode(self) -> str:
        raw = f"{self.at.isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """Raises ValueError for anything this did not make."""
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        at, _, number = raw.partition("|")
        if not number.isdigit() or len(number) > 19:
            raise ValueError("not a cursor")
        return cls(as_utc(dt.datetime.fromisoformat(at)), int(number))


def view(event: AuditEvent) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": event.id,
        "sandbox_id": event.sandbox_id,
        "at": as_utc(event.at).isoformat().replace("+00:00", "Z"),
        "kind": event.kind,
    }
    if event.actor is not None:
        out["actor"] = event.actor
    out.update(event.detail)
    return out


async def page(
    session: AsyncSession,
    sandbox_id: str,
    user_id: str,
    *,
    kinds: Sequence[str] = (),
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    after: Cursor | None = None,
    limit: int,
    newest_first: bool = False,
) -> tuple[list[AuditEvent], Cursor | None]:
    """Up to ``limit`` events of the sandbox, oldest first (or newest first), and the cursor of the next
    page (None at the end)."""
    query = select(AuditEvent).where(AuditEvent.sandbox_id == sandbox_id, AuditEvent.user_id == user_id)
    if kinds:
        query = query.where(AuditEvent.kind.in_(kinds))
    if since is not None:
        query = query.where(AuditEvent.at >= since)
    if until is not None:
        query = query.where(AuditEvent.at < until)
    if after is not None and newest_first:
        query = query.where(
            or_(AuditEvent.at < after.at, and_(AuditEvent.at == after.at, AuditEvent.id < after.id))
        )
    elif after is not None:
        query = query.where(
            or_(AuditEvent.at > after.at, and_(AuditEvent.at == after.at, AuditEvent.id > after.id))
        )
    order = (AuditEvent.at.desc(), AuditEvent.id.desc()) if newest_first else (AuditEvent.at, AuditEvent.id)
    rows = list((await session.scalars(query.order_by(*order).limit(limit + 1))).all())
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, Cursor(as_utc(rows[-1].at), rows[-1].id)


async def has_events(session: AsyncSession, sandbox_id: str, user_id: str) -> bool:
    found = await session.scalar(
        select(AuditEvent.id)
        .where(AuditEvent.sandbox_id == sandbox_id, AuditEvent.user_id == user_id)
        .limit(1)
    )
    return found is not None
