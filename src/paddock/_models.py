"""Typed views of the API's payloads. Unknown fields are kept in ``extra``, never rejected."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar

from paddock._errors import ProtocolError

T = TypeVar("T")
V = TypeVar("V", bound="WireView")


def _build(cls: type[T], data: dict[str, Any], renames: dict[str, str] | None = None) -> T:
    """``cls(**known fields, extra={the rest})``; ``renames`` maps wire names to attribute names."""
    renames = renames or {}
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}  # type: ignore[arg-type]
    known: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        attr = renames.get(key, key)
        if attr in names:
            known[attr] = value
        else:
            extra[key] = value
    return cls(**known, extra=extra)  # type: ignore[call-arg]


@dataclass
class SandboxInfo:
    """SandboxView (§10.8) or CreateSandboxResponse (§10.7)."""

    id: str
    status: str
    name: str | None = None
    ip: str | None = None
    shape: str | None = None
    rootfs: str | None = None
    region: str | None = None
    vcpu: int | None = None
    mem_mib: int | None = None
    disk_mib: int | None = None
    created_at: str | None = None
    spawn_ms: float | None = None
    egress: list[str] = field(default_factory=list)
    envs: list[str] = field(default_factory=list)
    ssh_pubkeys: list[str] = field(default_factory=list)
    ingress_enabled: bool = False
    ingress_url_template: str | None = None
    #: The ``Host`` its apps get through the ingress, and the ports reached over TLS (docs/ingress.md).
    ingress_host_header: str | None = None
    ingress_https_ports: list[int] = field(default_factory=list)
    auto_pause_after_seconds: int | None = None
    forked_from: str | None = None
    #: Paused with only its disk kept on its host (``pause(keep_memory=False)``, docs/hibernation.md).
    hibernated: bool = False
    #: A frozen pause's ``hibernate_after_seconds``: it is hibernated once paused this long.
    auto_hibernate_after_seconds: int | None = None
    #: Private networks joined: ``[{"id", "status": "pending"|"active", "ip"?}]`` (the overlay address).
    networks: list[dict[str, Any]] = field(default_factory=list)
    #: The lifetime: at ``end_at`` (RFC 3339) the sandbox is destroyed, paused or hibernated (``on_timeout``).
    timeout_s: int | None = None
    on_timeout: str | None = None
    end_at: str | None = None
    #: ``hibernate`` when an idle spell hibernates the sandbox rather than freezing it (``on_idle``).
    on_idle: str | None = None
    #: The labels given at create (``metadata``), inherited by forks; ``list(metadata=...)`` filters.
    metadata: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SandboxInfo:
        return _build(cls, data)

    def ingress_url(self, port: int) -> str:
        if not self.ingress_url_template:
            raise ValueError("ingress is not enabled on this sandbox")
        return self.ingress_url_template.replace("<port>", str(port))


@dataclass
class FileEntry:
    """One entry of ``files.list``/``files.stat``: ``type`` is ``file``, ``dir``, ``symlink`` or ``other``."""

    name: str
    path: str
    type: str
    size: int = 0
    mode: int = 0
    permissions: str = ""
    owner: str = ""
    group: str = ""
    modified_at: str | None = None
    symlink_target: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> FileEntry:
        return _build(cls, data)


@dataclass
class FileEvent:
    """What ``files.watch`` yields: ``event`` is ``create``, ``modify``, ``delete`` or ``overflow`` (events
    were lost: list again)."""

    event: str
    path: str
    type: str = ""


@dataclass
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int
    exec_ms: float
    error: str | None = None
    #: A buffered exec keeps at most 4 MiB of each stream; the command still ran to its end.
    #: Use ``Sandbox.stream`` for the whole output.
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> ExecResult:
        result = data.get("result", {})
        return cls(
            stdout=result.get("stdout", ""),
            stderr=result.get("stderr", ""),
            exit_code=int(result.get("exit_code", -1)),
            exec_ms=float(data.get("exec_ms", 0.0)),
            error=result.get("error"),
            stdout_truncated=bool(result.get("stdout_truncated", False)),
            stderr_truncated=bool(result.get("stderr_truncated", False)),
        )


@dataclass
class Bandwidth:
    """BandwidthView (§10.10): ``quota_bytes`` and ``remaining_bytes`` are -1 when unmetered."""

    id: str
    quota_bytes: int
    used_bytes: int
    ingress_bytes: int
    remaining_bytes: int
    capped: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Bandwidth:
        return _build(cls, data)


@dataclass
class MetricSample:
    """One sample of a sandbox's use (docs/observability.md, ``Sample``): CPU as a percentage of its own
    vCPUs, memory and disk used and their limits, and the network's cumulative byte counters."""

    at: str
    cpu_pct: float
    mem_used_bytes: int
    mem_limit_bytes: int
    disk_used_bytes: int
    disk_limit_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> MetricSample:
        return _build(cls, data)


