"""The two readers of egress rules agree on one table of cases.

The control plane validates and normalises what users send (``paddock_controlplane.records.validation``); the
host agent parses the normalised rules into its firewall and resolver policy
(``paddock_hostagent.drivers.net.egress_rules.EgressPolicy``). Every rule the control plane accepts must be one
the host agent can install, and every rule it refuses the host agent refuses too, so neither side can
drift from the other unnoticed. A new rule form is added here, for both.
"""

from __future__ import annotations

import pytest

from paddock_controlplane.records import validation
from paddock_core.errors import ValidationFailed
from paddock_hostagent.drivers.net.egress_rules import EgressPolicy, EgressRuleError

#: what a user writes → what the control plane sends the host (the normalised rule).
ACCEPTED: dict[str, str] = {
    "api.example.com:443": "api.example.com:443",
    "API.Example.COM": "api.example.com",
    "example.com.": "example.com",
    " spaced.test ": "spaced.test",
    "*.foo.test": "*.foo.test",
    "bare.test": "bare.test",
    "1.2.3.4": "1.2.3.4",
    "1.2.3.5:80": "1.2.3.5:80",
    "10.0.0.0/8": "10.0.0.0/8",
    "10.1.2.3/16": "10.1.0.0/16",
    "192.168.0.0/24:5432": "192.168.0.0/24:5432",
    "1.2.3.4/24:443": "1.2.3.0/24:443",
    "[2001:db8::1]:443": "[2001:db8::1]:443",
    "2001:db8::/32": "2001:db8::/32",
    "2001:db8::1": "2001:db8::1",
    "!1.2.3.4": "!1.2.3.4",
    "! 10.1.2.3/16:25": "!10.1.0.0/16:25",
    "!198.51.100.7:443": "!198.51.100.7:443",
    "![2001:db8::1]:443": "![2001:db8::1]:443",
    "!2001:db8::/32": "!2001:db8::/32",
}

#: rules both sides refuse.
REFUSED: list[str] = [
    "",
    "example.com:0",
    "example.com:65536",
    "example.com:http",
    "1.2.3.4:99999",
    "10.0.0.0/8:0",
    "10.0.0.0/33",
    "*.com",
    "foo.*.com",
    "*example.com",
    "*.*.test",
    "-bad.test",
    "bad-.test",
    "a..b",
    "under_score.test",
    "ünï.test",
    "a" * 64 + ".test",
    "host:1:2",
    "x.test:443:1",
    "[2001:db8::1]",
    "[nope]:443",
    "!",
    "!example.com",
    "!*.foo.test",
    "!example.com:443",
    "!1.2.3.4:0",
    "!10.0.0.0/33",
    "!!1.2.3.4",
    "!*",
]


@pytest.mark.parametrize(("raw", "normalised"), ACCEPTED.items())
def test_a_rule_the_control_plane_accepts_is_one_the_host_installs(raw: str, normalised: str) -> None:
    assert validation.egress_rule(raw, "egress[0]") == normalised
    assert not EgressPolicy.parse([normalised]).open
    assert not EgressPolicy.parse([raw]).open  # the host reads the user's spelling the same way


@pytest.mark.parametrize("raw", REFUSED)
def test_a_rule_the_control_plane_refuses_the_host_refuses_too(raw: str) -> None:
    with pytest.raises(ValidationFailed):
        validation.egress_rule(raw, "egress[0]")
    with pytest.raises(EgressRuleError):
        EgressPolicy.parse([raw])


def test_allow_all_means_the_same_on_both_sides() -> None:
    assert validation.egress_rules(["*"]) == [] and validation.egress_rules([]) == []
    assert EgressPolicy.parse([]).open and EgressPolicy.parse(["*"]).open
    with pytest.raises(ValidationFailed):
        validation.egress_rules(["*", "example.com"])
    with pytest.raises(EgressRuleError):
        EgressPolicy.parse(["example.com", "*"])
