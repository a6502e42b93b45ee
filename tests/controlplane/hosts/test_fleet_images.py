"""The images a create may ask for, across a fleet (issue #36): what the active hosts hold or can build,
each once, read as the distinct image lists (a create read every active host's row before); a dead or
draining host's images are not offered."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import async_sessionmaker

from paddock_controlplane.hosts import hosts
from paddock_controlplane.records.models import Host
from paddock_core.db import transaction

pytestmark = pytest.mark.db


async def test_the_fleets_images_are_those_of_its_active_hosts_each_once(
    sessions: async_sessionmaker,  # type: ignore[type-arg]
) -> None:
    now = dt.datetime.now(dt.UTC)
    lists = {
        "active": (["debian:13", "ubuntu:24.04"], ["devbox:1"]),
        "draining": (["alpine:3"], []),
        "dead": (["fedora:41"], ["devbox:2"]),
    }
    rows = []
    for index in range(60):  # most hosts hold the same images, in either order
        status = "draining" if index == 7 else "dead" if index == 8 else "active"
        rootfses, buildable = lists[status]
        if status == "active" and index % 2:
            rootfses = list(reversed(rootfses))
        if index == 9:
            rootfses, buildable = ["tpl_abc"], []
        rows.append(
            {
                "id": f"h-{index:03d}",
                "url": f"http://127.0.0.1:9/{index}",
                "status": status,
                "free_mib": 1024,
                "total_mib": 1024,
                "vm_count": 0,
                "rootfses": rootfses,
                "buildable": buildable,
                "labels": {},
                "drained": status == "draining",
                "last_heartbeat_at": now,
                "created_at": now,
            }
        )
    async with transaction(sessions) as session:
        await session.execute(insert(Host), rows)
    async with sessions() as session:
        assert await hosts.available_images(session) == {"debian:13", "ubuntu:24.04", "devbox:1", "tpl_abc"}
