"""E2B's wire models, as its SDKs send and read them (e2b-dev/infra ``spec/openapi.yml``; the field
names are E2B's camelCase). Requests are parsed strictly enough that a wrong type is a 400 naming the
field; fields Paddock does not act on are accepted and ignored unless acting on them matters (then 501)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from paddock_controlplane.edge.e2b import identity
from paddock_controlplane.records import app_ports, validation
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.schemas.volumes import MAX_VOLUMES_PER_SANDBOX
from paddock_core import errors
from paddock_core.timeutil import as_utc, rfc3339


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class VolumeMount(Body):
    """One of a create's ``volumeMounts`` (``SandboxVolumeMount``): a volume by name, at a path."""

    name: StrictStr = Field(min_length=1, max_length=128)
    path: StrictStr = Field(min_length=1, max_length=4096)


#: E2B's ``ALL_TRAFFIC`` (the SDK's ``e2b.sandbox.network.ALL_TRAFFIC``).
ALL_TRAFFIC = "0.0.0.0/0"
#: The allowlist that lets nothing out: Paddock's ``[]`` is open, so "deny everything, allow nothing" is
#: one rule for an address no packet leaves the sandbox for (0.0.0.0 is the sandbox's own).
NOTHING_OUT = "0.0.0.0/32"
#: Entries an ``allowOut`` or ``denyOut`` holds at most (isolation rule 5: bounded).
MAX_EGRESS_ENTRIES = 256
#: E2B's ``dnsServers`` when a create or update leaves it out: the nameserver its sandboxes may reach
#: whenever ``allowOut`` names a domain.
DEFAULT_DNS_SERVERS = ("8.8.8.8",)
#: Servers a ``dnsServers`` lists at most (E2B's limit).
MAX_DNS_SERVERS = 10


class EgressConfig(Body):
    """The egress fields a create's ``network`` and a ``PUT /sandboxes/{id}/network``
    (``SandboxNetworkUpdateConfig``) share: ``allowOut``/``denyOut`` (with ``dnsServers``) become
    Paddock's egress allowlist where it can say the same (:func:`egress`); the others are 501
    (:meth:`unserved`)."""

    allow_out: list[StrictStr] | None = Field(default=None, alias="allowOut", max_length=MAX_EGRESS_ENTRIES)
    deny_out: list[StrictStr] | None = Field(default=None, alias="denyOut", max_length=MAX_EGRESS_ENTRIES)
    dns_servers: list[Any] | None = Field(default=None, alias="dnsServers")
    egress_proxy: dict[str, Any] | None = Field(default=None, alias="egressProxy")
    rules: dict[str, Any] | None = None

    #: Wire names of the fields Paddock does not act on, in the order a 501 names the first one set.
    UNSERVED: ClassVar[tuple[str, ...]] = ("egressProxy", "rules")

    def unserved(self) -> list[str]:
        """The fields set that Paddock does not act on (each a 501)."""
        by_alias = self.model_dump(by_alias=True, exclude_none=True)
        return [name for name in self.UNSERVED if name in by_alias]


class NetworkConfig(EgressConfig):
    """A create's ``network`` (``SandboxNetworkConfig``): its egress fields, and ``allowPublicTraffic``,
    which is the ingress."""

    allow_public_traffic: StrictBool | None = Field(default=None, alias="allowPublicTraffic")
    mask_request_host: StrictStr | None = Field(default=None, alias="maskRequestHost")
    https_ports: list[Any] | None = Field(default=None, alias="httpsPorts")

    UNSERVED: ClassVar[tuple[str, ...]] = (
        "egressProxy",
        "rules",
    )

    def host_mask(self) -> str | None:
        """``maskRequestHost``, checked as /v1's ``ingress_host_header`` (records/app_ports.py): a host
        name or address with an optional port, ``${PORT}`` standing for the port's number anywhere."""
        return app_ports.host_header(self.mask_request_host, "network.maskRequestHost")

    def tls_ports(self) -> list[int]:
        """``httpsPorts``, checked as /v1's ``ingress_https_ports``, and envd's port not among them (the
        edge serves it itself)."""
        return app_ports.https_ports(
            self.https_ports,
            "network.httpsPorts",
            reserved={identity.ENVD_PORT: "is envd's port, which the edge serves itself"},
        )


