"""The host agent's reading of allowlist rules (drivers/net/egress_rules.py) and what its resolver allows."""

from __future__ import annotations

import ipaddress

import pytest

from paddock_hostagent.drivers.net.egress_rules import EgressPolicy, EgressRuleError


def test_every_rule_form_is_read() -> None:
    policy = EgressPolicy.parse(
        [
            "api.example.com:443",
            "*.foo.test",
            "bare.test",
            "1.2.3.4",
            "1.2.3.5:80",
            "10.0.0.0/8",
            "10.1.0.0/16",
            "192.168.0.0/24:5432",
            "[2001:db8::1]:443",
            "2001:db8::/32",
        ]
    )
    assert not policy.open
    assert policy.networks == (ipaddress.IPv4Network("1.2.3.4/32"), ipaddress.IPv4Network("10.0.0.0/8"))
    assert policy.network_ports == (
        (ipaddress.IPv4Network("1.2.3.5/32"), 80),
        (ipaddress.IPv4Network("192.168.0.0/24"), 5432),
    )
    assert policy.name_ports("api.example.com") == (False, {443})
    assert policy.name_ports("API.example.com.") == (False, {443})
    assert policy.name_ports("x.api.example.com") is None
    assert policy.name_ports("a.foo.test") == (True, set())
    assert policy.name_ports("a.b.foo.test") == (True, set())
    assert policy.name_ports("foo.test") is None, "*.host matches subdomains only"
    assert policy.name_ports("bare.test") == (True, set())
    assert policy.name_ports("sub.bare.test") is None


@pytest.mark.parametrize("rules", [[], ["*"]])
def test_empty_or_star_is_open(rules: list[str]) -> None:
    assert EgressPolicy.parse(rules).open


@pytest.mark.parametrize("rule", ["a.test:0", "a.test:70000", "bad host", "1.2.3.4/40:80", "*", "[::1]"])
def test_bad_rules_are_refused_naming_them(rule: str) -> None:
    with pytest.raises(EgressRuleError) as caught:
        EgressPolicy.parse(["ok.test", rule])
    assert caught.value.rule == rule


def test_deny_rules_make_a_denylist_whose_allow_rules_are_its_exceptions() -> None:
    policy = EgressPolicy.parse(
        ["!10.0.0.0/8", "!10.9.0.0/16", "!192.0.2.7:25", "10.1.2.3", "api.test", "!::1"]
    )
    assert not policy.open and policy.denylist
    assert policy.denied_networks == (ipaddress.IPv4Network("10.0.0.0/8"),), "collapsed"
    assert policy.denied_network_ports == ((ipaddress.IPv4Network("192.0.2.7/32"), 25),)
    assert policy.networks == (ipaddress.IPv4Network("10.1.2.3/32"),)
    assert policy.name_ports("api.test") == (True, set())
    assert (
        policy.name_ports("other.test") is None
    )  # the resolver still answers it: a denylist's names resolve
    assert not EgressPolicy.parse(["10.1.2.3", "api.test"]).denylist, "allow rules alone: an allowlist"
    assert EgressPolicy.parse(["![2001:db8::1]:443"]).denylist, (
        "an IPv6 deny matches nothing, but says denylist"
    )


@pytest.mark.parametrize("rule", ["!api.test", "!*.foo.test", "!api.test:443", "!1.2.3.4:0", "!"])
def test_only_addresses_can_be_denied(rule: str) -> None:
    with pytest.raises(EgressRuleError) as caught:
        EgressPolicy.parse(["!1.2.3.4", rule])
    assert caught.value.rule == rule
