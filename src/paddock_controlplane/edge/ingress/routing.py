"""Where an ingress request goes: host name -> (sandbox, port) -> the sandbox's address, waking it if paused.

Routes are read from the database and kept in a short-lived in-process cache (``hotcache.TTLCache``,
``hot_cache_ttl_s``), so a request to a running sandbox costs no database trip in steady state. This
process's own writes to a sandbox row evict its route at once (``hotcache.drop_changed_sandboxes``);
changes made by another control-plane process are seen within the TTL.

A paused sandbox is resumed through ``suspension.resume`` (the API's own path: quota and credit checks,
billing, state and the ``sandbox.resume`` webhook stay right); concurrent first requests share one
resume. For ``WAKE_SETTLE_S`` after a wake the routes it returns say so (``Route.settle_until``):
its thawed app may still refuse or drop the first connections (under gVisor's ptrace platform on a
loaded host it does), and the proxy tries those again within that window instead of answering 502.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from paddock_controlplane.edge.e2b import fresh_start
from paddock_controlplane.edge.e2b.store import E2bSandbox
from paddock_controlplane.records.app_ports import PLAIN_PORTS, AppPorts
from paddock_controlplane.records.hotcache import TTLCache
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import CLOSED, SETTLING, SandboxStatus
from paddock_controlplane.sandboxes import computer
from paddock_core import errors
from paddock_core.logging import get_logger

log = get_logger("paddock.ingress")

_SANDBOX_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
GONE = CLOSED
#: How long after a wake the proxy keeps trying a connection the app refused or closed unanswered.
WAKE_SETTLE_S = 5.0


class IngressError(Exception):
    """A request the proxy answers itself: ``status`` with a stable ``code`` and a message for people."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Target:
    sandbox_id: str
    port: int


@dataclass(frozen=True)
class Route:
    """What the proxy needs to know about a sandbox (a detached copy of the row's fields)."""

    sandbox_id: str
    user_id: str
    status: str
    ip: str | None
    ingress_enabled: bool
    #: Booted from a desktop image: its noVNC ports open only with a live-view token (desktop_access).
    desktop: bool = False
    #: Made through the E2B API (a row in ``e2b_sandboxes``): with ingress on (E2B's public traffic) a
    #: desktop's 6080 is the stream ``e2b-desktop`` serves there, an ordinary port (docs/e2b.md).
    e2b: bool = False
    #: The ``Host`` its apps get and the ports reached over TLS (``ingress_host_header`` and
    #: ``ingress_https_ports``; E2B's ``maskRequestHost`` and ``httpsPorts``).
    ports: AppPorts = PLAIN_PORTS
    #: Woken by this router lately: until this monotonic time its app may still refuse or drop the first
    #: connections, and the proxy tries again (0.0: not woken within ``WAKE_SETTLE_S``).
    settle_until: float = 0.0


def parse_host(authority: str, domain: str) -> Target | None:
    """``3000-sb-01j….sandbox.example.com[:8088]`` -> Target; None if it is not an ingress host name."""
    host = authority.strip().lower()
    if host.startswith("["):
        return None
    name, sep, port_text = host.rpartition(":")
    if sep and port_text.isdigit():
        host = name
    host = host.rstrip(".")
    suffix = "." + domain.lower().strip(".")
    if not host.endswith(suffix):
        return None
    label = host[: -len(suffix)]
    port_text, sep, sandbox_id = label.partition("-")
    if not sep or not port_text.isdigit() or len(port_text) > 5 or not _SANDBOX_ID.match(sandbox_id):
        return None
    port = int(port_text)
    if not 1 <= port <= 65535:
        return None
    return Target(sandbox_id, port)