class NetworkUpdate(EgressConfig):
    """``PUT /sandboxes/{id}/network`` (``SandboxNetworkUpdateConfig``, the SDK's ``update_network``):
    the whole egress configuration again, what it leaves out cleared; ``allow_internet_access`` (snake
    case on the wire) false denies everything, as in a create."""

    allow_internet_access: StrictBool | None = None


def egress(
    network: EgressConfig | None, allow_internet_access: bool | None, where: str = "network."
) -> list[str] | None:
    """E2B's egress fields as Paddock's rules (``egress`` of the native create), or None to leave the
    sandbox open. E2B: everything is allowed unless denied, and an allowed entry wins over a denied one.
    - ``denyOut`` holds ``ALL_TRAFFIC`` (or ``allow_internet_access: false``, which E2B defines as that):
      an allowlist, ``allowOut`` (CIDRs, IPs, ``example.com`` and ``*.example.com``, which Paddock's
      resolver admits), or :data:`NOTHING_OUT` when it is empty.
    - ``denyOut`` of some addresses only: a denylist, each one a deny rule (``!cidr``), with
      ``allowOut``'s entries as its allow rules, which win over them as on E2B.
    - ``allowOut`` without a deny allows what is allowed anyway: open.

    Either list, when ``allowOut`` names a domain, also allows the ``dnsServers`` (E2B's 8.8.8.8 when
    left out). ``where`` is what the fields' names start with in an error (a create's are under
    ``network.``, an update's are the body's own)."""
    allow_out = network.allow_out if network is not None else None
    deny_out = network.deny_out if network is not None else None
    dns_servers = _dns_servers(network.dns_servers if network is not None else None, f"{where}dnsServers")
    denies_all = allow_internet_access is False
    denied: list[str] = []
    for index, entry in enumerate(deny_out or []):
        field = f"{where}denyOut[{index}]"
        try:
            network_denied = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            raise errors.ValidationFailed.field(
                field, f"{entry[:64]!r} is not a CIDR block or an IP address (E2B denies no domains)"
            ) from None
        if network_denied.prefixlen == 0:
            denies_all = True
            continue
        rule = validation.egress_rule(validation.EGRESS_DENY + entry.strip(), field)
        if rule not in denied:
            denied.append(rule)
    if not denies_all and not denied:
        if allow_out is not None:  # as E2B: nothing denied, everything allowed; still a 400 if malformed
            validation.egress_rules(allow_out, f"{where}allowOut")
        return None
    rules = validation.egress_rules(allow_out, f"{where}allowOut")
    if allow_out and not rules:  # "*" or 0.0.0.0/0 allowed: everything is
        return []
    if any(ipaddress.ip_network(rule, strict=False).prefixlen == 0 for rule in rules if _is_cidr(rule)):
        return []
    if any(_is_domain(rule) for rule in rules):
        # E2B: an allowOut that names a domain lets the sandbox reach its DNS servers too, wholly.
        rules += [server for server in dns_servers if server not in rules]
    if denies_all:  # everything else is denied already: the addresses denied besides add nothing
        return rules or [NOTHING_OUT]
    return rules + denied


def _dns_servers(servers: list[Any] | None, field: str) -> list[str]:
    """``dnsServers`` as allowlist entries: IPv4 addresses, at most :data:`MAX_DNS_SERVERS`; E2B's
    default when left out, none for ``[]``."""
    if servers is None:
        return list(DEFAULT_DNS_SERVERS)
    if len(servers) > MAX_DNS_SERVERS:
        raise errors.ValidationFailed.field(field, f"at most {MAX_DNS_SERVERS} servers")
    out: list[str] = []
    for index, server in enumerate(servers):
        try:
            address = ipaddress.IPv4Address(server) if isinstance(server, str) else None
        except ValueError:
            address = None
        if address is None:
            raise errors.ValidationFailed.field(
                f"{field}[{index}]", f"{str(server)[:64]!r} is not an IPv4 address"
            )
        rule = validation.egress_rule(str(address), f"{field}[{index}]")
        if rule not in out:
            out.append(rule)
    return out


def _is_domain(rule: str) -> bool:
    """Whether an allowlist rule names hosts by name (``example.com``, ``*.example.com``, either with a
    port), not by address."""
    host = rule.rpartition(":")[0] if rule.count(":") == 1 else rule
    return not host.startswith("[") and not _is_cidr(host)


def _is_cidr(rule: str) -> bool:
    try:
        ipaddress.ip_network(rule, strict=False)
    except ValueError:
        return False
    return True