@dataclass
class SandboxMetrics:
    """``GET /v1/sandboxes/{id}/metrics``: the window's ``samples``, oldest first, one every
    ``interval_s``, and ``latest``, the newest kept whatever the window (None before the first)."""

    sandbox_id: str
    interval_s: float
    latest: MetricSample | None
    samples: list[MetricSample]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SandboxMetrics:
        made = _build(cls, data)
        made.latest = MetricSample.from_api(data["latest"]) if data.get("latest") else None
        made.samples = [MetricSample.from_api(sample) for sample in data.get("samples") or []]
        return made


@dataclass
class AccountMetrics:
    """``GET /v1/metrics``: the account's totals now, over its running sandboxes' fresh samples
    (``sandboxes`` of its ``running_sandboxes`` had one); ``cpu_pct`` is of their vCPUs together."""

    interval_s: float
    at: str | None
    running_sandboxes: int
    sandboxes: int
    vcpu: int
    cpu_pct: float
    mem_used_bytes: int
    mem_limit_bytes: int
    disk_used_bytes: int
    disk_limit_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> AccountMetrics:
        return _build(cls, data)


@dataclass
class SandboxLogs:
    """``GET /v1/sandboxes/{id}/logs``: the last ``lines`` of its boot log (``source="boot"``) or, on the
    VM tier, its guest's console (``"guest"``); ``truncated`` when older lines were left out."""

    sandbox_id: str
    source: str
    truncated: bool
    lines: list[str]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SandboxLogs:
        return _build(cls, data)


@dataclass
class AuditEvent:
    """One event of a sandbox's audit trail (``GET /v1/sandboxes/{id}/audit``, docs/audit.md). ``kind``
    is ``api``, ``command``, ``file``, ``process``, ``egress`` or ``dropped``; ``actor`` who made it (an
    API key's ``key_…`` or an access token's ``sat_…`` id, ``envd`` or ``signed_url`` through E2B's
    edge; None for egress, which no caller made); ``detail`` the kind's own fields (``argv``,
    ``exit_code``, ``path``, ``bytes``, ``verdict``, ``route``, ``status`` …)."""

    id: int
    sandbox_id: str
    at: str
    kind: str
    actor: str | None = None
    #: The kind's own fields, which the API sends beside the common ones (``detail`` names them).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def detail(self) -> dict[str, Any]:
        """The kind's own fields: ``argv``, ``exit_code``, ``path``, ``verdict`` …"""
        return self.extra

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> AuditEvent:
        return _build(cls, data)


@dataclass
class AccessToken:
    """A sandbox's delegated access token (§12.1). ``token`` — the secret — is set only on the object
    ``create_access_token``/``rotate_access_token`` return; reads show ``token_hint``."""

    enabled: bool
    token: str | None = None
    token_hint: str | None = None
    created_at: str | None = None
    rotated_at: str | None = None
    #: This server's extension: when the token stops working, if it was given a lifetime.
    expires_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        # The secret stays out of logs and tracebacks that print the object.
        return (
            f"AccessToken(enabled={self.enabled}, token_hint={self.token_hint!r}, "
            f"created_at={self.created_at!r}, rotated_at={self.rotated_at!r}, expires_at={self.expires_at!r})"
        )

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> AccessToken:
        return _build(cls, data)


@dataclass
class WebhookEndpoint:
    """WebhookEndpoint (§10.16). ``secret`` is set only on the object ``create`` returns."""

    id: str
    url: str
    events: list[str] = field(default_factory=list)
    active: bool = True
    failure_count: int = 0
    created_at: str | None = None
    secret: str | None = None
    #: The retained deliveries, newest first; filled only by ``webhooks.get``.
    deliveries: list[WebhookDelivery] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> WebhookEndpoint:
        return _build(cls, data, {"failureCount": "failure_count", "createdAt": "created_at"})

    @classmethod
    def from_detail(cls, data: dict[str, Any]) -> WebhookEndpoint:
        """``GET /v1/webhook-endpoints/{id}``: ``{"endpoint": {...}, "deliveries": [...]}``."""
        endpoint = cls.from_api(dict(data.get("endpoint") or {}))
        endpoint.deliveries = [WebhookDelivery.from_api(d) for d in data.get("deliveries") or []]
        return endpoint


