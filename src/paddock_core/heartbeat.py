"""What a host agent's heartbeat and the control plane's answer share beyond plain fields: how the
hibernated sandboxes are summarised instead of listed (docs/hibernation.md, "At scale").

A beat carries ``hibernated: {"count", "digest"}``. A control plane that understands it answers
``hibernated_summary``: ``"ok"`` when the digest matches the hibernated sandboxes it holds on that host
(the agent's next beats to it leave them out of ``sandboxes``), or ``"full"`` to have them listed in
the next beat (so that one whose host no longer holds it, or one on a host that came back, is seen).
An agent that never hears either lists them all, as before; a control plane that never receives a
summary reads every reported row, as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

#: The control plane's answers (``hibernated_summary``).
SUMMARY_OK = "ok"
SUMMARY_FULL = "full"


def ids_digest(ids: Iterable[str]) -> str:
    """The same set of sandbox ids gives the same digest on both sides, in any order."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()