def egress_view(sandbox: Sandbox) -> dict[str, list[str]]:
    """``allowOut``/``denyOut`` of a sandbox's detail, read from its rules (so a ``PUT /v1/…/egress``
    shows too): none while it is open; a denylist's deny rules as ``denyOut`` and its allow rules as
    ``allowOut``; else everything denied and the rules allowed."""
    rules = [str(rule) for rule in sandbox.egress or []]
    if not rules:
        return {}
    denied = [rule for rule in rules if rule.startswith(validation.EGRESS_DENY)]
    allowed = [rule for rule in rules if not rule.startswith(validation.EGRESS_DENY) and rule != NOTHING_OUT]
    if denied:
        return {
            "allowOut": allowed,
            "denyOut": [rule.removeprefix(validation.EGRESS_DENY) for rule in denied],
        }
    return {"allowOut": allowed, "denyOut": [ALL_TRAFFIC]}


class NewVolume(Body):
    """``POST /volumes``."""

    name: StrictStr


class AutoResume(Body):
    """A create's ``autoResume`` (``SandboxAutoResumeConfig``)."""

    enabled: StrictBool


class NewSandbox(Body):
    """``POST /sandboxes`` and ``POST /v2/sandboxes`` (``NewSandbox``/``NewSandboxV2``)."""

    template_id: StrictStr = Field(alias="templateID", min_length=1, max_length=128)
    timeout: StrictInt | None = None
    auto_pause: StrictBool | None = Field(default=None, alias="autoPause")
    auto_pause_memory: StrictBool | None = Field(default=None, alias="autoPauseMemory")
    secure: StrictBool | None = None
    allow_internet_access: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    env_vars: dict[StrictStr, StrictStr] | None = Field(default=None, alias="envVars")
    mcp: dict[str, Any] | None = None
    volume_mounts: list[VolumeMount] | None = Field(
        default=None, alias="volumeMounts", max_length=MAX_VOLUMES_PER_SANDBOX
    )
    network: NetworkConfig | None = None
    iam: dict[str, Any] | None = None
    auto_resume: AutoResume | None = Field(default=None, alias="autoResume")
    #: The CPUs to boot with (SDK 2.64's ``cpu_count``): the template's own, or within its
    #: ``maxCpuCount`` (``templates.cpus_for``).
    cpu_count: StrictInt | None = Field(default=None, alias="cpuCount")

    def resumes_on_activity(self) -> bool:
        """``autoResume.enabled``, which E2B allows only beside a pause at the timeout that keeps the
        memory (the SDK's ``lifecycle={"on_timeout": "pause", "auto_resume": True}``): a filesystem-only
        pause cannot be woken by traffic, as its processes are gone. Else a 400 naming ``autoResume``."""
        if self.auto_resume is None or not self.auto_resume.enabled:
            return False
        if not self.auto_pause:
            raise errors.ValidationFailed.field("autoResume", "needs autoPause (on_timeout 'pause')")
        if self.auto_pause_memory is False:
            raise errors.ValidationFailed.field(
                "autoResume", "cannot be combined with autoPauseMemory false (mode 'filesystem')"
            )
        return True


class Timeout(Body):
    """``POST /sandboxes/{id}/timeout``."""

    timeout: StrictInt


class Refresh(Body):
    """``POST /sandboxes/{id}/refreshes``."""

    duration: StrictInt | None = None


class Connect(Body):
    """``POST /sandboxes/{id}/connect``, ``/v2/…/connect`` and ``/resume``."""

    timeout: StrictInt | None = None
    auto_pause: StrictBool | None = Field(default=None, alias="autoPause")


class Pause(Body):
    """``POST /sandboxes/{id}/pause`` (``SandboxPauseRequest``): ``memory: false`` is a filesystem-only
    pause (Paddock's hibernation); ``requireHealthyGuest`` is accepted and not acted on."""

    memory: StrictBool | None = None
    require_healthy_guest: StrictBool | None = Field(default=None, alias="requireHealthyGuest")


class Fork(Body):
    """``POST /sandboxes/{id}/fork``."""

    timeout: StrictInt | None = None
    count: StrictInt | None = None


#: Paddock statuses as E2B's two states; any other status is not shown (E2B lists only these two).
STATES: dict[str, str] = {
    "creating": "running",
    "running": "running",
    "resuming": "running",
    "forking": "running",
    "pausing": "paused",
    "paused": "paused",
}


