"""The template build worker: claims pending builds from the database and drives them on a host.

A build is claimed with a lease (``Template.lease_until``), renewed while it runs, so several
control-plane processes can run this worker side by side and a build whose process died is claimed
again once the lease lapses (a new attempt). Each attempt:

1. picks a live host that can offer the ``FROM`` image (a template base: the host holding it), records
   ``building``, the attempt number and its host, and emits ``template.build.start``;
2. starts the attempt on the host (``POST /internal/v1/builds``) and polls it every
   ``POLL_S`` for new log lines, appended here as they come, so the log is followable;
3. ends ``ready`` (the image is on that host; the host's image list gains it at once, so the
   scheduler places sandboxes of this template there), or ``failed``: retried up to
   ``template_build_attempts`` attempts, then ``failed`` with ``template.build.complete``.

A template deleted while it builds is noticed at the next poll: the host cancels the attempt (its
RUN step is killed) and drops what it made.

Never a state the host does not have: an attempt the worker gives up on (the host stopped answering
past the time limit, a start or poll that failed) is cancelled on the host before it is recorded
failed; a cancel that fails is retried, the template staying ``building`` (its lease renewed) until the
host confirms.

The log of one attempt is capped as it is recorded (``LogCap``): its first ``LOG_HEAD_LINES`` lines
(``LOG_HEAD_BYTES``) as they come, then only the last ``LOG_TAIL_LINES`` (``LOG_TAIL_BYTES``), written
when the attempt ends after a line saying how many were cut. Log rows go with the template.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import datetime as dt
import time
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import undefer

from paddock_controlplane.hosts import hostlink, scheduler
from paddock_controlplane.records.models import Host, Template, TemplateLogLine
from paddock_controlplane.records.services import Services
from paddock_controlplane.resources import templates, webhooks
from paddock_core import errors
from paddock_core.db import transaction
from paddock_core.logging import get_logger
from paddock_hostagent.schemas import BuildBody, BuildLine, BuildView

log = get_logger("paddock.template_builds")

POLL_S = 0.3
LEASE_S = 30.0
IDLE_POLL_S = 1.0
#: The host enforces the attempt's time limit; the worker gives up this much later on its own (a host
#: that stopped answering).
GRACE_S = 60.0
#: A cancel the host did not confirm is tried again after this long, doubling up to the maximum.
CANCEL_RETRY_S = 1.0
CANCEL_RETRY_MAX_S = 30.0
#: Per attempt, what the database keeps of a build's log (lines are cut to MAX_LINE_CHARS first).
LOG_HEAD_LINES = 2000
LOG_HEAD_BYTES = 1024 * 1024
LOG_TAIL_LINES = 1000
LOG_TAIL_BYTES = 512 * 1024
MAX_LINE_CHARS = 8192


class LogCap:
    """One attempt's log on its way to the database: the head is written as it comes, the tail is held
    here (bounded) and written at the end with a line saying what was cut between them."""

    def __init__(self) -> None:
        self.head_lines = 0
        self.head_bytes = 0
        self.tail: collections.deque[tuple[float, str, str]] = collections.deque()
        self.tail_bytes = 0
        self.cut_lines = 0
        self.cut_bytes = 0

    def take(self, ts: float, level: str, line: str) -> bool:
        """True: write this line now (the head); False: it is held in the tail (or cut)."""
        line = line[:MAX_LINE_CHARS]
        size = len(line.encode())
        if not self.tail and self.head_lines < LOG_HEAD_LINES and self.head_bytes + size <= LOG_HEAD_BYTES:
            self.head_lines += 1
            self.head_bytes += size
            return True
        self.tail.append((ts, level, line))
        self.tail_bytes += size
        while len(self.tail) > LOG_TAIL_LINES or self.tail_bytes > LOG_TAIL_BYTES:
            _, _, gone = self.tail.popleft()
            size = len(gone.encode())
            self.tail_bytes -= size
            self.cut_lines += 1
            self.cut_bytes += size
        return False

    def drain(self) -> list[tuple[float, str, str]]:
        """What is left to write at the end: the cut note, then the tail."""
        out: list[tuple[float, str, str]] = []
        if self.cut_lines:
            out.append(
                (
                    time.time(),
                    "warn",
                    f"[log cut: {self.cut_lines} lines ({self.cut_bytes} bytes) between the first "
                    f"{self.head_lines} and the last {len(self.tail)} were not kept]",
                )
            )
        out.extend(self.tail)
        self.tail.clear()
        self.tail_bytes = 0
        self.cut_lines = self.cut_bytes = 0
        return out


class _Deleted(Exception):
    """The template was deleted while its build ran."""


class TemplateBuilder:
    def __init__(self, services: Services) -> None:
        self.services = services
        self._task: asyncio.Task[None] | None = None
        self._running: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="template-builder")

    async def stop(self) -> None:
        tasks = [task for task in (self._task, *self._running.values()) if task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _loop(self) -> None:
        wake = self.services.template_wake
        while True:
            try:
                claimed = await self.claim()
            except Exception:  # a database hiccup must not end the worker
                log.exception("template_claim_failed")
                claimed = None
            if claimed is not None:
                task = asyncio.create_task(self.run(claimed), name=f"template-build-{claimed}")
                self._running[claimed] = task
                task.add_done_callback(self._forget_task)
                continue
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), IDLE_POLL_S)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        for key, running in list(self._running.items()):
            if running is task:
                del self._running[key]

    def _now(self) -> dt.datetime:
        return self.services.clock()

    async def claim(self) -> str | None:
        """One template to build: pending, or building under a lapsed lease. Conditional update, so
        two workers never both win a row (SQLite and PostgreSQL alike)."""
        now = self._now()
        async with transaction(self.services.sessions) as session:
            candidate = await session.scalar(
                select(Template.id)
                .where(
                    Template.deleted_at.is_(None),
                    or_(
                        Template.status == "pending",
                        (Template.status == "building") & (Template.lease_until < now),
                    ),
                    Template.id.not_in(list(self._running)),
                )
                .order_by(Template.created_at)
                .limit(1)
            )
            if candidate is None:
                return None
            won = await session.execute(
                update(Template)
                .where(
                    Template.id == candidate,
                    or_(Template.lease_until.is_(None), Template.lease_until < now),
                )
                .values(lease_until=now + dt.timedelta(seconds=LEASE_S))
            )
            return candidate if won.rowcount == 1 else None  # type: ignore[attr-defined]

    # -- one build, its attempts -------------------------------------------------------------------

    async def run(self, template_id: str) -> None:
        settings = self.services.settings
        try:
            while True:  # ends: every pass is one more attempt, bounded below
                attempt, host_id = await self._begin_attempt(template_id)
                if attempt is None:
                    return
                try:
                    view = await self._attempt(template_id, attempt, host_id)
                except _Deleted:
                    await self._cancel(template_id, host_id)
                    return
                except hostlink.SandboxGoneError as exc:  # the host no longer has the attempt
                    view = None
                    await self._say(template_id, attempt, f"the build host lost the build: {exc}", "error")
                except (hostlink.HostError, errors.PaddockError) as exc:
                    # It may still run there: cancelled first, so failed is what the host has too.
                    view = None
                    await self._cancel(template_id, host_id)
                    await self._say(template_id, attempt, f"the build host failed: {exc}", "error")
                if view is not None and view.status == "ready":
                    await self._finish(template_id, attempt, host_id, view)
                    return
                reason = (view.error if view is not None else None) or "the build failed"
                if attempt >= settings.template_build_attempts:
                    await self._finish(template_id, attempt, host_id, view, reason=reason)
                    return
                await self._say(
                    template_id, attempt, f"attempt {attempt} failed ({reason}); retrying", "warn"
                )
        except Exception:
            log.exception("template_build_crashed", template_id=template_id)

    async def _begin_attempt(self, template_id: str) -> tuple[int | None, str]:
        async with transaction(self.services.sessions) as session:
            template = await session.get(Template, template_id, with_for_update=True)
            if template is None or template.deleted_at is not None:
                return None, ""
            try:
                host_id = await self._pick_host(session, template)
            except errors.PaddockError as exc:
                template.attempt += 1
                await self._end(session, template, "failed", reason=f"no host can build it: {exc}")
                return None, ""
            template.attempt += 1
            template.status = "building"
            template.host_id = host_id
            template.error = None
            template.lease_until = self._now() + dt.timedelta(seconds=LEASE_S)
            await webhooks.emit(
                session,
                user_id=template.user_id,
                action="template.build.start",
                data={"template_id": template.id, "user_id": template.user_id, "attempt": template.attempt},
            )
            return template.attempt, host_id

    async def _pick_host(self, session: Any, template: Template) -> str:
        if template.from_image.startswith("tpl_"):
            base = await session.get(Template, template.from_image)
            host_id = base.host_id if base is not None else None
        else:
            host_id = None
        return await scheduler.pick_host(
            session,
            mem_mib=0,  # a build's memory is its own cgroup's, not a sandbox's reservation
            rootfs=template.from_image,
            now=self._now(),
            dead_after_s=self.services.settings.host_dead_after_s,
            host_id=host_id,
        )

    async def _attempt(self, template_id: str, attempt: int, host_id: str) -> BuildView:
        settings = self.services.settings
        async with self.services.sessions() as session:
            template = await session.get(Template, template_id, options=[undefer(Template.context)])
        assert template is not None
        context = base64.b64encode(template.context).decode() if template.context else None
        link = await hostlink.for_host(self.services, host_id)
        view = await link.start_build(
            BuildBody(
                id=template_id,
                dockerfile=template.dockerfile,
                base=template.from_image,
                attempt=attempt,
                timeout_s=settings.template_build_timeout_s,
                vcpu=settings.template_build_vcpu,
                mem_mib=settings.template_build_mem_mib,
                egress=list(settings.template_build_egress),
                context_b64=context,
                owner=template.user_id,
                disk_mib=settings.template_build_disk_mib,
            )
        )
        deadline = time.monotonic() + settings.template_build_timeout_s + GRACE_S
        cap = LogCap()
        after = 0
        try:
            while True:
                try:
                    view = await link.get_build(template_id, after=after)
                except hostlink.HostError as exc:
                    # One poll that failed (a slow or restarting host): the build goes on there.
                    if time.monotonic() > deadline:
                        raise
                    log.warning("template_build_poll_failed", template_id=template_id, error=str(exc))
                    if not await self._record(template_id, attempt, [], cap):
                        raise _Deleted from None
                    await asyncio.sleep(POLL_S)
                    continue
                after = view.next
                done = view.status != "building"
                if not await self._record(template_id, attempt, view.lines, cap):
                    raise _Deleted
                if done:
                    return view
                if time.monotonic() > deadline:
                    await self._cancel(template_id, host_id)
                    return view.model_copy(
                        update={"status": "failed", "error": "the build host stopped reporting", "lines": []}
                    )
                await asyncio.sleep(POLL_S)
        finally:
            with contextlib.suppress(Exception):
                await self._write_tail(template_id, attempt, cap)

    async def _record(self, template_id: str, attempt: int, lines: list[BuildLine], cap: LogCap) -> bool:
        """Appends the new lines (the head of the attempt's log; the rest waits in ``cap``) and renews
        the lease; False once the template is deleted."""
        async with transaction(self.services.sessions) as session:
            template = await session.get(Template, template_id, with_for_update=True)
            if template is None or template.deleted_at is not None:
                return False
            template.lease_until = self._now() + dt.timedelta(seconds=LEASE_S)
            session.add_all(
                TemplateLogLine(
                    template_id=template_id,
                    attempt=attempt,
                    ts=dt.datetime.fromtimestamp(line.ts, dt.UTC),
                    level=line.level,
                    line=line.line[:MAX_LINE_CHARS],
                )
                for line in lines
                if cap.take(line.ts, line.level, line.line)
            )
        return True

    async def _write_tail(self, template_id: str, attempt: int, cap: LogCap) -> None:
        """The end of an attempt's log: what was cut, then its last lines (unless it was deleted)."""
        held = cap.drain()
        if not held:
            return
        async with transaction(self.services.sessions) as session:
            template = await session.get(Template, template_id, with_for_update=True)
            if template is None or template.deleted_at is not None:
                return
            session.add_all(
                TemplateLogLine(
                    template_id=template_id,
                    attempt=attempt,
                    ts=dt.datetime.fromtimestamp(ts, dt.UTC),
                    level=level,
                    line=line,
                )
                for ts, level, line in held
            )

    async def _say(self, template_id: str, attempt: int, text: str, level: str = "info") -> None:
        async with transaction(self.services.sessions) as session:
            template = await session.get(Template, template_id, with_for_update=True)
            if template is None or template.deleted_at is not None:
                return  # its log went with it
            session.add(
                TemplateLogLine(
                    template_id=template_id, attempt=attempt, ts=self._now(), level=level, line=text
                )
            )

    async def _finish(
        self,
        template_id: str,
        attempt: int,
        host_id: str,
        view: BuildView | None,
        *,
        reason: str | None = None,
    ) -> None:
        async with transaction(self.services.sessions) as session:
            template = await session.get(Template, template_id, with_for_update=True)
            if template is None:
                return
            if template.deleted_at is not None:
                deleted = True
            else:
                deleted = False
                if reason is None and view is not None:
                    template.ext4_size_bytes = view.ext4_size_bytes
                    template.built_at = self._now()
                    host = await session.get(Host, host_id, with_for_update=True)
                    if host is not None and template_id not in (host.rootfses or []):
                        # The scheduler places by the host's image list; the next heartbeat says the
                        # same, this makes the template bootable at once.
                        host.rootfses = [*(host.rootfses or []), template_id]
                    await self._end(session, template, "ready")
                else:
                    await self._end(session, template, "failed", reason=reason)
        if deleted:
            await self._cancel(template_id, host_id)
        elif reason is None and view is not None:  # a rebuild is ready: the template it replaced goes
            await templates.retire_replaced(self.services, template)

    async def _end(self, session: Any, template: Template, status: str, *, reason: str | None = None) -> None:
        template.status = status
        template.lease_until = None
        template.error = reason
        template.context = None  # the build is over: its files are in the image or not needed
        if reason:
            session.add(
                TemplateLogLine(
                    template_id=template.id,
                    attempt=max(template.attempt, 1),
                    ts=self._now(),
                    level="error",
                    line=f"build failed after {template.attempt} attempt(s): {reason}",
                )
            )
        await webhooks.emit(
            session,
            user_id=template.user_id,
            action="template.build.complete",
            data={
                "template_id": template.id,
                "user_id": template.user_id,
                "status": status,
                "attempt": template.attempt,
            },
        )
        log.info("template_build_complete", template_id=template.id, status=status, attempt=template.attempt)

    async def _cancel(self, template_id: str, host_id: str | None) -> None:
        """Cancels the attempt on its host, until the host confirms: a cancel that fails is tried again
        (the lease renewed meanwhile, so no other worker starts an attempt and the template stays as
        it is), since recording a build failed that the host still runs would be a lie."""
        if host_id is None:
            return
        delay = CANCEL_RETRY_S
        while True:  # ends when the host answers; a host that never does keeps the build building
            try:
                link = await hostlink.for_host(self.services, host_id)
                await link.delete_build(template_id)
                return
            except hostlink.SandboxGoneError:
                return
            except (hostlink.HostError, errors.PaddockError) as exc:
                log.warning("template_build_cancel_failed", template_id=template_id, error=str(exc))
            await self._renew(template_id)
            await asyncio.sleep(delay)
            delay = min(delay * 2, CANCEL_RETRY_MAX_S)

    async def _renew(self, template_id: str) -> None:
        with contextlib.suppress(Exception):
            async with transaction(self.services.sessions) as session:
                await session.execute(
                    update(Template)
                    .where(Template.id == template_id)
                    .values(lease_until=self._now() + dt.timedelta(seconds=LEASE_S))
                )
