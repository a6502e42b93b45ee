"""A snapshot across machines (issue #34, docs/snapshots.md "Where it lives"): a boot from it goes to the
host that keeps it while that host takes sandboxes; once it does not (drained here), another host
fetches the snapshot's disk from it over the agents' own transfer and boots the copy with its files.
Deleting the snapshot removes the copies too."""

from __future__ import annotations

import httpx

from tests.hostagent.conftest import TOKEN
from tests.multihost.harness import Cluster
from tests.multihost.support import create_ok, destroy_many, exec_ok, host_of, machines

HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def kept_on(cluster: Cluster, snapshot_id: str) -> set[str]:
    """The machines whose disk store holds the snapshot (whole; a partial one is no snapshot)."""
    return {
        machine.host_id
        for machine in machines(cluster)
        if (machine.state_dir / "disks" / "snapshots" / snapshot_id / "meta.json").is_file()
    }


def test_a_snapshot_taken_on_one_host_boots_on_another_with_its_files(cluster: Cluster) -> None:
    key = cluster.api_key(plan="enterprise", credits=5000)
    first = machines(cluster)[0].host_id
    made: list[str] = []
    snapshot_id = ""
    drained = False
    try:
        with cluster.http(key) as http:
            source = create_ok(http, host_id=first)
            made.append(source["id"])
            blob_sum = exec_ok(
                http,
                source["id"],
                "head -c 3000000 /dev/urandom > /root/blob; echo kept > /root/kept.txt;"
                " sha256sum /root/blob | cut -c1-64",
            )
            taken = http.post(f"/v1/sandboxes/{source['id']}/snapshots", json={"name": "travels"})
            assert taken.status_code == 200, taken.text
            snapshot_id = taken.json()["data"]["id"]
            assert kept_on(cluster, snapshot_id) == {first}

            # While its host takes sandboxes, a boot from it goes there: no copy is made.
            home = create_ok(http, rootfs=snapshot_id)
            made.append(home["id"])
            assert host_of(cluster, home["id"]) == first
            assert kept_on(cluster, snapshot_id) == {first}

            drain = httpx.post(f"{cluster.cp_url(0)}/internal/v1/hosts/{first}/drain", headers=HEADERS)
            assert drain.status_code == 200, drain.text
            drained = True
            away = create_ok(http, rootfs="travels")
            made.append(away["id"])
            elsewhere = host_of(cluster, away["id"])
            assert elsewhere != first
            assert kept_on(cluster, snapshot_id) == {first, elsewhere}  # fetched, and kept
            assert exec_ok(http, away["id"], "sha256sum /root/blob | cut -c1-64") == blob_sum
            assert exec_ok(http, away["id"], "cat /root/kept.txt") == "kept\n"
            assert exec_ok(http, away["id"], "hostname") == away["name"] + "\n"
            # The copy boots again there, and each copy goes its own way.
            again = create_ok(http, rootfs=snapshot_id, host_id=elsewhere)
            made.append(again["id"])
            exec_ok(http, away["id"], "echo changed > /root/kept.txt")
            assert exec_ok(http, again["id"], "cat /root/kept.txt") == "kept\n"

            deleted = http.delete(f"/v1/snapshots/{snapshot_id}")
            assert deleted.status_code == 200, deleted.text
            assert kept_on(cluster, snapshot_id) == set()  # the fetched copy goes with it
            snapshot_id = ""
            assert exec_ok(http, away["id"], "sha256sum /root/blob | cut -c1-64") == blob_sum
    finally:
        if drained:
            httpx.delete(f"{cluster.cp_url(0)}/internal/v1/hosts/{first}/drain", headers=HEADERS)
        if snapshot_id:
            with cluster.http(key) as http:
                http.delete(f"/v1/snapshots/{snapshot_id}")
        destroy_many(cluster, key, made)
