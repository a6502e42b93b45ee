"""A sandbox's status: the one enum, and the sets of statuses the rest of the control plane asks about.

The values are the contract's wire strings (§10.7), so a ``SandboxStatus`` compares equal to, and is
stored and rendered as, the plain string. Rows read from the database hold plain strings; rows this
process changed hold members of the enum; both compare the same.

Transitions (who makes them)::

    creating  → running | paused (start_paused) | failed      boot (lifecycle)
    forking   → running | paused | failed                      boot of a fork child (lifecycle)
    running   → pausing → paused | error                       pause (suspension)
    paused    → resuming → running | error, or paused again    resume (suspension; 503 no capacity)
    any live  → destroying → destroyed                         destroy / reclaim (destruction)
    ON_HOST   → error                                          its host died (reconcile_passes)
    error     → running | paused                               its host came back (host_reports)

How a change is recorded (transitional status, host call outside any transaction, outcome with its
webhook event) is :func:`paddock_controlplane.sandboxes.transition.settle`.
"""

from __future__ import annotations

from enum import StrEnum


class SandboxStatus(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    FORKING = "forking"
    ERROR = "error"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"
    FAILED = "failed"


S = SandboxStatus

#: Every status, as the plain wire strings (for filters and OpenAPI enums).
ALL: tuple[str, ...] = tuple(status.value for status in SandboxStatus)
#: A sandbox in one of these is gone for good: no host holds it, its memberships have ended.
TERMINAL: tuple[S, ...] = (S.DESTROYED, S.FAILED)
#: Terminal, or on its way there: nothing but a destroy is accepted.
CLOSED: tuple[S, ...] = (S.DESTROYING, *TERMINAL)
#: Statuses a sandbox leaves on its own; a long poll waits only while the sandbox is in one of them.
TRANSITIONAL: tuple[S, ...] = (S.CREATING, S.PAUSING, S.RESUMING, S.FORKING, S.DESTROYING)
#: On its way to ``running`` without anyone asking: a command waits for these (up to 30 s).
BECOMING_RUNNING: tuple[S, ...] = (S.CREATING, S.RESUMING, S.FORKING)
#: Running, or running without a further resume: these count toward the concurrent-sandbox cap.
TOWARD_RUNNING: tuple[S, ...] = (S.CREATING, S.RUNNING, S.RESUMING, S.FORKING)
#: Held by its host (booting included): a dead host turns these into ``error``.
ON_HOST: tuple[S, ...] = (S.CREATING, S.RUNNING, S.PAUSING, S.PAUSED, S.RESUMING, S.FORKING)
#: Booted and still on its host: egress and bandwidth changes are pushed there at once (a sandbox still
#: booting gets them when its boot is recorded).
BOOTED: tuple[S, ...] = (S.RUNNING, S.PAUSING, S.PAUSED, S.RESUMING)
#: What a heartbeat's report is folded into (``error`` may come back when its host does).
REPORTED: tuple[S, ...] = (S.RUNNING, S.PAUSED, S.ERROR)
#: On its way to ``running`` or ``paused`` by itself: an ingress request waits for it.
SETTLING: tuple[S, ...] = (S.CREATING, S.RESUMING, S.PAUSING, S.FORKING)
#: Holding memory on its host (a frozen sandbox keeps its memory; a destroy frees it when done).
HOLDING_MEMORY: tuple[S, ...] = (*ON_HOST, S.DESTROYING)
#: A fork copies a source in one of these.
FORKABLE: tuple[S, ...] = (S.RUNNING, S.PAUSED)
#: ``status_reason`` is shown only in these.
WITH_REASON: tuple[S, ...] = (S.ERROR, S.FAILED)
