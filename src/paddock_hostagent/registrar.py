"""Registers this host with the control plane by heartbeat, every ``heartbeat_interval_s``.

``POST {controlplane_url}/internal/v1/hosts/heartbeat`` with the shared bearer token and the host's
capacity, images and sandboxes. A control plane that is down or answers an error is logged (once per
outage) and retried on the next beat; the agent keeps serving.

``controlplane_url`` may list several control planes, comma-separated (N control planes on one
database with no load balancer in front): a beat goes to the one that took the last beat, and on
failure to the next in the list within the same beat, so a dead control plane costs no beat.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import httpx

from paddock_core.heartbeat import SUMMARY_OK
from paddock_core.logging import get_logger
from paddock_hostagent.host import tier_labels
from paddock_hostagent.sandboxes import SandboxManager
from paddock_hostagent.settings import HostAgentSettings

log = get_logger(__name__)

#: How long a heartbeat waits for the sandboxes' counters before it goes with the last ones read. The
#: read queues on the agent's one libnftables context, behind whatever else is changing the ruleset: a
#: thousand destroys at once kept it busy for tens of seconds, longer than the control plane waits
#: before it declares a silent host dead (and errors all its sandboxes).
USAGE_WAIT_S = 1.0


class Registrar:
    def __init__(self, settings: HostAgentSettings, manager: SandboxManager) -> None:
        self.settings = settings
        self.manager = manager
        self._task: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None  # the counters being read, maybe for a past beat
        self._healthy = True
        self.beats_sent = 0
        #: Heartbeat URLs whose control plane holds this host's hibernated sandboxes as the last beat's
        #: summary said: their beats leave them out until it answers ``full``.
        self._summarised: set[str] = set()

    def payload(self, url: str = "") -> dict[str, Any]:
        """The beat for the control plane at ``url``: its hibernated sandboxes are left out of
        ``sandboxes`` once it said it holds the same set (``paddock_core/heartbeat.py``)."""
        info = self.manager.info()
        summarised = url in self._summarised
        return {
            "id": info.id,
            "url": self.settings.advertised_url,
            "free_mib": info.free_mib,
            "total_mib": info.total_mib,
            "vm_count": info.vm_count,
            "rootfses": info.rootfses,
            "buildable": info.buildable,
            # The tier labels come last: an operator's labels cannot claim another isolation tier.
            "labels": {**info.labels, **tier_labels(info.runtime)},
            "runtime": info.runtime,
            "status": "active",
            "sandboxes": self.manager.heartbeat.sandboxes(hibernated=not summarised),
            "hibernated": {**self.manager.heartbeat.hibernated_summary(), "listed": not summarised},
            "egress_audit": self.manager.heartbeat.egress_audit(),
        }

    def start(self) -> None:
        if self.settings.controlplane_url and self._task is None:
            self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def stop(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
        if self._task is not None:
            # Cancelled again until it ends: on Python 3.11 a cancel that lands as an ``asyncio.wait_for``
            # in the task finishes is lost (it returns the result), and the task went on beating while
            # the agent's stop waited for it, until the stop was killed (two full test runs, 2026-12-04;
            # the stack dump showed the task "cancelling" in its sleep between beats).
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
            self._task = None

    async def apply_answer(self, answer: Any) -> None:
        """The control plane answers a beat with this host's private-network peers: for every network
        with members here, the addresses of the other hosts that run members (drivers/net/bridges.py)."""
        overlay = answer.get("overlay") if isinstance(answer, dict) else None
        bridges = self.manager.bridges
        if not isinstance(overlay, dict) or bridges is None:
            return
        peers = {str(network): [str(a) for a in addresses] for network, addresses in overlay.items()}
        local = urlsplit(self.settings.advertised_url).hostname or self.settings.host
        try:
            await asyncio.to_thread(bridges.sync_overlay, peers, local)
        except Exception as exc:  # tried again on the next beat
            log.warning("overlay_sync_failed", error=str(exc))

    def note_summary_answer(self, url: str, answer: Any) -> None:
        """``hibernated_summary: ok`` lets the next beats to ``url`` leave the hibernated sandboxes out;
        anything else (``full``, or a control plane that does not know the summary) lists them."""
        if isinstance(answer, dict) and answer.get("hibernated_summary") == SUMMARY_OK:
            self._summarised.add(url)
        else:
            self._summarised.discard(url)

    def heartbeat_urls(self) -> list[str]:
        bases = [part.strip().rstrip("/") for part in self.settings.controlplane_url.split(",")]
        return [base + "/internal/v1/hosts/heartbeat" for base in bases if base]

    async def _run(self) -> None:
        urls = self.heartbeat_urls()
        headers = {"Authorization": f"Bearer {self.settings.token.get_secret_value()}"}
        current = 0
        async with httpx.AsyncClient(timeout=5.0, headers=headers) as http:
            while True:
                for attempt in range(len(urls)):
                    index = (current + attempt) % len(urls)
                    if await self.beat(http, urls[index]):
                        current = index
                        break
                await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def _refresh_usage(self) -> None:
        try:
            await self.manager.refresh_usage()
        except Exception as exc:  # counters are reported on a later beat
            log.warning("usage_read_failed", error=repr(exc))

    async def beat(self, http: httpx.AsyncClient, url: str) -> bool:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._refresh_usage(), name="usage-read")
        # Still reading after USAGE_WAIT_S: this beat reports the last counters, and the read goes on.
        # ``asyncio.wait``, not ``wait_for``: it neither cancels the read nor loses a cancel of this task.
        await asyncio.wait({self._refresh}, timeout=USAGE_WAIT_S)
        try:
            response = await http.post(url, json=self.payload(url))
            ok = response.status_code < 300
            problem = f"HTTP {response.status_code}"
            if ok:
                answer = response.json()
                self.note_summary_answer(url, answer)
                await self.apply_answer(answer)
        except httpx.HTTPError as exc:
            ok, problem = False, type(exc).__name__
        except Exception as exc:  # never let the loop die
            ok, problem = False, repr(exc)
        if ok:
            self.beats_sent += 1
            if not self._healthy:
                log.info("heartbeat_recovered", url=url)
        elif self._healthy:
            log.warning("heartbeat_failed", url=url, problem=problem)
        self._healthy = ok
        return ok
