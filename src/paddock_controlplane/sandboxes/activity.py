"""Activity for idle auto-pause: what this process saw a sandbox do, read by the reconciler's idle pass.

Commands, file transfers and ingress requests count (a command in flight keeps a sandbox busy however
long it runs); the host's own report adds what happened inside the sandbox (``host_reports``).
"""

from __future__ import annotations

from paddock_controlplane.records.services import Services


def touch(services: Services, sandbox_id: str) -> None:
    """Record activity now."""
    services.activity.last_seen_s[sandbox_id] = services.clock().timestamp()


class Inflight:
    """Counts commands and transfers in flight per sandbox; a running command is activity."""

    def __init__(self, services: Services, sandbox_id: str) -> None:
        self.counts = services.activity.inflight
        self.services = services
        self.sandbox_id = sandbox_id

    def __enter__(self) -> None:
        self.counts[self.sandbox_id] = self.counts.get(self.sandbox_id, 0) + 1
        touch(self.services, self.sandbox_id)

    def __exit__(self, *_: object) -> None:
        self.counts[self.sandbox_id] -= 1
        if not self.counts[self.sandbox_id]:
            del self.counts[self.sandbox_id]
        touch(self.services, self.sandbox_id)
