"""``paddock network …`` as a user runs it: a subprocess against the real platform (control plane and
host agent processes, runc sandboxes). Two sandboxes join a network by name, see each other over it,
are listed as its members, leave it, and the network is deleted."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.test_sandbox_cli import Cli
from tests.live import LivePlatform
from tests.sdk.test_live_networks_async import LISTEN

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def cli(live: LivePlatform) -> Cli:
    return Cli(live.url, live.api_key())


def test_create_attach_two_list_detach_rm(cli: Cli) -> None:
    boxes = ["net-a", "net-b"]
    for name in boxes:
        made = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048", "--name", name)
        assert isinstance(made, dict) and made["status"] == "running"
    network_id = ""
    try:
        made_net = cli.json("network", "create", "lab")
        assert isinstance(made_net, dict)
        network_id = made_net["id"]
        assert network_id.startswith("net_") and made_net["name"] == "lab" and made_net["member_count"] == 0
        plain = cli("network", "create", "scratch")  # without --json: the id alone, for net=$(…)
        assert plain.returncode == 0, plain.stderr.decode()
        scratch = plain.stdout.decode().strip()
        assert scratch.startswith("net_") and "\n" not in scratch

        # by the network's name, the sandboxes by theirs, --json after them
        ran = cli("network", "attach", "lab", *boxes, "--json")
        assert ran.returncode == 0, ran.stderr.decode()
        joined = json.loads(ran.stdout)
        assert [m["name"] for m in joined] == boxes
        assert {m["network_id"] for m in joined} == {network_id}
        assert all(m["status"] == "active" and m["ip"] for m in joined), joined
        ips = {m["name"]: m["ip"] for m in joined}
        assert ips["net-a"] != ips["net-b"]

        # the members reach each other on the overlay
        served = cli("sandbox", "exec", "net-b", "--", "bash", "-c", LISTEN)
        assert served.returncode == 0, served.stderr.decode()
        dial = (
            f"for i in $(seq 50); do exec 3<>/dev/tcp/{ips['net-b']}/7000 && break; sleep 0.1; done; cat <&3"
        )
        reached = cli("sandbox", "exec", "net-a", "--", "bash", "-c", dial)
        assert reached.returncode == 0 and reached.stdout.startswith(b"hello from"), reached.stderr.decode()

        listed = cli.json("network", "ls")
        assert isinstance(listed, list)
        counts = {n["id"]: n["member_count"] for n in listed}
        assert counts == {network_id: 2, scratch: 0}
        table = cli("network", "ls")
        assert table.returncode == 0 and network_id.encode() in table.stdout and b"lab" in table.stdout

        got = cli.json("network", "get", network_id)  # by id as well
        assert isinstance(got, dict)
        assert sorted((m["name"], m["ip"], m["status"]) for m in got["members"]) == [
            ("net-a", ips["net-a"], "active"),
            ("net-b", ips["net-b"], "active"),
        ]
        shown = cli("network", "get", "lab")
        assert shown.returncode == 0 and ips["net-b"].encode() in shown.stdout
        sandbox = cli.json("sandbox", "get", "net-a")
        assert isinstance(sandbox, dict)
        assert sandbox["networks"] == [{"id": network_id, "status": "active", "ip": ips["net-a"]}]
        assert f"{network_id} ({ips['net-a']})".encode() in cli("sandbox", "get", "net-a").stdout

        # attaching a member again changes nothing
        again = cli.json("network", "attach", "lab", "net-a")
        assert again == [j for j in joined if j["name"] == "net-a"]

        in_use = cli("network", "rm", "lab")
        assert in_use.returncode == 1 and b"in use" in in_use.stderr.lower(), in_use.stderr

        left = cli.json("network", "detach", "lab", "net-a")
        sandbox_a = cli.json("sandbox", "get", "net-a")
        assert isinstance(sandbox_a, dict)
        assert left == [{"network_id": network_id, "sandbox_id": sandbox_a["id"], "detached": True}]
        remaining = cli.json("network", "get", "lab")
        assert isinstance(remaining, dict)
        assert [m["name"] for m in remaining["members"]] == ["net-b"]
        assert sandbox_a["networks"] == []  # net-a is on no network now
        cut = f"timeout 2 bash -c 'exec 3<>/dev/tcp/{ips['net-b']}/7000'"
        assert cli("sandbox", "exec", "net-a", "--", "bash", "-c", cut).returncode != 0  # off the overlay
        assert cli("network", "detach", "lab", "net-a").returncode == 4  # not a member any more
        detached_b = cli("network", "detach", "lab", "net-b")
        assert detached_b.returncode == 0 and b"detached" in detached_b.stdout, detached_b.stderr

        removed = cli.json("network", "rm", "lab", scratch)
        assert removed == [{"id": network_id, "deleted": True}, {"id": scratch, "deleted": True}]
        network_id = ""
        assert cli.json("network", "ls") == []
        missing = cli("network", "get", "lab")
        assert missing.returncode == 4 and b"no network named 'lab'" in missing.stderr
    finally:
        if network_id:
            cli("network", "detach", network_id, *boxes)
            cli("network", "rm", network_id)
        cli("sandbox", "rm", *boxes)


def test_a_shared_name_is_refused_with_the_ids_and_create_joins_by_name(cli: Cli) -> None:
    first = cli.json("network", "create", "twin")
    second = cli.json("network", "create", "twin")  # names need not be unique (§11.12)
    assert isinstance(first, dict) and isinstance(second, dict)
    try:
        ambiguous = cli("network", "get", "twin")
        assert ambiguous.returncode == 2
        assert first["id"].encode() in ambiguous.stderr and second["id"].encode() in ambiguous.stderr
        refused = cli("sandbox", "create", "--shape", "s-1vcpu-256mb", "--network", "twin", "--name", "x")
        assert refused.returncode == 2 and cli.json("sandbox", "ls") == []  # nothing was created

        # joined at create, by the network's name once it names one network
        assert cli.json("network", "rm", second["id"]) == [{"id": second["id"], "deleted": True}]
        made = cli.json("sandbox", "create", "--shape", "s-1vcpu-256mb", "--disk-mib", "2048",
                        "--name", "born-in", "--network", "twin")  # fmt: skip
        assert isinstance(made, dict)
        try:
            deadline = time.monotonic() + 30  # a member joined at create is programmed as it boots
            while True:
                got = cli.json("network", "get", "twin")
                assert isinstance(got, dict)
                members = [(m["sandbox_id"], m["status"]) for m in got["members"]]
                if members != [(made["id"], "pending")] or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert members == [(made["id"], "active")]
        finally:
            cli("sandbox", "rm", "--wait", "born-in")
    finally:
        cli("network", "rm", first["id"])
        cli("network", "rm", second["id"])
