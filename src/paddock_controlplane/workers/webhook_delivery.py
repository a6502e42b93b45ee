"""The webhook delivery worker (§11.15): signed POSTs, retries, auto-suspend, retention.

Deliveries are rows written by :func:`paddock_controlplane.resources.webhooks.emit`. A worker *claims* due rows by
stamping them with a lease (its token and an expiry) in one short transaction — on PostgreSQL the
candidates are picked ``FOR UPDATE SKIP LOCKED``, on SQLite the write lock serialises claims — and the
update re-checks that no live lease exists, so two workers (or two processes) never send the same
claimed attempt. The result is written back only under the same token. A live worker renews the leases
it holds every third of their length, so an attempt may take as long as it needs; a worker that dies
(SIGKILL, a lost machine) stops renewing, its leases expire within ``webhook_lease_s`` (10 s) and another
worker claims the rows at its next poll, so every event is sent at least once, and soon.

The outside world sits behind :class:`Transport` (one method); :class:`HttpTransport` is the real one:
10 s limit, no redirects, and the SSRF guard that connects only to an address it checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import aiohttp
import aiohttp.abc
from sqlalchemy import Table, bindparam, case, delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.sql.dml import Update
from sqlalchemy.sql.elements import ColumnElement

from paddock_controlplane.records.models import WebhookDelivery, WebhookEndpoint
from paddock_controlplane.records.services import Services
from paddock_controlplane.resources import webhooks
from paddock_controlplane.resources.webhooks import TargetRefused, is_public_address, resolve_public
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.crypto import SecretBox
from paddock_core.db import make_engine, make_sessionmaker, transaction
from paddock_core.logging import configure_logging, get_logger
from paddock_core.pglisten import ChannelListener
from paddock_core.timeutil import Clock, utcnow

log = get_logger("paddock.webhooks")

USER_AGENT = "Service-Webhook/1.0"
#: Delay before each retry, after the previous failure: five retries, six attempts in all.
RETRY_DELAYS_S: tuple[int, ...] = (5, 30, 120, 600, 3600)
MAX_ATTEMPTS = 1 + len(RETRY_DELAYS_S)
AUTO_SUSPEND_AT = 50
RETAIN_FINISHED = dt.timedelta(minutes=30)
RETAIN_ANY = dt.timedelta(hours=72)
CLEANUP_INTERVAL_S = 60.0
#: A response body up to this size is read (its connection is kept); a bigger one closes the connection.
MAX_DRAINED_BYTES = 64 * 1024
MAX_CACHED_SECRETS = 1024
MAX_CACHED_ENDPOINTS = 4096


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256(secret, "<timestamp>.<raw body>")>``."""
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


# --- transport ----------------------------------------------------------------------------------------


class DeliveryFailed(Exception):
    """An attempt that got no response: refused target, connection error, timeout."""


class Transport(Protocol):
    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        """POST and return the response status; raise :class:`DeliveryFailed` when there is none."""
        ...

    async def aclose(self) -> None: ...


class GuardedResolver(aiohttp.abc.AbstractResolver):
    """Resolves a host for a new connection to public addresses only: every address is checked and
    the connection goes to a checked one. The URL keeps its name, so TLS verifies it and pooled
    connections stay per host; a DNS answer that changes between the check and the connect cannot
    reach inside. (aiohttp does not ask a resolver about IP literals: :class:`HttpTransport` checks those.)
    """

    def __init__(self, resolve_timeout_s: float) -> None:
        self._resolve_timeout_s = resolve_timeout_s

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        addresses = await resolve_public(host, port, timeout_s=self._resolve_timeout_s)
        numeric = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": numeric,
            }
            for address in addresses
        ]

    async def close(self) -> None:
        return None


def _refuse_private_literal(url: str) -> None:
    """:class:`TargetRefused` when the URL's host is an IP literal that is not public."""
    host = urlsplit(url).hostname or ""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return  # a name: the resolver checks what it resolves to
    if not is_public_address(host):
        raise TargetRefused("url resolves to a loopback, private or link-local address")


