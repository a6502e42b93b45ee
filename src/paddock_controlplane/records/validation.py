"""Field rules shared by create, fork, PATCH and the per-resource endpoints (§11.3).

Each function returns the normalised value or raises :class:`paddock_core.errors.ValidationFailed`
naming the wire field (``egress[2]``, ``ssh_pubkeys[0]``); the caller passes the field's name when it is
not the usual one, and the error handler renders the 400.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re

from paddock_core.errors import ValidationFailed

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOST_LABEL_RE = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
MAX_ENV_KEYS = 64
MAX_ENV_VALUE_BYTES = 4096
MAX_ENV_TOTAL_BYTES = 65536
AUTO_PAUSE_RANGE = (60, 86400)
MIN_DISK_MIB = 1024
# cmd + args + env of one exec. The kernel refuses a bigger command line anyway (ARG_MAX is 2 MiB with
# the usual 8 MiB stack), and the guest agent hangs up on an exec request over 4 MiB; bulk input goes
# in stdin, which is streamed to the command and has no such limit.
MAX_EXEC_COMMAND_BYTES = 2 << 20
# Linux: NAME_MAX bytes per path component, PATH_MAX bytes (with the terminating NUL) per path.
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4096
SSH_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)


def sandbox_name(value: str, field: str = "name") -> str:
    if not NAME_RE.match(value):
        raise ValidationFailed.field(field, "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    if value.startswith("sb-"):
        raise ValidationFailed.field(field, "must not start with 'sb-' (reserved for sandbox ids)")
    return value


def _port(text: str, field: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValidationFailed.field(field, f"port {text!r} must be 1-65535")
    return int(text)


def _hostname(text: str, field: str) -> str:
    host = text.lower().rstrip(".")
    labels = host.split(".")
    if len(host) > 253 or len(labels) < 1 or not all(HOST_LABEL_RE.match(label) for label in labels):
        raise ValidationFailed.field(field, f"{text!r} is not a valid host name")
    return host


#: Rules a sandbox's egress list holds at most (isolation rule 5): each is an element of the host's shared
#: nftables sets, which every sandbox's changes on that host pay for.
MAX_EGRESS_RULES = 1024
#: What a rule starts with to deny the addresses it names (docs/egress.md, "Denying some addresses").
EGRESS_DENY = "!"


def egress_rule(raw: str, field: str) -> str:
    """One rule: host, host:port, *.host, ip, ip:port, cidr, cidr:port, [v6]:port; or ``!`` and one of
    the address forms, which denies it."""
    rule = raw.strip()
    if rule.startswith(EGRESS_DENY):
        denied = _allow_rule(rule[1:].strip(), field)
        if denied == "*" or not _names_addresses(denied):
            raise ValidationFailed.field(
                field,
                f"{rule!r}: only addresses and CIDR blocks can be denied (a name's address can be dialled)",
            )
        return EGRESS_DENY + denied
    return _allow_rule(rule, field)


def _names_addresses(rule: str) -> bool:
    """Whether a normalised rule names addresses (ip, cidr, [v6], either with a port), not host names."""
    host = rule.rpartition(":")[0] if rule.count(":") == 1 else rule
    if host.startswith("["):
        return True
    try:
        ipaddress.ip_network(host, strict=False)
    except ValueError:
        return False
    return True


def _allow_rule(rule: str, field: str) -> str:
    if not rule:
        raise ValidationFailed.field(field, "empty rule")
    if rule == "*":
        return rule
    if rule.startswith("["):
        addr, sep, port = rule[1:].partition("]:")
        if not sep:
            raise ValidationFailed.field(field, "IPv6 with a port is written [addr]:port")
        try:
            address = ipaddress.IPv6Address(addr).compressed
        except ipaddress.AddressValueError:
            raise ValidationFailed.field(field, f"{addr!r} is not an IPv6 address") from None
        return f"[{address}]:{_port(port, field)}"
    if "/" in rule:
        network, port = rule, ""
        if rule.count(":") == 1 or (rule.count(":") > 1 and rule.rsplit(":", 1)[1].isdigit() and "." in rule):
            network, _, port = rule.rpartition(":")
        try:
            net = ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ValidationFailed.field(field, f"{rule!r} is not a valid CIDR") from None
        return f"{net.with_prefixlen}:{_port(port, field)}" if port else net.with_prefixlen
    try:
        return ipaddress.ip_address(rule).compressed
    except ValueError:
        pass
    host, port = rule, ""
    if ":" in rule:
        host, _, port = rule.rpartition(":")
        try:
            address = ipaddress.IPv4Address(host).compressed
        except ipaddress.AddressValueError:
            pass
        else:
            return f"{address}:{_port(port, field)}"
    wildcard = host.startswith("*.")
    name = _hostname(host[2:] if wildcard else host, field)
    if "*" in name:
        raise ValidationFailed.field(field, "'*' is allowed only as a leading '*.' label")
    if wildcard and "." not in name:
        raise ValidationFailed.field(field, "'*.' needs a domain with at least two labels")
    out = ("*." if wildcard else "") + name
    return f"{out}:{_port(port, field)}" if port else out


def egress_rules(rules: list[str] | None, field: str = "egress") -> list[str]:
    """Normalise a list: trimmed, lowercased, de-duplicated; ``["*"]`` and ``[]`` mean allow all. A list
    with a deny rule (``!…``) lets everything out but what those name, unless an allow rule names it too;
    one without is an allowlist."""
    if rules is not None and len(rules) > MAX_EGRESS_RULES:
        raise ValidationFailed.field(field, f"at most {MAX_EGRESS_RULES} rules, not {len(rules)}")
    out: list[str] = []
    for index, raw in enumerate(rules or []):
        rule = egress_rule(raw, f"{field}[{index}]")
        if rule not in out:
            out.append(rule)
    if "*" in out:
        if len(out) > 1:
            raise ValidationFailed.field(
                f"{field}[{out.index('*')}]", "'*' is allowed only as the sole entry"
            )
        return []
    return out


def envs(values: dict[str, str] | None, field: str = "envs") -> dict[str, str]:
    values = values or {}
    if len(values) > MAX_ENV_KEYS:
        raise ValidationFailed.field(field, f"at most {MAX_ENV_KEYS} keys")
    total = 0
    for key, value in values.items():
        if not ENV_KEY_RE.match(key):
            raise ValidationFailed.field(field, f"key {key!r} must match ^[A-Za-z_][A-Za-z0-9_]*$")
        size = len(value.encode())
        if size > MAX_ENV_VALUE_BYTES:
            raise ValidationFailed.field(field, f"value of {key} is over {MAX_ENV_VALUE_BYTES} bytes")
        total += len(key.encode()) + size
    if total > MAX_ENV_TOTAL_BYTES:
        raise ValidationFailed.field(field, f"keys plus values are over {MAX_ENV_TOTAL_BYTES} bytes in total")
    return dict(values)


def ssh_pubkey(raw: str, field: str) -> str:
    parts = raw.strip().split(None, 2)
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        raise ValidationFailed.field(field, "must be '<type> <base64> [comment]' with a supported key type")
    try:
        base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise ValidationFailed.field(field, "key blob is not valid base64") from None
    return " ".join(parts)


def ssh_pubkeys(keys: list[str] | None, field: str = "ssh_pubkeys") -> list[str]:
    """Each key normalised (400 naming ``<field>[<index>]``), duplicates dropped, order kept."""
    out: list[str] = []
    for index, key in enumerate(keys or []):
        normalised = ssh_pubkey(key, f"{field}[{index}]")
        if normalised not in out:
            out.append(normalised)
    return out


def auto_pause_seconds(value: int | None, field: str = "auto_pause_after_seconds") -> int | None:
    if not value:
        return None
    low, high = AUTO_PAUSE_RANGE
    if not low <= value <= high:
        raise ValidationFailed.field(field, f"must be between {low} and {high}")
    return value


def listing_depth(value: str | None, most: int) -> int:
    """A listing's ``depth`` query parameter (default 1); its range is the lister's to check."""
    raw = "1" if value is None else value
    if not raw.isdigit():
        raise ValidationFailed.field("depth", f"must be an integer 1..{most}")
    return int(raw)


def guest_path(value: str | None, field: str = "path") -> str:
    if not value:
        raise ValidationFailed.field(field, "path is required")
    if "\x00" in value:
        raise ValidationFailed.field(field, "path must not contain NUL")
    if not value.startswith("/"):
        raise ValidationFailed.field(field, "path must be absolute")
    if len(value.encode()) >= PATH_MAX_BYTES:
        raise ValidationFailed.field(field, f"path must be shorter than {PATH_MAX_BYTES} bytes")
    if any(len(part.encode()) > NAME_MAX_BYTES for part in value.split("/")):
        raise ValidationFailed.field(field, f"each path component must be at most {NAME_MAX_BYTES} bytes")
    return value


def exec_command_bytes(cmd: str, args: list[str], env: dict[str, str]) -> dict[str, int]:
    """Bytes per part of a command as the kernel counts them (NUL-terminated strings)."""
    return {
        "cmd": len(cmd.encode()) + 1,
        "args": sum(len(arg.encode()) + 1 for arg in args),
        "env": sum(len(key.encode()) + len(value.encode()) + 2 for key, value in env.items()),
    }


def mount_path(value: str, field: str) -> str:
    if not value or not value.startswith("/"):
        raise ValidationFailed.field(field, "must be an absolute path")
    if value.rstrip("/") == "":
        raise ValidationFailed.field(field, "must not be /")
    return value


def sub_path(value: str | None, field: str) -> str | None:
    if value is None or value == "":
        return None
    if value.startswith("/") or ".." in value.split("/"):
        raise ValidationFailed.field(field, "must be relative and contain no '..' segment")
    return value