def created(sandbox: Sandbox, template_id: str, settings: Any) -> dict[str, Any]:
    """E2B's ``Sandbox``: what a create, connect or resume answers."""
    return {
        "templateID": template_id,
        "sandboxID": sandbox.id,
        "clientID": identity.CLIENT_ID,
        "envdVersion": identity.ENVD_VERSION,
        "envdAccessToken": identity.envd_access_token(settings, sandbox.id),
        # The edge opens the sandbox's other ports (49999 too) to this token when its ingress is off,
        # as E2B does for a sandbox without public traffic; the SDK sends it to every port.
        "trafficAccessToken": identity.envd_access_token(settings, sandbox.id),
        "domain": identity.domain(settings),
        "alias": template_id,
    }


def listed(
    sandbox: Sandbox, template_id: str, end_at: dt.datetime, metadata: dict[str, str]
) -> dict[str, Any]:
    """E2B's ``ListedSandbox``."""
    return {
        "templateID": template_id,
        "alias": template_id,
        "sandboxID": sandbox.id,
        "clientID": identity.CLIENT_ID,
        "startedAt": rfc3339(sandbox.running_at or sandbox.created_at),
        "endAt": rfc3339(end_at),
        "cpuCount": sandbox.vcpu,
        "memoryMB": sandbox.mem_mib,
        "diskSizeMB": sandbox.disk_mib,
        "metadata": metadata,
        "state": STATES[sandbox.status],
        "envdVersion": identity.ENVD_VERSION,
    }


def record(
    sandbox: Sandbox,
    template_id: str,
    settings: Any,
    now: dt.datetime,
    *,
    monitoring_kept: dt.timedelta,
    events_kept: dt.timedelta,
) -> dict[str, Any]:
    """E2B's ``SandboxRecord`` (``GET /unstable/sandboxes/{id}/record``): the sandbox's run, ended or
    not. Once it ended, its metrics stay readable for ``monitoring_kept`` (the metrics' one-minute
    averages, a day), so ``retentionExpired`` turns true then; its logs' audit entries and its events
    stay in the audit trail for ``events_kept`` (``audit_retention_days``), its boot log goes at once."""
    ended = sandbox.status not in STATES  # gone from E2B's views: killed, failed, or lost with its host
    stopped = (sandbox.destroyed_at or sandbox.running_at or sandbox.created_at) if ended else None

    def older_than(kept: dt.timedelta) -> bool:
        return stopped is not None and as_utc(stopped) < now - kept

    return {
        "templateID": template_id,
        "alias": template_id,
        "sandboxID": sandbox.id,
        "startedAt": rfc3339(sandbox.running_at or sandbox.created_at),
        "stoppedAt": rfc3339(stopped) if stopped is not None else None,
        "cpuCount": sandbox.vcpu,
        "memoryMB": sandbox.mem_mib,
        "diskSizeMB": sandbox.disk_mib,
        "domain": identity.domain(settings),
        "retentionExpired": older_than(monitoring_kept),
        "eventsRetentionExpired": older_than(events_kept),
    }


def detail(
    sandbox: Sandbox,
    template_id: str,
    end_at: dt.datetime,
    metadata: dict[str, str],
    settings: Any,
    auto_resume: bool = False,
) -> dict[str, Any]:
    """E2B's ``SandboxDetail``."""
    ports = sandbox.app_ports
    return {
        **listed(sandbox, template_id, end_at, metadata),
        "lifecycle": {
            "onTimeout": "pause" if sandbox.on_timeout in ("pause", "hibernate") else "kill",
            "autoResume": auto_resume,
        },
        "envdAccessToken": identity.envd_access_token(settings, sandbox.id),
        # The edge opens the sandbox's other ports (49999 too) to this token when its ingress is off,
        # as E2B does for a sandbox without public traffic; the SDK sends it to every port.
        "trafficAccessToken": identity.envd_access_token(settings, sandbox.id),
        "domain": identity.domain(settings),
        "allowInternetAccess": not sandbox.egress,
        # E2B's public traffic is the sandbox's ingress (docs/e2b.md).
        "network": {
            "allowPublicTraffic": bool(sandbox.ingress_enabled),
            **egress_view(sandbox),
            **({"maskRequestHost": ports.host_header} if ports.host_header is not None else {}),
            **({"httpsPorts": sorted(ports.https_ports)} if ports.https_ports else {}),
        },
    }
