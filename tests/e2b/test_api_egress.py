"""E2B's egress fields on Paddock's egress allowlist, through the unmodified ``e2b`` SDK configured only by
the three variables, against a fake internet in a network namespace this module makes
(tests/network/internet.py; no packet leaves the machine): ``deny_out=[ALL_TRAFFIC]`` with ``allow_out``
lets a sandbox reach the address allowed and not another, which an open sandbox reaches; a deny of
everything with nothing allowed reaches neither; ``get_info()`` shows the lists; ``dns_servers`` are
reached wholly when ``allow_out`` names a domain (E2B's 8.8.8.8 when left out); a ``deny_out`` of some
addresses only denies those and lets the rest out, an ``allow_out`` entry winning over it; a field Paddock
does not serve (``egress_proxy``, ``rules``) is a 501 in E2B's shape naming the field, and a malformed entry a
400. Before, every egress field was a 501, and ``dns_servers`` and a partial ``deny_out`` were until served.
``update_network`` replaces the list on a running sandbox the same way (before: a 501)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from e2b import ALL_TRAFFIC, Sandbox, SandboxException, SandboxNotFoundException
from tests.e2b.conftest import E2bPlatform
from tests.network.internet import FakeInternet

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    with FakeInternet() as fake:
        yield fake


def _fetch(sandbox: Sandbox, address: str, *, max_time: int = 3) -> str:
    """What ``curl http://address/`` printed in the sandbox, or ``error <curl's exit code>``. A fetch
    expected to pass waits longer: on a loaded CI box 3 s was once too short for an allowed one."""
    out = sandbox.commands.run(
        f'curl -sS --max-time {max_time} http://{address}/; echo "|rc=$?"'
    ).stdout.strip()
    body, _, code = out.rpartition("|rc=")
    return body if code == "0" else f"error {code}"


def test_allow_out_and_deny_out_are_the_allowlist(e2b_env: E2bPlatform, internet: FakeInternet) -> None:
    allowed, other = internet.address("raw-a"), internet.address("raw-b")
    made: list[Sandbox] = []
    try:
        listed = Sandbox.create(network={"allow_out": [allowed], "deny_out": [ALL_TRAFFIC]}, timeout=300)
        made.append(listed)
        closed = Sandbox.create(network={"deny_out": [ALL_TRAFFIC]}, timeout=300)
        made.append(closed)
        open_one = Sandbox.create(network={"allow_out": [allowed]}, timeout=300)  # nothing denied
        made.append(open_one)

        assert _fetch(listed, allowed, max_time=20) == "raw-a:80"
        assert _fetch(listed, other).startswith("error")
        assert _fetch(closed, allowed).startswith("error") and _fetch(closed, other).startswith("error")
        # the fake internet answers whom no rule stops
        assert _fetch(open_one, other, max_time=20) == "raw-b:80"

        network = listed.get_info().network or {}
        assert network.get("allow_out") == [allowed] and network.get("deny_out") == [ALL_TRAFFIC], network
        assert (closed.get_info().network or {}).get("allow_out") == []
        assert "allow_out" not in (open_one.get_info().network or {})
        with e2b_env.platform.http(e2b_env.api_key) as native:  # the same list /v1 shows and changes
            view = native.get(f"/v1/sandboxes/{listed.sandbox_id}").json()["data"]
            assert view["egress"] == [allowed], view
            put = native.put(f"/v1/sandboxes/{listed.sandbox_id}/egress", json={"egress": [other]})
            assert put.status_code == 200, put.text
        assert _fetch(listed, other, max_time=20) == "raw-b:80"
        assert _fetch(listed, allowed).startswith("error")
        assert (listed.get_info().network or {}).get("allow_out") == [other]
    finally:
        for sandbox in made:
            sandbox.kill()


def test_a_domain_is_allowed_through_the_resolver(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create(
        network={"allow_out": ["api.example.test", "*.pypi.org"], "deny_out": [ALL_TRAFFIC]}, timeout=300
    )
    try:
        with e2b_env.platform.http(e2b_env.api_key) as native:
            view = native.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]
        # A domain allowed lets the sandbox reach E2B's default DNS server too (no packet is sent to it).
        assert view["egress"] == ["api.example.test", "*.pypi.org", "8.8.8.8"], view
    finally:
        sandbox.kill()


def test_dns_servers_are_reached_wholly_when_a_domain_is_allowed(
    e2b_env: E2bPlatform, internet: FakeInternet
) -> None:
    allowed, server = internet.address("raw-a"), internet.address("raw-b")
    made: list[Sandbox] = []
    try:
        with_domain = Sandbox.create(
            network={
                "allow_out": ["api.example.test", allowed],
                "deny_out": [ALL_TRAFFIC],
                "dns_servers": [server],
            },
            timeout=300,
        )
        made.append(with_domain)
        none_listed = Sandbox.create(
            network={
                "allow_out": ["api.example.test", allowed],
                "deny_out": [ALL_TRAFFIC],
                "dns_servers": [],
            },
            timeout=300,
        )
        made.append(none_listed)
        no_domain = Sandbox.create(
            network={"allow_out": [allowed], "deny_out": [ALL_TRAFFIC], "dns_servers": [server]}, timeout=300
        )
        made.append(no_domain)

        assert _fetch(with_domain, server, max_time=20) == "raw-b:80"  # all traffic to it, not only DNS
        assert _fetch(with_domain, allowed, max_time=20) == "raw-a:80"
        assert _fetch(none_listed, allowed, max_time=20) == "raw-a:80"
        assert _fetch(none_listed, server).startswith("error")
        assert _fetch(no_domain, server).startswith("error")  # E2B: only beside a domain
        with e2b_env.platform.http(e2b_env.api_key) as native:
            view = native.get(f"/v1/sandboxes/{with_domain.sandbox_id}").json()["data"]
            assert view["egress"] == ["api.example.test", allowed, server], view

        # update_network takes it the same way, and leaving it out again is E2B's default.
        none_listed.update_network(
            {"allow_out": ["api.example.test"], "deny_out": [ALL_TRAFFIC], "dns_servers": [server]}
        )
        assert _fetch(none_listed, server, max_time=20) == "raw-b:80"
        assert _fetch(none_listed, allowed).startswith("error")
        none_listed.update_network({"allow_out": ["api.example.test"], "deny_out": [ALL_TRAFFIC]})
        assert _fetch(none_listed, server).startswith("error")
        with e2b_env.platform.http(e2b_env.api_key) as native:
            view = native.get(f"/v1/sandboxes/{none_listed.sandbox_id}").json()["data"]
            assert view["egress"] == ["api.example.test", "8.8.8.8"], view
    finally:
        for sandbox in made:
            sandbox.kill()


def test_deny_out_of_some_addresses_denies_those_and_allow_out_wins_over_it(
    e2b_env: E2bPlatform, internet: FakeInternet
) -> None:
    """E2B's "deny specific IPs only": everything but ``deny_out`` goes out, and an ``allow_out`` entry
    naming a denied address wins, as on E2B; ``get_info()`` shows both lists as given, and
    ``update_network`` replaces them. Before, a 501."""
    a, b = internet.address("raw-a"), internet.address("raw-b")
    inside, excepted = internet.address("cidr-in-1"), internet.address("cidr-in-2")
    sandbox = Sandbox.create(network={"deny_out": [b, internet.cidr], "allow_out": [excepted]}, timeout=300)
    try:
        assert _fetch(sandbox, a, max_time=20) == "raw-a:80", "what is not denied goes out"
        assert _fetch(sandbox, excepted, max_time=20) == "cidr-in-2:80", "allow_out wins"
        assert _fetch(sandbox, b).startswith("error") and _fetch(sandbox, inside).startswith("error")
        network = sandbox.get_info().network or {}
        assert network.get("deny_out") == [b, internet.cidr] and network.get("allow_out") == [excepted], (
            network
        )
        with e2b_env.platform.http(e2b_env.api_key) as native:
            view = native.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]
            assert view["egress"] == [excepted, f"!{b}", f"!{internet.cidr}"], view

        sandbox.update_network({"deny_out": [a]})
        assert _fetch(sandbox, a).startswith("error")
        assert (
            _fetch(sandbox, b, max_time=20) == "raw-b:80"
            and _fetch(sandbox, inside, max_time=20) == "cidr-in-1:80"
        )
        network = sandbox.get_info().network or {}
        assert network.get("deny_out") == [a] and network.get("allow_out") == [], network
    finally:
        sandbox.kill()


def test_network_fields_not_served_are_refused_in_e2b_shape(e2b_env: E2bPlatform) -> None:
    before = len(Sandbox.list().next_items())
    for network, field in (
        ({"deny_out": [ALL_TRAFFIC], "egress_proxy": {"address": "192.0.2.1:1080"}}, "network.egressProxy"),
        ({"rules": {"example.test": [{"transform": {"headers": {"X-A": "b"}}}]}}, "network.rules"),
    ):
        with pytest.raises(SandboxException, match=field.replace("[", r"\[")) as refused:
            Sandbox.create(network=network, timeout=60)  # type: ignore[arg-type]
        assert getattr(refused.value, "status_code", 501) == 501, (network, refused.value)
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}, timeout=60) as api:
        for network, field in (
            ({"allowOut": ["not a host!"], "denyOut": [ALL_TRAFFIC]}, "network.allowOut[0]"),
            ({"denyOut": ["example.test"]}, "network.denyOut[0]"),
            ({"denyOut": [7]}, "network.denyOut"),
            (
                {"allowOut": ["example.test"], "denyOut": [ALL_TRAFFIC], "dnsServers": ["1.1.1.0/24"]},
                "network.dnsServers[0]",
            ),
            ({"denyOut": [ALL_TRAFFIC], "dnsServers": ["2001:db8::53"]}, "network.dnsServers[0]"),
            (
                {"denyOut": [ALL_TRAFFIC], "dnsServers": [f"192.0.2.{i}" for i in range(11)]},
                "network.dnsServers",
            ),
        ):
            answer = api.post("/sandboxes", json={"templateID": "base", "network": network})
            assert answer.status_code == 400 and answer.json()["code"] == 400, answer.text
            assert answer.json()["message"].startswith(field), (network, answer.text)
    assert len(Sandbox.list().next_items()) == before


def test_update_network_replaces_the_allowlist_of_a_running_sandbox(
    e2b_env: E2bPlatform, internet: FakeInternet
) -> None:
    allowed, other = internet.address("raw-a"), internet.address("raw-b")
    sandbox = Sandbox.create(timeout=300)
    try:
        assert _fetch(sandbox, other, max_time=20) == "raw-b:80"  # open, as created

        sandbox.update_network({"allow_out": [allowed], "deny_out": [ALL_TRAFFIC]})
        assert _fetch(sandbox, allowed, max_time=20) == "raw-a:80"
        assert _fetch(sandbox, other).startswith("error")
        network = sandbox.get_info().network or {}
        assert network.get("allow_out") == [allowed] and network.get("deny_out") == [ALL_TRAFFIC], network

        sandbox.update_network({"allow_internet_access": False})  # E2B's deny of everything
        assert _fetch(sandbox, allowed).startswith("error") and _fetch(sandbox, other).startswith("error")
        assert (sandbox.get_info().network or {}).get("allow_out") == []

        # What Paddock does not serve is refused, in E2B's shape, and the list stays as it was.
        with pytest.raises(SandboxException, match="rules") as refused:
            sandbox.update_network(
                {
                    "deny_out": ["198.18.0.0/15"],
                    "rules": {"example.test": [{"transform": {"headers": {"X-A": "b"}}}]},
                }
            )
        assert getattr(refused.value, "status_code", 501) == 501, refused.value
        with httpx.Client(
            base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}, timeout=60
        ) as api:
            path = f"/sandboxes/{sandbox.sandbox_id}/network"
            answer = api.put(path, json={"denyOut": [ALL_TRAFFIC], "dnsServers": ["not an address"]})
            assert answer.status_code == 400 and answer.json()["message"].startswith("dnsServers[0]"), (
                answer.text
            )
            answer = api.put(path, json={"allowOut": ["not a host!"], "denyOut": [ALL_TRAFFIC]})
            assert answer.status_code == 400 and answer.json()["message"].startswith("allowOut[0]"), (
                answer.text
            )
            answer = api.put(path, json={"denyOut": "0.0.0.0/0"})
            assert answer.status_code == 400 and "denyOut" in answer.json()["message"], answer.text
        assert (sandbox.get_info().network or {}).get("allow_out") == []
        assert _fetch(sandbox, other).startswith("error")

        # An update that leaves everything out clears the rules (the static form, by id).
        Sandbox.update_network(sandbox.sandbox_id, {})
        assert _fetch(sandbox, other, max_time=20) == "raw-b:80"
        assert "allow_out" not in (sandbox.get_info().network or {})
    finally:
        sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.update_network(sandbox.sandbox_id, {"deny_out": [ALL_TRAFFIC]})