class HttpTransport:
    """aiohttp (about a third of httpx's CPU per request, and no collapse under concurrency) with no
    redirects, no proxies from the environment, one keep-alive pool per host, and (unless private
    targets are allowed) every connection made through :class:`GuardedResolver`."""

    def __init__(self, *, timeout_s: float = 10.0, allow_private: bool = False) -> None:
        self.timeout_s = timeout_s
        self.allow_private = allow_private
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside the event loop

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=256,
                limit_per_host=0,
                keepalive_timeout=30,
                use_dns_cache=False,  # every new connection resolves (and checks) again
                resolver=None if self.allow_private else GuardedResolver(self.timeout_s),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                trust_env=False,
                auto_decompress=False,
            )
        return self._session

    async def _send(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        if not self.allow_private:
            _refuse_private_literal(url)
        async with self._client().post(url, data=body, headers=headers, allow_redirects=False) as response:
            if response.content_length is not None and response.content_length <= MAX_DRAINED_BYTES:
                # a small body read to its end keeps the connection for the next delivery
                with contextlib.suppress(aiohttp.ClientError):
                    await response.read()
            return response.status  # any other body is dropped with its connection

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._send(url, body, headers)
        except TargetRefused as exc:
            raise DeliveryFailed(str(exc)) from None
        except TimeoutError:
            raise DeliveryFailed(f"timed out after {self.timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:200]) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# --- the worker ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    id: str
    endpoint_id: str
    url: str
    secret_sealed: str
    payload: str
    attempts: int
    token: str


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    #: When the attempt ended (the worker's clock): ``deliveredAt``, or where the retry delay starts.
    at: dt.datetime
    error: str | None = None


class GroupCommit:
    """Batches attempt results into one transaction each; results arriving during a flush wait for the next.

    One writer per worker instead of one per attempt keeps SQLite's single write lock uncontended.
    """

    def __init__(self, flush: Callable[[list[tuple[Claim, Outcome]]], Awaitable[None]]) -> None:
        self._flush = flush
        self._batch: list[tuple[tuple[Claim, Outcome], asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, claim: Claim, outcome: Outcome) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._batch.append(((claim, outcome), done))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="webhook-results")
        await done

    async def wait_idle(self) -> None:
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        while self._batch:
            batch, self._batch = self._batch, []
            try:
                await self._flush([item for item, _ in batch])
            except Exception as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)


_DELIVERIES = cast(Table, WebhookDelivery.__table__)
_ENDPOINTS = cast(Table, WebhookEndpoint.__table__)


def _due() -> tuple[ColumnElement[bool], ...]:
    """Pending, its time has come (``b_now``), and no live lease."""
    return (
        _DELIVERIES.c.status == "pending",
        _DELIVERIES.c.next_attempt_at <= bindparam("b_now"),
        or_(_DELIVERIES.c.lease_until.is_(None), _DELIVERIES.c.lease_until < bindparam("b_now")),
    )


# Claim statements, built once (their construction cost more than SQLite running them).
_CANDIDATES = (
    select(_DELIVERIES.c.id)
    .join(_ENDPOINTS, _ENDPOINTS.c.id == _DELIVERIES.c.endpoint_id)
    .where(*_due(), _ENDPOINTS.c.active.is_(True))
    .order_by(_DELIVERIES.c.next_attempt_at, _DELIVERIES.c.id)
    .limit(bindparam("b_limit"))
)
_CANDIDATES_LOCKED = _CANDIDATES.with_for_update(of=_DELIVERIES, skip_locked=True)


def _leasing(picked: ColumnElement[bool]) -> Update:
    """Leases the ``picked`` rows still due (``b_until``, ``b_token``) and returns what a claim holds."""
    return (
        update(_DELIVERIES)
        .where(picked, *_due())
        .values(lease_until=bindparam("b_until"), lease_token=bindparam("b_token"))
        .returning(
            _DELIVERIES.c.id,
            _DELIVERIES.c.endpoint_id,
            _DELIVERIES.c.payload,
            _DELIVERIES.c.attempts,
            _DELIVERIES.c.next_attempt_at,
        )
    )


_LEASE = _leasing(_DELIVERIES.c.id.in_(bindparam("b_ids", expanding=True)))
#: PostgreSQL: the pick and the lease in one statement (one trip to the database per claim). The
#: candidates are a MATERIALIZED CTE, evaluated exactly once (a subquery in the ``UPDATE``'s ``WHERE``
#: may be evaluated more than once, and so lease more than ``limit``), locked ``SKIP LOCKED``.
_PICKED = _CANDIDATES_LOCKED.cte("picked").prefix_with("MATERIALIZED")
_PICK_AND_LEASE = _leasing(_DELIVERIES.c.id == _PICKED.c.id)


def _result_values(claim: Claim, outcome: Outcome) -> dict[str, object]:
    attempts = claim.attempts + 1
    values: dict[str, object] = {"attempts": attempts, "lease_until": None, "lease_token": None}
    if outcome.delivered:
        values.update(status="delivered", delivered_at=outcome.at, finished_at=outcome.at, last_error=None)
    elif attempts >= MAX_ATTEMPTS:
        values.update(status="failed", finished_at=outcome.at, last_error=outcome.error)
    else:
        retry_at = outcome.at + dt.timedelta(seconds=RETRY_DELAYS_S[attempts - 1])
        values.update(next_attempt_at=retry_at, last_error=outcome.error)
    return values


_MINE = (_DELIVERIES.c.id == bindparam("b_id"), _DELIVERIES.c.lease_token == bindparam("b_token"))
_RELEASED: dict[str, Any] = {"lease_until": None, "lease_token": None, "attempts": bindparam("b_attempts")}
#: Batched result writes (one ``executemany`` per kind), each row only under this worker's lease.
_RECORD_DELIVERED = (
    update(_DELIVERIES)
    .where(*_MINE)
    .values(
        status="delivered",
        delivered_at=bindparam("b_at"),
        finished_at=bindparam("b_at"),
        last_error=None,
        **_RELEASED,
    )
)
#: A live worker's leases, extended (only rows it still holds: a recorded result cleared the token).
_RENEW = (
    update(_DELIVERIES)
    .where(
        _DELIVERIES.c.id.in_(bindparam("b_ids", expanding=True)),
        _DELIVERIES.c.lease_token.in_(bindparam("b_tokens", expanding=True)),
    )
    .values(lease_until=bindparam("b_until"))
)
_RECORD_RETRY = (
    update(_DELIVERIES)
    .where(*_MINE)
    .values(next_attempt_at=bindparam("b_retry_at"), last_error=bindparam("b_error"), **_RELEASED)
)


class DeliveryWorker:
    """Claims due deliveries and sends them, ``concurrency`` at a time, until stopped."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        secret_box: SecretBox,
        settings: ControlPlaneSettings,
        *,
        clock: Clock = utcnow,
        transport: Transport | None = None,
    ) -> None:
        self.sessions = sessions
        self.secret_box = secret_box
        self.clock = clock
        self.concurrency = max(1, settings.webhook_concurrency)
        self._refill_at = max(1, self.concurrency // 2)
        self.lease = dt.timedelta(seconds=settings.webhook_lease_s)
        self.poll_interval_s = settings.webhook_poll_interval_s
        self.transport: Transport = transport or HttpTransport(
            timeout_s=settings.webhook_timeout_s, allow_private=settings.webhook_allow_private_targets
        )
        self._owns_transport = transport is None
        self._results = GroupCommit(self.record_many)
        #: This worker's own writes (claims, results) take turns instead of racing for SQLite's lock.
        self._writing = asyncio.Lock()
        #: On PostgreSQL a claim does not take that turn: it touches only rows nobody holds (picked
        #: ``SKIP LOCKED``, re-checked unleased), never one a result or a renewal writes, and waiting
        #: for a result's transaction was most of a delivery's p99 there. Results and renewals still
        #: take turns (they write the same held rows, in different orders).
        bind = sessions.kw.get("bind")
        self._postgresql = bind is not None and bind.dialect.name == "postgresql"
        self._claiming: contextlib.AbstractAsyncContextManager[Any] = (
            contextlib.nullcontext() if self._postgresql else self._writing
        )
        self._inflight: dict[asyncio.Task[None], Claim] = {}
        #: Claims whose result is not written yet, by delivery id: their leases are renewed.
        self._held: dict[str, Claim] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # PostgreSQL: woken by every process's commits that make deliveries due (and once on each
        # (re)connect, for those committed while nobody listened); SQLite: nothing to listen to.
        self._listener = ChannelListener(
            settings.database_url, webhooks.NOTIFY_CHANNEL, lambda _: self.wake(), catch_up=True
        )
        self._task: asyncio.Task[None] | None = None
        self._last_cleanup: dt.datetime | None = None
        #: A commit announced deliveries, or the last claim filled its limit: the next claim skips the
        #: idle check (a read that spares the write lock when nothing is due).
        self._likely_due = False
        #: Endpoint id → (url, sealed secret): both are fixed when the endpoint is created.
        self._endpoints: dict[str, tuple[str, str]] = {}
        #: Opened endpoint secrets by their sealed form (a Fernet decrypt per attempt is wasted work).
        self._secrets: dict[str, str] = {}

    @classmethod
    def from_services(cls, services: Services) -> DeliveryWorker:
        return cls(services.sessions, services.secret_box, services.settings, clock=services.clock)

    # claiming and recording -----------------------------------------------------------------------

    async def claim(self, limit: int) -> list[Claim]:
        """Lease up to ``limit`` due deliveries of active endpoints to this worker.

        The candidates are picked, then one ``UPDATE … RETURNING`` leases and returns them, re-checking
        that no live lease exists. On PostgreSQL that is one statement (``_PICK_AND_LEASE``: the pick
        locked ``FOR UPDATE SKIP LOCKED``, so concurrent claims split the queue instead of waiting on
        each other); on SQLite two, under its write lock. The endpoints' URLs and secrets (fixed at
        creation) are read once and kept.
        """
        now = self.clock()
        picked = {"b_now": now, "b_limit": limit}
        if not self._likely_due:  # a cheap read first: no write lock when idle
            async with self.sessions() as session:
                if not (await session.scalars(_CANDIDATES, picked)).first():
                    return []
        token = secrets.token_hex(16)
        async with self._claiming, transaction(self.sessions) as session:
            lease = {"b_now": now, "b_until": now + self.lease, "b_token": token}
            if self._postgresql:
                leased = list(await session.execute(_PICK_AND_LEASE, {**lease, "b_limit": limit}))
            else:
                ids = list((await session.scalars(_CANDIDATES, picked)).all())
                leased = list(await session.execute(_LEASE, {**lease, "b_ids": ids})) if ids else []
            if not leased:
                self._likely_due = False
                return []
            endpoints = self._endpoints
            unknown = {row.endpoint_id for row in leased} - endpoints.keys()
            if unknown:
                if len(endpoints) + len(unknown) > MAX_CACHED_ENDPOINTS:
                    endpoints.clear()
                    unknown = {row.endpoint_id for row in leased}
                found = await session.execute(
                    select(WebhookEndpoint.id, WebhookEndpoint.url, WebhookEndpoint.secret_sealed).where(
                        WebhookEndpoint.id.in_(unknown)
                    )
                )
                endpoints.update((row.id, (row.url, row.secret_sealed)) for row in found)
        self._likely_due = len(leased) >= limit  # more may be due: skip the read next time
        leased.sort(key=lambda row: (row.next_attempt_at, row.id))  # RETURNING has no order
        claims = [
            Claim(row.id, row.endpoint_id, *endpoints[row.endpoint_id], row.payload, row.attempts, token)
            for row in leased
        ]
        self._held.update((claim.id, claim) for claim in claims)
        return claims

    async def renew(self) -> int:
        """Extend the leases of the claims this worker still holds to a full lease from now; returns
        how many rows were extended (a claim whose result was written meanwhile is no longer held)."""
        held = list(self._held.values())
        if not held:
            return 0
        values = {
            "b_ids": [claim.id for claim in held],
            "b_tokens": list({claim.token for claim in held}),
            "b_until": self.clock() + self.lease,
        }
        async with self._writing, transaction(self.sessions) as session:
            result = await session.execute(_RENEW, values)
        return int(result.rowcount or 0)  # type: ignore[attr-defined]

    async def record_many(self, results: list[tuple[Claim, Outcome]]) -> None:
        """Write attempt results in one transaction, each only while this worker still holds its lease.

        Deliveries and retries are written by one batched statement each; a delivery's last failed
        retry makes it ``failed`` and counts against its endpoint, which is suspended when the count
        reaches 50 (one statement per such row: the count moves only if the lease was still ours).
        """
        delivered: list[dict[str, object]] = []
        retried: list[dict[str, object]] = []
        failed: list[tuple[Claim, dict[str, object]]] = []
        for claim, outcome in results:
            values = _result_values(claim, outcome)
            if values.get("status") == "failed":
                failed.append((claim, values))
            else:
                row = {"b_id": claim.id, "b_token": claim.token, "b_attempts": values["attempts"]}
                if outcome.delivered:
                    delivered.append({**row, "b_at": outcome.at})
                else:
                    retried.append({**row, "b_retry_at": values["next_attempt_at"], "b_error": outcome.error})
        async with self._writing, transaction(self.sessions) as session:
            if delivered:
                await session.execute(_RECORD_DELIVERED, delivered)
            if retried:
                await session.execute(_RECORD_RETRY, retried)
            for claim, values in failed:
                mine = (WebhookDelivery.id == claim.id, WebhookDelivery.lease_token == claim.token)
                result = await session.execute(update(WebhookDelivery).where(*mine).values(**values))
                if result.rowcount != 1:  # type: ignore[attr-defined]
                    log.warning("webhook_lease_lost", delivery_id=claim.id)
                    continue
                await session.execute(
                    update(WebhookEndpoint)
                    .where(WebhookEndpoint.id == claim.endpoint_id)
                    .values(
                        failure_count=WebhookEndpoint.failure_count + 1,
                        active=case(
                            (WebhookEndpoint.failure_count + 1 >= AUTO_SUSPEND_AT, False),
                            else_=WebhookEndpoint.active,
                        ),
                    )
                )
        for claim, outcome in results:
            fields = {
                "delivery_id": claim.id,
                "endpoint_id": claim.endpoint_id,
                "attempt": claim.attempts + 1,
            }
            if outcome.delivered:
                log.debug("webhook_delivered", **fields)
            elif claim.attempts + 1 >= MAX_ATTEMPTS:
                log.warning("webhook_failed", error=outcome.error, **fields)
            else:
                log.info("webhook_attempt_failed", error=outcome.error, **fields)

    async def record(self, claim: Claim, outcome: Outcome) -> None:
        await self.record_many([(claim, outcome)])

    # one attempt ---------------------------------------------------------------------------------

    async def attempt(self, claim: Claim) -> Outcome:
        signing_key = self._secrets.get(claim.secret_sealed)
        if signing_key is None:
            try:
                signing_key = self.secret_box.open(claim.secret_sealed)
            except ValueError:
                return Outcome(
                    False, self.clock(), "endpoint secret cannot be decrypted with the configured key"
                )
            if len(self._secrets) >= MAX_CACHED_SECRETS:
                self._secrets.clear()
            self._secrets[claim.secret_sealed] = signing_key
        body = claim.payload.encode()
        timestamp = int(self.clock().timestamp())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Webhook-Timestamp": str(timestamp),
            "X-Webhook-Signature": sign(signing_key, timestamp, body),
            "X-Webhook-Delivery": claim.id,
        }
        try:
            status = await self.transport.post(claim.url, body, headers)
        except DeliveryFailed as exc:
            return Outcome(False, self.clock(), str(exc))
        if 200 <= status < 300:
            return Outcome(True, self.clock())
        return Outcome(False, self.clock(), f"HTTP {status}")

    async def _process(self, claim: Claim) -> None:
        try:
            try:
                outcome = await self.attempt(claim)
            except Exception as exc:  # a bug in a transport: count the attempt, keep the worker alive
                log.error("webhook_attempt_crashed", delivery_id=claim.id, exc_info=exc)
                outcome = Outcome(False, self.clock(), "internal error")
            await self._results.submit(claim, outcome)
        finally:
            self._held.pop(claim.id, None)  # recorded, or handed back by ``stop``: no longer renewed

    async def run_once(self) -> int:
        """Claim what is due now (up to ``concurrency``), send it, record it; returns how many."""
        claims = await self.claim(self.concurrency)
        await asyncio.gather(*(self._process(c) for c in claims))
        return len(claims)

    async def drain(self, max_rounds: int = 1000) -> int:
        """``run_once`` until nothing is due at the current clock (for tests and tools)."""
        total = 0
        for _ in range(max_rounds):
            sent = await self.run_once()
            if not sent:
                break
            total += sent
        return total

    async def cleanup(self) -> int:
        """Retention: finished deliveries after 30 minutes, every delivery after 72 hours."""
        now = self.clock()
        async with self._writing, transaction(self.sessions) as session:
            result = await session.execute(
                delete(WebhookDelivery).where(
                    or_(
                        WebhookDelivery.finished_at < now - RETAIN_FINISHED,
                        WebhookDelivery.created_at < now - RETAIN_ANY,
                    )
                )
            )
        self._last_cleanup = now
        return int(result.rowcount or 0)  # type: ignore[attr-defined]

    # the loop ------------------------------------------------------------------------------------

    def wake(self) -> None:
        """A commit made deliveries due (this process's, or on PostgreSQL any process's)."""
        self._likely_due = True
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            self._wake.clear()  # before claiming: a wake during the claim is not lost
            claims: list[Claim] = []
            try:
                free = self.concurrency - len(self._inflight)
                # Refill in batches (half the slots at least) while busy: one claim per delivery
                # would cost a write transaction each.
                if free >= self._refill_at or (free > 0 and not self._inflight):
                    claims = await self.claim(free)
                for claim in claims:
                    task = asyncio.create_task(self._process(claim), name=f"webhook:{claim.id}")
                    self._inflight[task] = claim
                    task.add_done_callback(self._done)
                if self._cleanup_due():
                    await self.cleanup()
            except Exception as exc:  # keep delivering; the database may come back
                log.error("webhook_worker_failed", exc_info=exc)
            if not claims or len(self._inflight) >= self.concurrency:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_interval_s)

    async def _renew_loop(self) -> None:
        """Every third of a lease, while anything is held: one missed renewal still leaves time for the
        next, and a dead worker's leases lapse within one lease."""
        interval_s = self.lease.total_seconds() / 3
        while True:
            await asyncio.sleep(interval_s)
            if not self._held:
                continue
            try:
                await self.renew()
            except Exception as exc:  # the next one may get through; until the lease ends nobody else sends
                log.warning("webhook_lease_renewal_failed", error=str(exc))

    def _cleanup_due(self) -> bool:
        if self._last_cleanup is None:
            return True
        return (self.clock() - self._last_cleanup).total_seconds() >= CLEANUP_INTERVAL_S

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)
        if self._likely_due:  # a slot for what is waiting; otherwise nothing new is due (the poll looks)
            self._wake.set()

    def start(self) -> None:
        webhooks.add_waker(self.wake)
        self._listener.start()
        self._task = asyncio.create_task(self._loop(), name="webhook-worker")
        self._renewer = asyncio.create_task(self._renew_loop(), name="webhook-lease-renewal")

    async def stop(self) -> None:
        """Stop claiming; interrupted attempts are handed back at once (sent again by any worker)."""
        webhooks.remove_waker(self.wake)
        await self._listener.stop()
        for task in (self._task, self._renewer):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        interrupted = list(self._inflight.values())
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        await self._results.wait_idle()
        if interrupted:
            await self._release(interrupted)
        if self._owns_transport:
            await self.transport.aclose()

    async def _release(self, claims: list[Claim]) -> None:
        try:
            async with self._writing, transaction(self.sessions) as session:
                for claim in claims:  # a result recorded meanwhile already cleared the token: no-op
                    await session.execute(
                        update(WebhookDelivery)
                        .where(WebhookDelivery.id == claim.id, WebhookDelivery.lease_token == claim.token)
                        .values(lease_until=None, lease_token=None)
                    )
        except Exception as exc:  # the leases expire on their own
            log.warning("webhook_release_failed", error=str(exc))


async def serve(settings: ControlPlaneSettings) -> None:
    """Run a worker alone against the configured database until cancelled."""
    engine = make_engine(settings.database_url)
    box = SecretBox(settings.secret_key.get_secret_value() or "paddock-dev-insecure-key")
    worker = DeliveryWorker(make_sessionmaker(engine), box, settings)
    worker.start()
    try:
        await asyncio.Event().wait()
    finally:
        await worker.stop()
        await engine.dispose()


def main() -> None:
    settings = ControlPlaneSettings()
    configure_logging(settings.log_level, json=settings.log_json)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
