"""Egress allowlists seen from inside real sandboxes made through the public API, against a fake internet.

Every rule form (host, host:port, *.host, ip, ip:port, cidr, cidr:port, and ``!`` before an address form
to deny it), live changes with PUT, name rules that cannot be bypassed by dialling an address, and
inbound connections that keep working.
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.network.conftest import create, fetch, sh
from tests.network.internet import FakeInternet

pytestmark = [pytest.mark.root, pytest.mark.slow]

CURL_DNS_FAILED = "error 6"


def test_an_open_sandbox_reaches_any_host_and_port(api: httpx.Client, internet: FakeInternet) -> None:
    sandbox = create(api)
    assert "egress" not in api.get(f"/v1/sandboxes/{sandbox['id']}").json()["data"]
    assert fetch(api, sandbox["id"], "api.example.test") == "api.example.test:80"
    assert fetch(api, sandbox["id"], "other.example.test", 8080) == "other.example.test:8080"
    assert fetch(api, sandbox["id"], internet.address("raw-c")) == "raw-c:80"


def test_host_port_rule_admits_that_port_only(api: httpx.Client, internet: FakeInternet) -> None:
    sandbox = create(api, egress=["API.example.test:80"])
    assert sandbox["egress"] == ["api.example.test:80"]
    sid = sandbox["id"]
    assert fetch(api, sid, "api.example.test") == "api.example.test:80"
    assert fetch(api, sid, "api.example.test", 8080).startswith("error"), "another port is refused"
    assert fetch(api, sid, "other.example.test") == CURL_DNS_FAILED, "a name without a rule does not resolve"
    lookup = sh(api, sid, "getent hosts other.example.test")
    assert lookup["exit_code"] != 0 and lookup["stdout"] == ""


def test_a_name_rule_cannot_be_bypassed_by_dialling_an_address(
    api: httpx.Client, internet: FakeInternet
) -> None:
    sid = create(api, egress=["api.example.test"])["id"]
    api_ip, other_ip = internet.address("api.example.test"), internet.address("other.example.test")
    # Before the sandbox's resolver answered the name, its address is as closed as any other.
    assert fetch(api, sid, api_ip).startswith("error")
    resolved = sh(api, sid, "getent hosts api.example.test")
    assert resolved["stdout"].split()[0] == api_ip
    assert fetch(api, sid, api_ip) == "api.example.test:80", "the answered address is admitted"
    assert fetch(api, sid, api_ip, 8080) == "api.example.test:8080", "a rule without a port admits all"
    assert fetch(api, sid, other_ip).startswith("error"), "an address nobody answered stays closed"
    # Asking another resolver (the fake internet's, dialled directly) is blocked too.
    direct = sh(
        api,
        sid,
        f"printf 'nameserver {internet.dns_upstream}\\noptions timeout:1 attempts:1\\n' > /etc/resolv.conf;"
        " getent hosts other.example.test",
    )
    assert direct["exit_code"] != 0 and other_ip not in direct["stdout"]


def test_wildcard_matches_subdomains_not_the_bare_domain(api: httpx.Client, internet: FakeInternet) -> None:
    sid = create(api, egress=["*.foo.test"])["id"]
    assert fetch(api, sid, "sub.foo.test") == "sub.foo.test:80"
    assert fetch(api, sid, "deep.sub.foo.test", 8080) == "deep.sub.foo.test:8080"
    assert fetch(api, sid, "foo.test") == CURL_DNS_FAILED
    assert fetch(api, sid, internet.address("foo.test")).startswith("error")


def test_ip_and_cidr_rules(api: httpx.Client, internet: FakeInternet) -> None:
    a, b = internet.address("raw-a"), internet.address("raw-b")
    sid = create(api, egress=[a, f"{b}:8080", internet.cidr])["id"]
    assert fetch(api, sid, a) == "raw-a:80"
    assert fetch(api, sid, a, 8080) == "raw-a:8080"
    assert fetch(api, sid, b, 8080) == "raw-b:8080"
    assert fetch(api, sid, b).startswith("error"), "ip:port admits that port only"
    assert fetch(api, sid, internet.address("cidr-in-1")) == "cidr-in-1:80"
    assert fetch(api, sid, internet.address("cidr-in-2"), 8080) == "cidr-in-2:8080"
    assert fetch(api, sid, internet.address("raw-c")).startswith("error"), "outside the CIDR"
    assert fetch(api, sid, "api.example.test") == CURL_DNS_FAILED, "no name rules: names do not resolve"


def test_put_egress_changes_a_running_sandbox_at_once(api: httpx.Client, internet: FakeInternet) -> None:
    sid = create(api)["id"]
    assert fetch(api, sid, "other.example.test") == "other.example.test:80"

    put = api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["api.example.test:80"]})
    assert put.status_code == 200, put.text
    assert put.json()["data"] == {"id": sid, "egress": ["api.example.test:80"]}
    assert fetch(api, sid, "api.example.test") == "api.example.test:80"
    assert fetch(api, sid, "other.example.test") == CURL_DNS_FAILED
    assert fetch(api, sid, internet.address("other.example.test")).startswith("error")

    inside = internet.address("cidr-in-1")
    api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": [f"{internet.cidr}:8080"]}).raise_for_status()
    assert api.get(f"/v1/sandboxes/{sid}/egress").json()["data"]["egress"] == [f"{internet.cidr}:8080"]
    assert fetch(api, sid, inside, 8080) == "cidr-in-1:8080"
    assert fetch(api, sid, inside).startswith("error"), "cidr:port admits that port only"
    assert fetch(api, sid, "api.example.test") == CURL_DNS_FAILED, "the earlier name rule is gone"

    api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["*"]}).raise_for_status()
    assert api.get(f"/v1/sandboxes/{sid}/egress").json()["data"]["egress"] == []
    assert fetch(api, sid, "other.example.test", 8080) == "other.example.test:8080"


def test_bad_rules_get_400_naming_the_rule(api: httpx.Client) -> None:
    sid = create(api)["id"]
    for rules, field in (
        (["api.example.test", "api.example.test:99999"], "egress[1]"),
        (["10.0.0.0/33"], "egress[0]"),
        (["ok.test", "*"], "egress[1]"),
        (["exa mple.test"], "egress[0]"),
    ):
        response = api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": rules})
        assert response.status_code == 400, response.text
        assert field in response.text, response.text
    response = api.post("/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "egress": ["a.test:0"]})
    assert response.status_code == 400 and "egress[0]" in response.text


def test_deny_rules_refuse_what_they_name_and_let_the_rest_out(
    api: httpx.Client, internet: FakeInternet
) -> None:
    """A list with deny rules (``!ip``, ``!cidr``, either with a port) lets everything out but what they
    name; an allow rule naming it too wins (E2B's ``allowOut`` over ``denyOut``), a name rule once the
    sandbox's resolver answered it; every name resolves."""
    a, b = internet.address("raw-a"), internet.address("raw-b")
    api_ip, inside, excepted = (internet.address(n) for n in ("api.example.test", "cidr-in-1", "cidr-in-2"))
    rules = [f"!{internet.cidr}", f"!{b}:8080", excepted, f"!{api_ip}", "api.example.test:8080"]
    sandbox = create(api, egress=[f" !{internet.cidr} ", *rules[1:]])
    assert sandbox["egress"] == rules
    sid = sandbox["id"]
    assert fetch(api, sid, a) == "raw-a:80", "what no rule names goes out"
    assert fetch(api, sid, "other.example.test", 8080) == "other.example.test:8080", "names resolve"
    assert fetch(api, sid, b) == "raw-b:80"
    assert fetch(api, sid, b, 8080).startswith("error"), "!ip:port denies that port only"
    assert fetch(api, sid, inside).startswith("error"), "inside the denied CIDR"
    assert fetch(api, sid, excepted) == "cidr-in-2:80", "an allowed address wins over its denied CIDR"
    assert fetch(api, sid, "api.example.test").startswith("error"), "resolved, and its address denied"
    assert fetch(api, sid, "api.example.test", 8080) == "api.example.test:8080", "its name rule wins on 8080"

    put = api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": [f"!{a}"]})
    assert put.status_code == 200 and put.json()["data"]["egress"] == [f"!{a}"], put.text
    assert fetch(api, sid, a).startswith("error")
    assert fetch(api, sid, inside) == "cidr-in-1:80", "the earlier deny rules are gone"
    assert fetch(api, sid, api_ip, 8080) == "api.example.test:8080"

    for bad, field in ((["!api.example.test"], "egress[0]"), ([f"!{a}", "!*"], "egress[1]")):
        refused = api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": bad})
        assert refused.status_code == 400 and field in refused.text, refused.text
        assert "only addresses and CIDR blocks can be denied" in refused.text, refused.text
    assert api.get(f"/v1/sandboxes/{sid}/egress").json()["data"]["egress"] == [f"!{a}"], "unchanged"


def test_fork_inherits_the_allowlist_or_takes_a_new_one(api: httpx.Client, internet: FakeInternet) -> None:
    source = create(api, egress=["api.example.test:80"])["id"]
    inherited = _fork(api, source, {})
    assert fetch(api, inherited, "api.example.test") == "api.example.test:80"
    assert fetch(api, inherited, "other.example.test") == CURL_DNS_FAILED
    replaced = _fork(api, source, {"egress": ["other.example.test"]})
    assert fetch(api, replaced, "other.example.test", 8080) == "other.example.test:8080"
    assert fetch(api, replaced, "api.example.test") == CURL_DNS_FAILED


def test_inbound_connections_work_under_an_allowlist(api: httpx.Client, internet: FakeInternet) -> None:
    sandbox = create(api, egress=["api.example.test:80"])
    server = (
        "use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalPort => 8000, Listen => 5, ReuseAddr => 1)"
        ' or die; while (my $c = $s->accept) { print $c "hello from inside\\n"; close $c }'
    )
    started = api.post(
        f"/v1/sandboxes/{sandbox['id']}/exec",
        json={"cmd": "bash", "args": ["-c", f"nohup perl -e '{server}' >/dev/null 2>&1 &"]},
    )
    assert started.status_code == 200, started.text
    # The host (where the ingress proxy runs) connects to the sandbox; the replies must pass.
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((sandbox["ip"], 8000), timeout=3) as conn:
                assert conn.recv(100) == b"hello from inside\n"
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _fork(api: httpx.Client, source: str, body: dict[str, object]) -> str:
    response = api.post(f"/v1/sandboxes/{source}/fork", json=body)
    assert response.status_code == 200, response.text
    child = str(response.json()["data"]["id"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = api.get(f"/v1/sandboxes/{child}").json()["data"]["status"]
        if status == "running":
            return child
        assert status == "forking", status
        time.sleep(0.2)
    raise AssertionError("fork did not finish")


def test_put_egress_on_a_paused_sandbox_holds_after_resume(api: httpx.Client) -> None:
    sid = create(api)["id"]
    assert api.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
    put = api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": ["other.example.test:8080"]})
    assert put.status_code == 200, put.text
    assert api.post(f"/v1/sandboxes/{sid}/resume").status_code == 200
    assert fetch(api, sid, "other.example.test", 8080) == "other.example.test:8080"
    assert fetch(api, sid, "api.example.test") == CURL_DNS_FAILED


def test_the_resolver_answers_over_tcp_too(api: httpx.Client, internet: FakeInternet) -> None:
    sid = create(api, egress=["api.example.test:80"])["id"]
    sh(api, sid, "echo 'options use-vc' >> /etc/resolv.conf")
    resolved = sh(api, sid, "getent hosts api.example.test")
    assert resolved["stdout"].split()[0] == internet.address("api.example.test")
    assert fetch(api, sid, "api.example.test") == "api.example.test:80"
    assert fetch(api, sid, "other.example.test") == CURL_DNS_FAILED


@pytest.fixture
def private_server(internet: FakeInternet) -> Iterator[str]:
    """An HTTP server at a private (RFC 1918) address beyond the host, as another machine of the
    operator's network would be: in the fake internet's namespace, routed from the host like it."""
    address = f"10.253.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
    inside = str(internet.subnet.network_address + 2)
    subprocess.run(["ip", "-n", internet.netns, "addr", "add", f"{address}/32", "dev", "eth0"], check=True)
    subprocess.run(["ip", "route", "add", f"{address}/32", "via", inside], check=True)
    server = subprocess.Popen(
        # nsenter, not ``ip netns exec``: no mount namespace of its own, whose copy of every host mount
        # would keep other tests' destroyed disks mounted (their loop devices bound) while it runs.
        [
            "nsenter",
            f"--net=/run/netns/{internet.netns}",
            "--",
            sys.executable,
            "-m",
            "http.server",
            "8000",
            "--bind",
            address,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # the host itself reaches it: what refuses a sandbox below is the sandbox's guard
            try:
                socket.create_connection((address, 8000), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the private server never listened"
                time.sleep(0.1)
        yield address
    finally:
        server.kill()
        server.wait()
        subprocess.run(["ip", "route", "del", f"{address}/32"], check=False)
        subprocess.run(
            ["ip", "-n", internet.netns, "addr", "del", f"{address}/32", "dev", "eth0"], check=False
        )


CURL_CONNECTION_REFUSED = "error 7"


def test_private_addresses_beyond_the_host_are_refused_whatever_the_allowlist(
    api: httpx.Client, internet: FakeInternet, private_server: str
) -> None:
    sid = create(api)["id"]
    assert fetch(api, sid, "api.example.test") == "api.example.test:80", (
        "an open sandbox reaches the internet"
    )
    # Refused at once by the host (a TCP reset: curl's 7), not lost on the way (a timeout would be 28).
    assert fetch(api, sid, private_server, 8000) == CURL_CONNECTION_REFUSED
    api.put(f"/v1/sandboxes/{sid}/egress", json={"egress": [private_server]}).raise_for_status()
    assert fetch(api, sid, private_server, 8000) == CURL_CONNECTION_REFUSED, (
        "no allowlist opens the operator's ranges"
    )


def test_no_sandbox_can_send_to_a_vxlan_port(api: httpx.Client, internet: FakeInternet) -> None:
    """Other hosts take VXLAN from this host's address, which a sandbox's packets leave with: one sent to
    4789 could inject frames into a private network there. The host refuses it (ICMP admin-prohibited,
    which the sandbox reads as "no route to host"); the next port goes through to the far end, which
    has nothing there (port unreachable: "connection refused")."""
    sid = create(api)["id"]
    target = internet.address("raw-a")
    script = "exec 3<>/dev/udp/{target}/{port}; echo x >&3; sleep 0.5; echo x >&3 && echo delivered"
    vxlan = sh(api, sid, script.format(target=target, port=4789))
    assert "No route to host" in vxlan["stderr"], vxlan
    other = sh(api, sid, script.format(target=target, port=4790))
    assert "Connection refused" in other["stderr"], other