class Router:
    def __init__(self, services: Services, cache: TTLCache[Any]) -> None:
        self.services = services
        self.cache = cache
        self._resumes: dict[str, asyncio.Task[Sandbox]] = {}
        self._settle_ends: dict[str, float] = {}  # sandbox id -> monotonic end of its wake's settle window

    async def resolve(self, sandbox_id: str, *, live_view: bool = False) -> Route:
        """The route of a running sandbox with ingress on (or, for a request carrying a valid live-view
        or E2B traffic token, ``live_view``, with ingress off too), or IngressError (404, 502, 503, 504)."""
        cached = self.cache.get(sandbox_id)
        if isinstance(cached, Route):
            ready = _check(cached, live_view)
            if ready is not None:
                return self._with_settle(ready)
        deadline = time.monotonic() + self.services.settings.ingress_wake_timeout_s
        delay = 0.05
        while True:
            route = await self.load(sandbox_id)
            ready = _check(route, live_view)
            if ready is not None:
                return self._with_settle(ready)
            if route.status == SandboxStatus.PAUSED:
                await self._resume(route)
                continue
            if time.monotonic() >= deadline:
                raise IngressError(
                    504, "SANDBOX_NOT_READY", f"sandbox {sandbox_id} is still {route.status}; try again"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _with_settle(self, route: Route) -> Route:
        """The route, with ``settle_until`` set while the sandbox's wake settle window is open."""
        until = self._settle_ends.get(route.sandbox_id)
        if until is None:
            return route
        if until <= time.monotonic():
            del self._settle_ends[route.sandbox_id]
            return route
        return dataclasses.replace(route, settle_until=until)

    async def refusal(self, key: str) -> IngressError | None:
        """For open exchanges: why the sandbox's ports are now closed to them (it is gone, or its ingress
        was turned off), or None while they may go on. ``key`` is a sandbox id, or ``<sandbox id>#live``
        for a live view, ``#token`` for a request opened with the sandbox's E2B traffic token, or
        ``#e2b`` for its envd or code interpreter, which the E2B edge serves under its own token check
        (ingress may be off for all three)."""
        sandbox_id, _, via = key.partition("#")
        route = self.cache.get(sandbox_id)
        if not isinstance(route, Route):
            route = await self.load(sandbox_id)
        return _closed(route, live_view=via in ("live", "token", "e2b"))

    async def load(self, sandbox_id: str) -> Route:
        async with self.services.sessions() as session:
            row = (
                await session.execute(
                    select(
                        Sandbox.id,
                        Sandbox.user_id,
                        Sandbox.status,
                        Sandbox.ip,
                        Sandbox.ingress_enabled,
                        Sandbox.rootfs,
                        E2bSandbox.sandbox_id,
                        Sandbox.ingress_host_header,
                        Sandbox.ingress_https_ports,
                    )
                    .outerjoin(E2bSandbox, E2bSandbox.sandbox_id == Sandbox.id)
                    .where(Sandbox.id == sandbox_id)
                )
            ).first()
        if row is None:
            route = Route(sandbox_id, "", "missing", None, False)
        else:
            desktop = await computer.is_desktop_image(self.services, str(row[5]))
            route = Route(
                row[0],
                row[1],
                row[2],
                row[3],
                bool(row[4]),
                desktop,
                row[6] is not None,
                ports=AppPorts.of(row[7], row[8]),
            )
        if route.status not in (*SETTLING, SandboxStatus.PAUSED):
            self.cache.put(sandbox_id, route)
        return route

    async def _resume(self, route: Route) -> None:
        task = self._resumes.get(route.sandbox_id)
        if task is None:
            task = asyncio.create_task(self._wake(route))
            self._resumes[route.sandbox_id] = task
            task.add_done_callback(lambda _: self._resumes.pop(route.sandbox_id, None))
            log.info("ingress_resume", sandbox_id=route.sandbox_id)
        try:
            row = await asyncio.shield(task)
        except errors.InvalidState:
            return  # someone else moved it on (resumed, destroyed): look again
        except errors.PaddockError as exc:
            raise IngressError(
                503, "SANDBOX_PAUSED", f"sandbox is paused and could not resume: {exc}"
            ) from None
        if row.status == SandboxStatus.ERROR:
            raise IngressError(502, "SANDBOX_ERROR", "sandbox failed to resume")

    async def _wake(self, route: Route) -> Sandbox:
        """One resume, shared by the requests that found the sandbox paused; opens its settle window."""
        # suspension.resume's own path; an E2B sandbox's lifetime then starts again, as on E2B
        row = await fresh_start.resume_on_activity(self.services, route.user_id, route.sandbox_id)
        now = time.monotonic()
        for sandbox_id, until in list(self._settle_ends.items()):
            if until <= now:
                del self._settle_ends[sandbox_id]
        if row.status != SandboxStatus.ERROR:
            self._settle_ends[route.sandbox_id] = now + WAKE_SETTLE_S
        return row


def _check(route: Route, live_view: bool = False) -> Route | None:
    """The route if requests may go through now; None if it needs waiting or waking; else IngressError."""
    closed = _closed(route, live_view)
    if closed is not None:
        raise closed
    if route.status == SandboxStatus.ERROR:
        raise IngressError(502, "SANDBOX_ERROR", "the sandbox is in error state")
    if route.status == SandboxStatus.RUNNING and route.ip:
        return route
    return None


def _closed(route: Route, live_view: bool) -> IngressError | None:
    """Why the sandbox's ports are closed to a request (gone, or ingress off and no live-view or traffic
    token), or None: refused before a request goes through (``_check``), and cutting one in flight
    (``Router.refusal``)."""
    if route.status in (*GONE, "missing"):
        return IngressError(404, "SANDBOX_NOT_FOUND", f"no sandbox {route.sandbox_id}")
    if not route.ingress_enabled and not live_view:
        return IngressError(404, "INGRESS_DISABLED", "ingress is not enabled for this sandbox")
    return None