@dataclass
class WebhookDelivery:
    """WebhookDelivery (§10.16)."""

    id: str
    event_action: str
    status: str
    attempts: int
    delivered_at: str | None = None
    last_error: str | None = None
    payload: Any = None
    created_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> WebhookDelivery:
        return _build(
            cls,
            data,
            {
                "eventAction": "event_action",
                "deliveredAt": "delivered_at",
                "lastError": "last_error",
                "createdAt": "created_at",
            },
        )


@dataclass
class NetworkMember:
    sandbox_id: str
    status: str
    ip: str | None = None
    name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> NetworkMember:
        return _build(cls, data)


@dataclass
class Network:
    """Network (§10.14): ``member_count`` on list and create, ``members`` on the detail read."""

    id: str
    name: str
    created_at: str | None = None
    member_count: int | None = None
    members: list[NetworkMember] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Network:
        network = _build(cls, {k: v for k, v in data.items() if k != "members"})
        if isinstance(data.get("members"), list):
            network.members = [NetworkMember.from_api(m) for m in data["members"]]
        return network


@dataclass
class Disk:
    """DiskView (§10.13): an S3 bucket registered once; its credentials are never returned."""

    id: str
    name: str
    kind: str = "s3"
    config: dict[str, Any] = field(default_factory=dict)
    created_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Disk:
        return _build(cls, data)


@dataclass
class SandboxDisk:
    """SandboxDiskView (§10.13): a disk mounted in a sandbox. ``mount_status`` is ``pending``,
    ``mounted`` or ``error`` (then ``mount_error`` says why)."""

    disk_id: str
    mount_path: str
    mount_status: str
    name: str | None = None
    kind: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    sub_path: str | None = None
    mount_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SandboxDisk:
        return _build(cls, data)


@dataclass
class Template:
    """TemplateView (§10.12): a Dockerfile and the image built from it. ``status`` goes ``pending`` →
    ``building`` → ``ready`` | ``failed``; ``dockerfile`` only when asked for (``get(include_dockerfile=True)``)."""

    id: str
    name: str
    status: str
    base: str | None = None
    ext4_size_bytes: int = 0
    created_at: str | None = None
    built_at: str | None = None
    dockerfile: str | None = None
    #: Why a ``failed`` template failed (its last attempt's error; the logs hold the rest).
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Template:
        return _build(cls, data)


@dataclass
class Snapshot:
    """A copy of a sandbox's disk (issue #34, docs/snapshots.md), kept on the host that made it:
    ``rootfs=`` its id or name boots new sandboxes from it. ``status`` is ``creating`` then ``ready``;
    ``rootfs`` the image under it, ``disk_mib`` its disk's size, ``size_bytes`` what it holds;
    ``volumes`` the copies of volumes it keeps (taken with ``include_volumes``), each with the
    ``name`` of the volume copied, its ``mount_path``, ``read_only`` and ``size_mib``."""

    id: str
    status: str
    name: str | None = None
    source_sandbox_id: str | None = None
    host_id: str | None = None
    rootfs: str | None = None
    disk_mib: int = 0
    size_bytes: int = 0
    created_at: str | None = None
    volumes: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Snapshot:
        return _build(cls, data)


@dataclass
class VolumeAttachment:
    """A sandbox holding a volume: where it is mounted there, and whether read-only."""

    sandbox_id: str
    mount_path: str
    read_only: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> VolumeAttachment:
        return _build(cls, data)


@dataclass
class Volume:
    """A local persistent volume (issue #34, docs/volumes.md): an XFS filesystem kept on the host that
    made it (``host_id``), which outlives every sandbox it is mounted into. ``status`` is ``creating``,
    ``ready`` or ``deleting``; ``attachments`` the sandboxes holding it now (one read-write, or any
    number read-only)."""

    id: str
    name: str
    status: str
    size_mib: int = 0
    host_id: str | None = None
    created_at: str | None = None
    attachments: list[VolumeAttachment] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Volume:
        volume = _build(cls, data)
        volume.attachments = [
            VolumeAttachment.from_api(a) if isinstance(a, dict) else a for a in volume.attachments
        ]
        return volume


