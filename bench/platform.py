"""A live platform for a bench: one control plane and one host agent with production intervals, not the
test suite's fast ones (its 0.2 s reconciler loads the control plane and moves every number)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The control plane's intervals as deployed.
CONTROLPLANE_ENV = {"PADDOCK_CP_RECONCILE_INTERVAL_S": "1.0", "PADDOCK_CP_HOST_DEAD_AFTER_S": "15"}
#: The host agent's, likewise.
HOSTAGENT_ENV = {"PADDOCK_HOST_HEARTBEAT_INTERVAL_S": "2.0"}


def start(
    guest_dir: Path, *, pool_size: int, agent_env: dict[str, str] | None = None, **agent_options: Any
) -> Any:
    """``tests.live.start_platform`` with those intervals, ``pool_size`` warm slots, ``agent_env`` added
    to the agent's environment and any other agent option (``subnet`` …). Imported here, as bench.run
    does: the test helpers are heavy."""
    from tests.live import start_platform

    return start_platform(
        guest_dir,
        agents=1,
        cp_env=dict(CONTROLPLANE_ENV),
        agent_options={
            "pool_size": pool_size,
            **agent_options,
            "extra_env": {**HOSTAGENT_ENV, **(agent_env or {})},
        },
    )
