"""The host agent's internal API (``/internal/v1``) on the wire: the one contract both sides import.

The routes (``routes.py``) parse requests into these models and answer with them; the control plane's
client (``client.py``) builds the same request models and parses the answers into the same response
models. So this module imports nothing but pydantic and the standard library: the control plane may
import it (tests/test_layering.py) without the host agent's server dependencies.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from ipaddress import IPv4Address
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from paddock_core import s3config

SANDBOX_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
SANDBOX_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"

#: ``error``: a sandbox this agent holds but cannot run (it was made under another tier's driver, and
#: stopped when the agent started on this one); ``status_reason`` says why.
SandboxStatus = Literal["running", "paused", "stopped", "error"]


class NetworkAttachBody(BaseModel):
    network_id: str = Field(pattern=SANDBOX_ID_PATTERN)
    ip: IPv4Address
    prefixlen: int = Field(ge=8, le=30)


def _s3(parse: Callable[[str], Any]) -> Callable[[Any, str | None], Any]:
    def check(cls: Any, value: str | None) -> Any:
        return None if value is None else parse(value)

    return classmethod(check)  # type: ignore[return-value]


class DiskMountBody(BaseModel):
    """An S3 disk to mount into a sandbox (``drivers/storage/s3mounts.py``). The credentials go only into a
    0600 file on the host; ``repr=False`` keeps them out of any logged or printed model."""

    disk_id: str = Field(pattern=SANDBOX_ID_PATTERN)
    mount_path: str = Field(pattern=r"^/.", max_length=4096)
    sub_path: str | None = Field(default=None, max_length=1024)
    bucket: str = Field(min_length=1, max_length=255)
    endpoint: str = Field(pattern=r"^https?://", max_length=2048)
    region: str | None = Field(default=None, max_length=64)
    use_path_style: bool = False
    access_key: str = Field(min_length=1, repr=False)
    secret_key: str = Field(min_length=1, repr=False)

    # The control plane's rules again (paddock_core.s3config, standard library only): s3fs's options
    # are built from these fields, and a comma in one would be another option.
    _endpoint = field_validator("endpoint")(_s3(s3config.endpoint))
    _bucket = field_validator("bucket")(_s3(s3config.bucket))
    _region = field_validator("region")(_s3(s3config.region))
    _sub_path = field_validator("sub_path")(_s3(s3config.sub_path))
    _mount_path = field_validator("mount_path")(_s3(s3config.mount_path))


DiskMountStatus = Literal["pending", "mounted", "error"]


class DiskMountView(BaseModel):
    disk_id: str
    mount_path: str
    sub_path: str | None = None
    status: DiskMountStatus
    error: str | None = None


class CreateSandboxBody(BaseModel):
    id: str = Field(pattern=SANDBOX_ID_PATTERN)
    name: str = Field(pattern=SANDBOX_NAME_PATTERN)
    rootfs: str = Field(min_length=1, max_length=128)
    vcpu: int = Field(ge=1, le=256)
    mem_mib: int = Field(ge=32)
    cpu_quota_pct: int | None = Field(default=None, ge=1)
    disk_mib: int = Field(ge=512)
    start_paused: bool = False
    # Egress allowlist as the control plane normalised it (empty: open) and budget (-1: unmetered).
    egress: list[str] = Field(default_factory=list, max_length=1000)
    bandwidth_quota_bytes: int = Field(default=-1, ge=-1)
    # Private-network memberships joined before the boot: programmed during it, so a boot is one call.
    networks: list[NetworkAttachBody] = Field(default_factory=list)
    # S3 disks mounted before the sandbox starts: the gVisor tier cannot mount into a running sandbox,
    # so its disks are bound into the container at its start (drivers/runtime/oci.py); on other tiers they are
    # mounted right after the boot, as an attach would. Each ends ``mounted`` or ``error`` (the
    # sandbox's ``disks``); a disk that fails never fails the create.
    disks: list[DiskMountBody] = Field(default_factory=list, max_length=16)


class CreateSandboxResult(BaseModel):
    id: str
    ip: str
    spawn_ms: float
    status: SandboxStatus


class SandboxView(BaseModel):
    id: str
    name: str
    rootfs: str
    status: SandboxStatus
    status_reason: str | None = None
    ip: str
    vcpu: int
    mem_mib: int
    cpu_quota_pct: int | None
    disk_mib: int
    created_at: float
    last_activity_at: float
    oom_kills: int
    forked_from: str | None = None
    self_request: dict[str, Any] | None = None
    networks: list[NetworkAttachment] = Field(default_factory=list)
    disks: list[DiskMountView] = Field(default_factory=list)
    #: Paused with nothing running and its disk kept (docs/hibernation.md); a resume boots it again.
    hibernated: bool = False


class NetworkAttachment(BaseModel):
    network_id: str
    ip: str
    prefixlen: int
    ifname: str


class ExecBody(BaseModel):
    cmd: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    stdin: str | None = None
    stream: bool = False
    # A name or uid of the sandbox's own /etc/passwd, resolved by the guest; None: the template's USER.
    user: str | None = Field(default=None, min_length=1, max_length=256)


class ExecResult(BaseModel):
    stdout: str
    stderr: str
    exit_code: int
    error: str | None = None
    exec_ms: float
    # Set when a buffered stream was cut at its cap (paddock_hostagent.execution).
    stdout_truncated: bool | None = None
    stderr_truncated: bool | None = None


class ForkBody(BaseModel):
    new_id: str = Field(pattern=SANDBOX_ID_PATTERN)
    name: str = Field(pattern=SANDBOX_NAME_PATTERN)
    start_paused: bool = False
    egress: list[str] = Field(default_factory=list, max_length=1000)
    bandwidth_quota_bytes: int = Field(default=-1, ge=-1)
    # Private-network memberships joined before the boot: programmed during it, so a boot is one call.
    networks: list[NetworkAttachBody] = Field(default_factory=list)


SNAPSHOT_ID_PATTERN = r"^snap_[A-Za-z0-9]{1,64}$"


class SnapshotBody(BaseModel):
    snapshot_id: str = Field(pattern=SNAPSHOT_ID_PATTERN)


class SnapshotView(BaseModel):
    """A snapshot on this host: the image its overlay is of, its disk's size and filesystem, the bytes
    its image holds (shared with the sandboxes booted from it), and, for a new one, how long it took."""

    id: str
    image: str
    fs: str
    disk_mib: int
    source_id: str
    created_at: float
    size_bytes: int
    snapshot_ms: float | None = None


class SnapshotDeleted(BaseModel):
    id: str
    deleted: bool


#: ``vol_`` and a ULID (``paddock_core.ids.new_id``); the host builds its paths from it.
VOLUME_ID_PATTERN = r"^vol_[A-Za-z0-9]{1,36}$"
#: XFS refuses filesystems under 300 MiB; 16 TiB bounds what one call may ask the host for.
MIN_VOLUME_MIB = 300
MAX_VOLUME_MIB = 16 << 20


class VolumeCreateBody(BaseModel):
    volume_id: str = Field(pattern=VOLUME_ID_PATTERN)
    size_mib: int = Field(ge=MIN_VOLUME_MIB, le=MAX_VOLUME_MIB)


class VolumeCloneBody(BaseModel):
    """``POST /volumes/{id}/clone``: the id of the new volume, a copy of that one (a fork's, a snapshot's
    or a boot's from a snapshot). ``snapshot_id``: the copy belongs to that snapshot (``include_volumes``),
    and is removed when the agent starts without the snapshot whole on this host."""

    volume_id: str = Field(pattern=VOLUME_ID_PATTERN)
    snapshot_id: str | None = Field(default=None, pattern=SNAPSHOT_ID_PATTERN)


class VolumeResizeBody(BaseModel):
    size_mib: int = Field(ge=MIN_VOLUME_MIB, le=MAX_VOLUME_MIB)


class VolumeHolder(BaseModel):
    sandbox_id: str
    mount_path: str
    read_only: bool


class VolumeView(BaseModel):
    """A volume on this host: its size, the host disk its sparse image occupies, who holds it."""

    id: str
    size_mib: int
    used_bytes: int
    holders: list[VolumeHolder] = Field(default_factory=list)


EntryKind = Literal["file", "directory", "symlink", "unknown"]


class VolumeEntry(BaseModel):
    """A file, directory or symlink in a volume, as E2B's volume content API shows it (``VolumeEntryStat``):
    ``mode`` is the permission bits, ``target`` a symlink's (never followed)."""

    name: str
    type: EntryKind
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: dt.datetime
    mtime: dt.datetime
    ctime: dt.datetime
    target: str | None = None


#: The largest file one call reads from or writes into a volume without a sandbox (isolation rule 5).
VOLUME_FILE_BYTES = 64 << 20


class VolumeListing(BaseModel):
    entries: list[VolumeEntry]


#: What an entry's owner and mode may be set to (a uid or gid, the permission bits with setuid and sticky).
_OWNER_ID = Field(default=None, ge=0, le=2**32 - 2)
_MODE = Field(default=None, ge=0, le=0o7777)


class VolumeEntryMetadata(BaseModel):
    """An entry's owner and mode, each left as it is when not given."""

    uid: int | None = _OWNER_ID
    gid: int | None = _OWNER_ID
    mode: int | None = _MODE


class VolumeDirBody(VolumeEntryMetadata):
    path: str = Field(max_length=4096)
    #: Make the missing parents too (E2B's ``force``).
    parents: bool = False


class VolumeMetadataBody(VolumeEntryMetadata):
    path: str = Field(max_length=4096)


class VolumeMountBody(BaseModel):
    volume_id: str = Field(pattern=VOLUME_ID_PATTERN)
    mount_path: str = Field(pattern=r"^/.", max_length=4096)
    read_only: bool = False

    # The control plane's rule again: a clean absolute path, not /, /proc, /dev or /sys.
    _mount_path = field_validator("mount_path")(_s3(s3config.mount_path))


class VolumeMountView(BaseModel):
    volume_id: str
    mount_path: str
    read_only: bool


class VolumeDeleted(BaseModel):
    id: str
    deleted: bool


class EgressBody(BaseModel):
    egress: list[str] = Field(default_factory=list, max_length=1000)


class EgressResult(BaseModel):
    id: str
    egress: list[str]


class BandwidthBody(BaseModel):
    quota_bytes: int = Field(ge=-1)


class EgressAttempt(BaseModel):
    """Connections a sandbox tried to open to one address and port since the last record of them
    (``packets`` opening packets, the last at ``at``, epoch seconds), allowed or refused."""

    seq: int
    sandbox_id: str
    at: float
    verdict: Literal["allowed", "refused"]
    address: str
    protocol: str
    port: int
    packets: int


class EgressAttempts(BaseModel):
    """``GET /internal/v1/egress/attempts``: the records after the asked number of this agent run
    (``epoch``), the last number given (``next``) and how many were dropped before being read."""

    epoch: str
    next: int
    lost: int
    attempts: list[EgressAttempt]


class BandwidthResult(BaseModel):
    """Egress bytes counted in the kernel since the sandbox was created, ingress bytes observed, the
    budget (-1: unmetered) and whether it is used up (egress blocked)."""

    id: str
    quota_bytes: int
    egress_bytes: int
    ingress_bytes: int
    capped: bool


#: The most lines one read of a sandbox's log returns (the logs routes' ``tail`` cap).
MAX_LOG_TAIL_LINES = 1000


class SandboxLog(BaseModel):
    """The last lines of one of a sandbox's logs (``source``: boot or guest), and whether older lines
    were left out (by ``tail`` or by the log's bound)."""

    id: str
    source: Literal["boot", "guest"]
    lines: list[str]
    truncated: bool


class ResizeBody(BaseModel):
    disk_mib: int = Field(ge=1)


class ResizeResult(BaseModel):
    disk_mib: int


class StatusResult(BaseModel):
    status: SandboxStatus


class DestroyResult(BaseModel):
    destroyed: bool = True


class DetachResult(BaseModel):
    detached: bool = True


class FileWritten(BaseModel):
    path: str
    size: int


class HostInfo(BaseModel):
    id: str
    free_mib: int
    total_mib: int
    vm_count: int
    rootfses: list[str]
    buildable: list[str]
    labels: dict[str, str]
    runtime: str
    warm_slots: int = 0  # prepared slots waiting in the pool
    parked_slots: int = 0  # of those, slots with a sandbox of the pool image booted in them
    disk_held: list[str] = Field(default_factory=list)  # sandboxes the disk's low watermark holds


# -- template builds (``builds.py``) ------------------------------------------------------------------

BuildStatus = Literal["building", "ready", "failed"]


class BuildBody(BaseModel):
    """One build attempt. ``base`` is what the Dockerfile's ``FROM`` resolved to on the control plane:
    a catalog image name or the id of a ready template; the host rewrites ``FROM`` to its local copy."""

    id: str = Field(pattern=SANDBOX_ID_PATTERN)
    dockerfile: str = Field(min_length=1, max_length=65536)
    base: str = Field(min_length=1, max_length=128)
    attempt: int = Field(ge=1)
    timeout_s: float = Field(gt=0, le=86400)
    vcpu: int = Field(default=1, ge=1, le=64)
    mem_mib: int = Field(default=1024, ge=128)
    egress: list[str] = Field(default_factory=list, max_length=1000)
    #: The build context COPY/ADD read: standard base64 of a tar (gzip allowed) the control plane has
    #: checked (regular files and directories, relative paths); absent: an empty context.
    context_b64: str | None = Field(default=None, max_length=48 * 1024 * 1024)
    #: The account the build is for: its builder storage (images, layer cache) is that account's own;
    #: absent (an older control plane), the template's own.
    owner: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    #: The size of the owner's builder filesystem: what RUN steps see as their disk, and the cap of its
    #: images and cache together.
    disk_mib: int = Field(default=10240, ge=1024, le=1048576)


#: The margin over a template's recorded ext4 size a fetch of its image may use.
FETCH_MARGIN_BYTES = 16 << 20


def fetch_limit(ext4_size_bytes: int) -> int:
    """The most a fetch of an image of that recorded ext4 size may bring (``image_transfer``): an
    image's tree fits in its ext4 image, so its tar does too, but for a margin (a header per member,
    512-byte rounding)."""
    return ext4_size_bytes + ext4_size_bytes // 4 + FETCH_MARGIN_BYTES


class ImageFetchBody(BaseModel):
    """Fetch a template's image from the host that holds it (``image_transfer.py``): that host agent's
    base URL, e.g. ``http://10.0.0.2:8090``."""

    source_url: str = Field(min_length=8, max_length=2048, pattern=r"^https?://")
    #: The most the image may bring (``fetch_limit`` of the template's recorded size); the
    #: host's ``image_fetch_max_mib`` bounds it. A fetch past it is a 413 and leaves nothing.
    limit_bytes: int | None = Field(default=None, ge=1, le=1 << 50)


class ImageFetched(BaseModel):
    image: str
    ext4_size_bytes: int = 0


class BuildLine(BaseModel):
    ts: float
    level: str
    line: str


class BuildView(BaseModel):
    id: str
    attempt: int
    status: BuildStatus
    lines: list[BuildLine] = Field(default_factory=list)
    next: int = 0  # pass back as ``after`` to read only the lines that follow
    ext4_size_bytes: int = 0
    error: str | None = None


# -- managed processes (``processes.py``, spec §12.2) ----------------------------------------------

ProcessSignal = Literal["SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGWINCH"]
# A terminal's rows and columns: what a real screen can hold, well inside the kernel's 16 bits.
MAX_TERMINAL_SIDE = 10000


class ProcessPty(BaseModel):
    rows: int = Field(default=24, ge=1, le=MAX_TERMINAL_SIDE)
    cols: int = Field(default=80, ge=1, le=MAX_TERMINAL_SIDE)


class ProcessStartBody(BaseModel):
    """Without ``cmd`` a PTY gets a login-like shell (``bash -l``), a plain process is refused."""

    cmd: str | None = Field(default=None, min_length=1, max_length=65536)
    args: list[str] = Field(default_factory=list, max_length=65536)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = Field(default=None, min_length=1, max_length=4096)
    pty: ProcessPty | None = None
    user: str | None = Field(default=None, min_length=1, max_length=256)  # as ExecBody.user


class ProcessStreamBody(ProcessStartBody):
    """``POST …/processes/stream``: a start whose answer is the process's connect stream, so that a
    caller that runs a command and reads it (E2B's ``commands.run``) makes one call, not three.
    ``close_stdin`` closes its stdin as the stream opens (a command that reads none gets EOF)."""

    close_stdin: bool = False


class ProcessForeground(BaseModel):
    pid: int
    cmd: str
    args: list[str] = Field(default_factory=list)


class ProcessOutputRange(BaseModel):
    oldest_seq: int
    newest_seq: int
    bytes: int


class ProcessView(BaseModel):
    """The ManagedProcess object of spec §12.2."""

    process_id: str
    kind: Literal["process", "pty"]
    pid: int
    state: Literal["starting", "running", "terminating", "exited", "failed"]
    leader_exited: bool
    tree_exited: bool
    created_at: str
    finished_at: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    cmd: str
    args: list[str]
    cwd: str
    foreground: ProcessForeground | None = None
    output: ProcessOutputRange


class ProcessList(BaseModel):
    processes: list[ProcessView]


class ProcessInputBody(BaseModel):
    data_base64: str = Field(max_length=(1 << 20) * 4 // 3 + 4)


class ProcessInputResult(BaseModel):
    input_seq: int


class ProcessResizeBody(BaseModel):
    rows: int | None = Field(default=None, ge=1, le=MAX_TERMINAL_SIDE)
    cols: int | None = Field(default=None, ge=1, le=MAX_TERMINAL_SIDE)


class ProcessSignalBody(BaseModel):
    signal: ProcessSignal


class OkResult(BaseModel):
    ok: bool = True


class ProcessFrame(BaseModel):
    """One line of a connect stream (spec §12.2): ``data``, ``exit``, ``heartbeat`` or ``error``; a
    stream opened by a start (``ProcessStreamBody``) begins with one ``start`` holding the process."""

    type: Literal["start", "data", "exit", "heartbeat", "error"]
    process: ProcessView | None = None
    seq: int | None = None
    stream: Literal["stdout", "stderr", "pty"] | None = None
    data_base64: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    oldest_available_seq: int | None = None


class SandboxStats(BaseModel):
    """One sandbox's resource use as the host sees it (``GET /internal/v1/stats``). ``cpu_pct`` is the
    percent of its CPU allotment (``vcpu`` CPUs, or ``cpu_quota_pct`` of one) used since the agent's
    previous reading of it; None on the first reading. Network counters are the sandbox's own view:
    ``net_rx_bytes`` what it received, cumulative since its interface was made."""

    id: str
    status: Literal["running", "paused"]
    vcpu: int
    cpu_usage_ns: int
    cpu_pct: float | None
    mem_used_bytes: int
    mem_limit_bytes: int
    disk_used_bytes: int
    disk_limit_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int


class HostStats(BaseModel):
    """Every live sandbox of the host, read at ``at`` (unix seconds); ``took_ms`` is what reading them
    cost the agent."""

    at: float
    took_ms: float
    sandboxes: list[SandboxStats]