@dataclass
class BuildLogFrame:
    """One build log frame (§10.12): a ``line`` of an ``attempt``, or the terminal frame (``final``
    with ``status``)."""

    ts: str | None = None
    level: str | None = None
    line: str | None = None
    attempt: int | None = None
    final: bool = False
    status: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> BuildLogFrame:
        return _build(cls, data)


@dataclass
class ManagedProcess:
    """A managed process (§12.2): ``kind`` is ``process`` or ``pty``; ``output`` is
    ``{oldest_seq, newest_seq, bytes}`` of the output the sandbox still holds."""

    process_id: str
    kind: str
    pid: int
    state: str
    leader_exited: bool
    tree_exited: bool
    created_at: str
    output: dict[str, int]
    finished_at: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    cmd: str = ""
    args: list[str] = field(default_factory=list)
    cwd: str = ""
    foreground: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> ManagedProcess:
        return _build(cls, data)


# -- computer use (§12.3) ---------------------------------------------------------------------------


@dataclass
class Window:
    """A top-level window of a desktop sandbox's screen; ``id`` is the X window id (decimal)."""

    id: str
    title: str

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Window:
        return cls(id=str(data["id"]), title=str(data.get("title") or ""))


@dataclass
class WindowGeometry:
    id: str
    x: int
    y: int
    width: int
    height: int
    screen: str

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> WindowGeometry:
        return cls(
            id=str(data["id"]),
            x=int(data["x"]),
            y=int(data["y"]),
            width=int(data["width"]),
            height=int(data["height"]),
            screen=str(data.get("screen") or ""),
        )


@dataclass
class Screen:
    """One X screen of a desktop sandbox (``screen-0`` … ``screen-7``)."""

    screen_id: str
    display: str
    width: int
    height: int
    vnc_port: int
    novnc_port: int

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Screen:
        return cls(
            screen_id=str(data["screen_id"]),
            display=str(data.get("display") or ""),
            width=int(data["width"]),
            height=int(data["height"]),
            vnc_port=int(data.get("vnc_port") or 0),
            novnc_port=int(data.get("novnc_port") or 0),
        )


@dataclass
class LiveView:
    """A short-lived noVNC link to a screen (``connect``): open ``url`` in a browser before
    ``expires_at``."""

    screen_id: str
    port: int
    path: str
    token: str
    expires_at: str
    url: str | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> LiveView:
        return cls(
            screen_id=str(data["screen_id"]),
            port=int(data["port"]),
            path=str(data.get("path") or ""),
            token=str(data.get("token") or ""),
            expires_at=str(data.get("expires_at") or ""),
            url=str(data["url"]) if data.get("url") else None,
        )


# -- results that were plain dicts: identity and catalog (§10.2–§10.5), the gateway (gateway-api §5) --


class WireView(Mapping[str, Any]):
    """A typed result that can still be read as the JSON object it came from.

    ``whoami``, ``shapes``, ``rootfs``, ``hosts`` and ``GatewayClient``'s reads returned plain dicts
    before they returned these models. So that code written against the dicts keeps working, each model
    is also a read-only mapping of the wire's fields, as they were sent: ``result["user_id"]``,
    ``result.get("cpu_quota_pct")``, ``"entries" in result``, ``dict(result)``, ``{**result}``, and
    ``result == {...}`` compares those fields. Nested values read this way are the wire's plain dicts;
    read through attributes (named as the wire names them) they are models. ``to_dict()`` gives a copy.
    """

    #: The JSON object the model was read from (absent on a model built by hand: then its fields).
    _wire: dict[str, Any]
    #: The fields whose JSON is read as a model of their own (``_each(Model.from_api)`` for a list).
    _nested: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Self:
        return _view(cls, data, cls._nested)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._fields())

    def _fields(self) -> Mapping[str, Any]:
        wire = self.__dict__.get("_wire")
        if wire is not None:
            return wire  # type: ignore[no-any-return]
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra":
                out.update(value)
            elif value is not None:
                out[f.name] = _plain(value)
        return out

    def __getitem__(self, key: str) -> Any:
        return self._fields()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields())

    def __len__(self) -> int:
        return len(self._fields())


def _plain(value: Any) -> Any:
    if isinstance(value, WireView):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _view(cls: type[V], data: Mapping[str, Any], nested: dict[str, Callable[[Any], Any]] | None = None) -> V:
    """``cls`` read from ``data`` (``nested`` turns a field's JSON into its model), keeping ``data``."""
    nested = nested or {}
    converted = {k: nested[k](v) if k in nested and v is not None else v for k, v in data.items()}
    missing = [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in data
    ]
    if missing:
        raise ProtocolError(f"the server's {cls.__name__} lacks {', '.join(missing)}")
    view = _build(cls, converted)
    view._wire = dict(data)
    return view


