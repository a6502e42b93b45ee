"""Rows written straight into the database for the fleet's statement tests (many sandboxes, no boots)."""

from __future__ import annotations

import datetime as dt
from typing import Any


def host(
    host_id: str, beat: dt.datetime, *, free_mib: int, total_mib: int, url: str = "", status: str = "active"
) -> dict[str, Any]:
    """A host's row that last beat at ``beat``, reporting ``free_mib`` of ``total_mib`` free."""
    return {
        "id": host_id,
        "url": url or f"http://127.0.0.1:9/{host_id}",
        "status": status,
        "free_mib": free_mib,
        "total_mib": total_mib,
        "vm_count": 0,
        "rootfses": ["debian:13"],
        "buildable": [],
        "labels": {},
        "drained": False,
        "last_heartbeat_at": beat,
        "created_at": beat,
    }


def running_sandbox(
    sandbox_id: str,
    user_id: str,
    host_id: str,
    created_at: dt.datetime,
    *,
    mem_mib: int = 1024,
    shape: str = "s-1vcpu-1gb",
) -> dict[str, Any]:
    """A running sandbox's row on ``host_id``, holding ``mem_mib`` there (the fleet simulation's rows,
    ``bench/fleet_sim.py``, are these with what a create and a billing pass add)."""
    return {
        "id": sandbox_id,
        "user_id": user_id,
        "name": sandbox_id,
        "status": "running",
        "host_id": host_id,
        "shape": shape,
        "rootfs": "debian:13",
        "vcpu": 1,
        "mem_mib": mem_mib,
        "disk_mib": 2048,
        "region": "eu",
        "egress": [],
        "env_keys": [],
        "ssh_pubkeys": [],
        "node_selector": {},
        "created_at": created_at,
    }
