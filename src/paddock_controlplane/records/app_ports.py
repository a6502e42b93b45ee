"""How a sandbox's ports are reached from outside (docs/ingress.md): the ``Host`` its apps get in place of
the client's (``ingress_host_header``, E2B's ``maskRequestHost``) and the ports whose app serves HTTPS
itself (``ingress_https_ports``, E2B's ``httpsPorts``), which are reached over TLS without checking the
app's certificate. Kept on the sandbox's row; the ingress (``edge/ingress/routing.Route``) and E2B's
sandbox listener (``edge/e2b/edge/user_ports.py``) both go by :class:`AppPorts`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from paddock_core.errors import ValidationFailed

#: Stands for the port's number in a host header (E2B's spelling, so one value serves both APIs).
PORT_PLACEHOLDER = "${PORT}"
#: The longest host header (a host name's 253 and a port; its column holds 255).
MAX_HOST_HEADER = 255
#: Ports ``ingress_https_ports`` lists at most (isolation rule 5: bounded).
MAX_HTTPS_PORTS = 32
#: A ``Host`` value: a name or IPv4 address, and an optional port. It becomes a header line, so nothing
#: else (no CR or LF, no second header) may pass.
_HOST_VALUE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?")


@dataclass(frozen=True)
class AppPorts:
    host_header: str | None = None
    https_ports: frozenset[int] = frozenset()

    @classmethod
    def of(cls, host_header: str | None, https_ports: list[int] | None) -> AppPorts:
        return cls(host_header or None, frozenset(https_ports or ()))

    def host_for(self, port: int) -> str | None:
        """The ``Host`` the app on ``port`` gets in place of the client's, or None to keep the client's."""
        return self.host_header.replace(PORT_PLACEHOLDER, str(port)) if self.host_header else None

    def tls(self, port: int) -> bool:
        """Whether the app on ``port`` is reached over TLS (its certificate not checked)."""
        return port in self.https_ports


#: A sandbox that says nothing of its ports: the client's ``Host``, plain HTTP.
PLAIN_PORTS = AppPorts()


def host_header(value: str | None, field: str = "ingress_host_header") -> str | None:
    """A host name or address with an optional port, where ``${PORT}`` may stand for the port's number
    anywhere; ``""`` or None for none. A 400 naming ``field`` otherwise."""
    if not value:
        return None
    if len(value) > MAX_HOST_HEADER:
        raise ValidationFailed.field(field, f"at most {MAX_HOST_HEADER} characters")
    if not _HOST_VALUE.fullmatch(value.replace(PORT_PLACEHOLDER, "1")):
        raise ValidationFailed.field(
            field, f"{value[:64]!r} is not a host[:port] (with ${{PORT}} for the port's number)"
        )
    return value


def https_ports(
    values: Sequence[object] | None,
    field: str = "ingress_https_ports",
    reserved: dict[int, str] | None = None,
) -> list[int]:
    """At most :data:`MAX_HTTPS_PORTS` port numbers, none of ``reserved`` (port -> why), sorted, each
    once. A 400 naming the entry (``field[i]``) otherwise."""
    ports = values or []
    if len(ports) > MAX_HTTPS_PORTS:
        raise ValidationFailed.field(field, f"at most {MAX_HTTPS_PORTS} ports")
    checked: set[int] = set()
    for index, port in enumerate(ports):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValidationFailed.field(f"{field}[{index}]", f"{str(port)[:16]!r} is not a port")
        if reserved and port in reserved:
            raise ValidationFailed.field(f"{field}[{index}]", f"{port} {reserved[port]}")
        checked.add(port)
    return sorted(checked)
