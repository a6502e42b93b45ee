"""``client.networks`` and ``sandbox.join_network/leave_network`` on real sandboxes joined by a real
private network (bridge + veths on this machine); traffic between the members proves it.

Written once, in ``test_live_networks_async.py`` for the async client; ``scripts/unasync.py``
generates ``test_live_networks.py``, the same tests through the sync client.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

LISTEN = (
    "setsid perl -MIO::Socket::INET -e '"
    '$s = IO::Socket::INET->new(LocalAddr => "0.0.0.0", LocalPort => 7000, Listen => 4, ReuseAddr => 1)'
    ' or die; while ($c = $s->accept) { print $c "hello from " . `hostname`; close $c }'
    "' </dev/null >/dev/null 2>&1 &"
)


async def active_members(client: paddock.AsyncClient, network_id: str, count: int) -> dict[str, str]:
    """The members' overlay addresses once ``count`` of them are active (the host programs them)."""
    deadline = time.monotonic() + 30
    while True:
        members = (await client.networks.get(network_id)).members or []
        ready = {m.sandbox_id: m.ip for m in members if m.status == "active" and m.ip}
        if len(ready) == count or time.monotonic() > deadline:
            return ready
        await asyncio.sleep(0.2)


async def test_two_sandboxes_talk_over_a_private_network(live: LivePlatform) -> None:
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        network = await client.networks.create("lan")
        assert network.id.startswith("net_") and network.name == "lan" and network.member_count == 0
        async with (
            await client.sandboxes.create(
                "s-1vcpu-256mb", disk_mib=2048, name="alpha", networks=[{"id": network.id}]
            ) as alpha,
            await client.sandboxes.create("s-1vcpu-256mb", disk_mib=2048, name="beta") as beta,
        ):
            await beta.join_network(network.id)
            members = await active_members(client, network.id, 2)
            assert set(members) == {alpha.id, beta.id}
            assert members[alpha.id] != alpha.info.ip  # the overlay address, not the sandbox's own
            assert [n["id"] for n in (await beta.refresh()).networks] == [network.id]

            assert (await alpha.run("bash", ["-c", LISTEN])).ok
            dial = f"for i in $(seq 50); do exec 3<>/dev/tcp/{members[alpha.id]}/7000 && break; sleep 0.1; done; cat <&3"
            assert (await beta.run("bash", ["-c", dial])).stdout == "hello from alpha\n"

            assert [(n.id, n.member_count) for n in await client.networks.list()] == [(network.id, 2)]
            with pytest.raises(paddock.ConflictError) as in_use:
                await client.networks.delete(network.id)
            assert in_use.value.code == "IN_USE"
            await beta.leave_network(network.id)
            assert [m.sandbox_id for m in (await client.networks.get(network.id)).members or []] == [alpha.id]
            with pytest.raises(paddock.NotFoundError):
                await beta.leave_network(network.id)
            cut = await beta.run(
                "bash", ["-c", f"timeout 2 bash -c 'exec 3<>/dev/tcp/{members[alpha.id]}/7000'"]
            )
            assert cut.exit_code != 0
        await alpha.destroy(wait=True)
        await client.networks.delete(network.id)
        with pytest.raises(paddock.NotFoundError):
            await client.networks.get(network.id)