def _each(model: Callable[[dict[str, Any]], T]) -> Callable[[Any], list[T]]:
    return lambda items: [model(item) for item in items]


@dataclass(eq=False)
class WhoAmIStats(WireView):
    """How many of the caller's sandboxes are ``running``, ``paused``, in any ``other`` state, and in
    all (``total``; destroyed ones are not counted). A count the server leaves out is 0."""

    running: int = 0
    paused: int = 0
    other: int = 0
    total: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Credits(WireView):
    """The account's credits (this server's extension of §10.5): what is left and what was spent."""

    balance: float
    spent: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class WhoAmI(WireView):
    """WhoAmIView (§10.5): whose key this is and what it runs."""

    user_id: str
    stats: WhoAmIStats
    credits: Credits | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _nested: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "stats": WhoAmIStats.from_api,
        "credits": Credits.from_api,
    }


@dataclass(eq=False)
class Shape(WireView):
    """Shape (§10.2): pass ``id`` as ``shape`` on create. ``cpu_quota_pct`` is None when unlimited."""

    id: str
    vcpu: int
    mem_mib: int
    default_disk_mib: int
    cpu_quota_pct: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class RootfsEntry(WireView):
    """RootfsEntry (§10.3)."""

    name: str
    description: str | None = None
    deprecated: bool = False
    successor: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class RootfsData(WireView):
    """RootfsData (§10.3): the catalog images a sandbox can boot (``rootfs``), the one used when create
    names none (``default``), and their descriptions (``entries``; empty when the catalog is)."""

    rootfs: list[str]
    default: str
    entries: list[RootfsEntry] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    _nested: ClassVar[dict[str, Callable[[Any], Any]]] = {"entries": _each(RootfsEntry.from_api)}


@dataclass(eq=False)
class HostInfo(WireView):
    """HostPublic (§10.4): ``free_mib`` of schedulable memory, ``vm_count`` sandboxes placed, the
    catalog images it holds (``rootfses``) and the ``labels`` a create's ``node_selector`` matches."""

    id: str
    status: str
    free_mib: int
    vm_count: int
    rootfses: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Chain(WireView):
    """One chain the gateway takes payments on (gateway-api §5.8)."""

    chain: str
    chain_id: int
    tokens: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Recipient(WireView):
    chain: str
    address: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Recipients(WireView):
    """The gateway's payment address on each chain (gateway-api §5.9)."""

    updated_at: str
    recipients: list[Recipient]
    extra: dict[str, Any] = field(default_factory=dict)

    _nested: ClassVar[dict[str, Callable[[Any], Any]]] = {"recipients": _each(Recipient.from_api)}


@dataclass(eq=False)
class TokenBalance(WireView):
    """One token's balance: ``balance`` in decimal units, ``balance_raw`` in raw units (compare it with
    a quote's ``amount_token``); ``address`` is the token contract's."""

    token: str
    symbol: str
    address: str
    balance: str
    balance_raw: str
    decimals: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class WalletBalance(WireView):
    """An address's balance of each accepted token on one chain (gateway-api §5.7)."""

    address: str
    chain: str
    chain_id: int
    balances: list[TokenBalance]
    extra: dict[str, Any] = field(default_factory=dict)

    _nested: ClassVar[dict[str, Callable[[Any], Any]]] = {"balances": _each(TokenBalance.from_api)}


@dataclass(eq=False)
class Project(WireView):
    """One of the wallet's projects (gateway-api §5.5); the fields keep the wire's camelCase names.
    ``url`` is None until a deployment has succeeded."""

    id: str
    name: str
    displayName: str
    status: str
    url: str | None = None
    createdAt: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class DeploymentStatus(WireView):
    """A deployment's status (gateway-api §5.4): ``status`` is ``deploying``, ``ready`` (``endpoint``
    is its URL) or ``failed`` (``reason`` says why)."""

    status: str
    deployment_id: str
    deployment_status: str | None = None
    message: str | None = None
    endpoint: str | None = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class ProjectDeleted(WireView):
    """The answer to ``delete_project`` (gateway-api §5.6)."""

    projectId: str
    status: str
    extra: dict[str, Any] = field(default_factory=dict)
