"""``HostAgentClient``: the one way the control plane talks to a host agent (internal HTTP API).

Requests and answers are the models of ``schemas.py``, the contract the host agent's routes use too.
Imports nothing of the host agent but that module (pydantic) and the kept channel's two
(``channelwire``, ``channelclient``: the standard library and aiohttp), so the control plane can use it
without the host agent's other dependencies. The buffered exec (the hot path), pause and resume go
over the kept channel, one WebSocket to the agent that carries many calls at once, and over HTTP when
the channel cannot carry it (down, refused, an agent without it); other request/response calls go
over aiohttp, which costs about half of httpx's CPU per request here, and so do downloads; streams and
uploads use httpx. ``request_id`` (a callable) names the caller's request: it is sent as
``X-Request-Id`` and the host agent logs its line for the call under that id.

    HostAgentError                .status, .code (the agent's ``error`` field)
    ├── HostUnavailableError      no answer (connection refused, timeout, dropped stream or channel)
    ├── SandboxMissingError       404 unknown sandbox
    ├── GuestFileNotFoundError    404 file_not_found
    ├── ParentNotFoundError       404 parent_not_found
    ├── IsDirectoryError          400 is_directory
    ├── BadPathError              400 bad_path
    ├── UnknownImageError         400 unknown_image (not in the catalog, or not buildable on that host)
    ├── BadStateError             409 (the sandbox is not in a state for this; or the id already exists)
    │   └── UnsupportedOnTierError 409 unsupported_on_tier (the sandbox's isolation tier does not offer it)
    ├── ProcessMissingError       404 process_not_found (managed processes, spec §12.2)
    ├── ProcessStateError         409 process_state (no terminal to resize, the process has exited …)
    ├── SpawnFailedError          400 spawn_failed (a managed process's command did not start)
    ├── UnknownUserError          400 unknown_user (no such user in the sandbox's /etc/passwd)
    ├── HostBusyError             503 busy (the sandbox takes no more requests now; retry after a second)
    ├── TooLargeError             413 payload_too_large (over one of the agent's bounds: a body, a file)
    ├── SandboxDiskFullError      507 sandbox_disk_full (the sandbox's own disk is full: not the host's)
    └── InsufficientCapacityError 507 (no memory, addresses or disk left on that host)

Any other answer (400 bad_request, 401, 500 sandbox_failed, an answer that is not the contract's …) is
a plain ``HostAgentError`` with its ``status`` and ``code``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from ipaddress import IPv4Address
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from paddock_core import tls
from paddock_hostagent import channelwire
from paddock_hostagent.channelclient import AgentChannel, ChannelLostError, ChannelStreamLaggedError
from paddock_hostagent.schemas import (
    BandwidthBody,
    BandwidthResult,
    BuildBody,
    BuildView,
    CreateSandboxBody,
    CreateSandboxResult,
    DestroyResult,
    DetachResult,
    DiskMountBody,
    DiskMountView,
    EgressAttempts,
    EgressBody,
    EgressResult,
    ExecBody,
    ExecResult,
    FileWritten,
    ForkBody,
    HostInfo,
    HostStats,
    ImageFetchBody,
    ImageFetched,
    NetworkAttachBody,
    NetworkAttachment,
    OkResult,
    ProcessFrame,
    ProcessInputBody,
    ProcessInputResult,
    ProcessList,
    ProcessResizeBody,
    ProcessSignalBody,
    ProcessStartBody,
    ProcessStreamBody,
    ProcessView,
    ResizeBody,
    ResizeResult,
    SandboxLog,
    SandboxView,
    SnapshotBody,
    SnapshotDeleted,
    SnapshotView,
    StatusResult,
    VolumeCloneBody,
    VolumeCreateBody,
    VolumeDeleted,
    VolumeDirBody,
    VolumeEntry,
    VolumeEntryMetadata,
    VolumeListing,
    VolumeMetadataBody,
    VolumeMountBody,
    VolumeMountView,
    VolumeResizeBody,
    VolumeView,
)

Answer = TypeVar("Answer")


class HostAgentError(Exception):
    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class HostUnavailableError(HostAgentError):
    pass


class SandboxMissingError(HostAgentError):
    pass


class GuestFileNotFoundError(HostAgentError):
    pass


class ParentNotFoundError(HostAgentError):
    pass


class IsDirectoryError(HostAgentError):
    pass


class BadStateError(HostAgentError):
    pass


class UnsupportedOnTierError(BadStateError):
    pass


class BadPathError(HostAgentError):
    pass


class UnknownImageError(HostAgentError):
    pass


class InsufficientCapacityError(HostAgentError):
    pass


class ProcessMissingError(HostAgentError):
    pass


class ProcessStateError(HostAgentError):
    pass


class SpawnFailedError(HostAgentError):
    pass


class UnknownUserError(HostAgentError):
    pass


class HostBusyError(HostAgentError):
    pass


class TooLargeError(HostAgentError):
    pass


class SandboxDiskFullError(HostAgentError):
    pass


#: The agent's error codes, then its statuses, to our classes: one table (errors.py is the other side).
#: 507 is capacity whatever the body says: callers place elsewhere or answer 503 on it, so it must not
#: depend on the agent's wording or code.
#: The one exception: a sandbox whose own disk is full (an upload met ENOSPC) says so by its code.
_BY_CODE_FIRST: dict[str, type[HostAgentError]] = {"sandbox_disk_full": SandboxDiskFullError}
_BY_STATUS_FIRST: dict[int, type[HostAgentError]] = {507: InsufficientCapacityError}
_BY_CODE: dict[str, type[HostAgentError]] = {
    "busy": HostBusyError,
    "file_not_found": GuestFileNotFoundError,
    "parent_not_found": ParentNotFoundError,
    "is_directory": IsDirectoryError,
    "sandbox_not_found": SandboxMissingError,
    "bad_path": BadPathError,
    "unknown_image": UnknownImageError,
    "process_not_found": ProcessMissingError,
    "process_state": ProcessStateError,
    "spawn_failed": SpawnFailedError,
    "unknown_user": UnknownUserError,
    "unsupported_on_tier": UnsupportedOnTierError,
    "payload_too_large": TooLargeError,
}
_BY_STATUS: dict[int, type[HostAgentError]] = {404: SandboxMissingError, 409: BadStateError}
#: What the transports raise when the agent does not answer.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    aiohttp.ClientError,
    httpx.TransportError,
    ChannelLostError,
)
# Creating or forking may first build the image (minutes for devbox:1); the agent answers when booted.
# Snapshots and volume copies wait as long: the agent answers once the copy is whole, and sends nothing
# before, so one such call ends within these two (the control plane's reconciler counts on it).
CREATE_TIMEOUT_S = 900.0
CONNECT_TIMEOUT_S = 5.0
_CREATE_TIMEOUT = httpx.Timeout(CREATE_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
# A command may run for as long as it likes; only connecting is bounded.
_EXEC_TIMEOUT = httpx.Timeout(None, connect=5.0)
# Mounting and making filesystems (S3 disks, volumes): the host bounds its own wait below this.
_MOUNT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
_VIEWS = TypeAdapter(list[SandboxView])
# How much of an answer aiohttp buffers before it stops reading the socket; downloads arrive in
# chunks of about this size.
_READ_BUFFER_BYTES = 1 << 20


def error_from(status: int, body: bytes) -> HostAgentError:
    """The exception for an error answer (``{"error": code, "message": ...}``)."""
    code, message = None, f"host agent answered {status}"
    with contextlib.suppress(ValueError, AttributeError):
        doc = json.loads(body)
        code = doc.get("error")
        message = str(doc.get("message") or message)
    cls = (
        _BY_CODE_FIRST.get(code or "")
        or _BY_STATUS_FIRST.get(status)
        or _BY_CODE.get(code or "")
        or _BY_STATUS.get(status, HostAgentError)
    )
    return cls(message, status=status, code=code)


@contextlib.contextmanager
def _answered() -> Iterator[None]:
    """No answer at all becomes :class:`HostUnavailableError` (httpx's ``map_exceptions``, one place)."""
    try:
        yield
    except _TRANSPORT_ERRORS as exc:
        raise HostUnavailableError(str(exc) or type(exc).__name__) from exc


def _parse(parse: Callable[[bytes], Answer], status: int, body: bytes) -> Answer:
    try:
        return parse(body)
    except ValidationError as exc:
        raise HostAgentError(f"host agent answered outside the contract: {exc}", status=status) from None


def _aiohttp_timeout(timeout: httpx.Timeout | float | None, default: httpx.Timeout) -> aiohttp.ClientTimeout:
    if not isinstance(timeout, httpx.Timeout):
        timeout = default if timeout is None else httpx.Timeout(timeout, connect=5.0)
    return aiohttp.ClientTimeout(total=None, connect=timeout.connect, sock_read=timeout.read)


#: How long an idle connection to the agent is kept for reuse: under the agent's own keep-alive
#: (``paddock_core.serving.KEEP_ALIVE_S``, 5 s), after which the agent closes it. Kept longer (30 s
#: before), a call could go out on a connection the agent had just closed, before this loop had read
#: the close (a busy loop reads it late): the call failed ("Can not write request body", a 500).
IDLE_REUSE_S = 4.0


class HostAgentClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 60.0,
        request_id: Callable[[], str | None] | None = None,
        channel: bool = True,
    ) -> None:
        """``channel=False``: every call over HTTP (the kept channel is for the control plane's hot
        calls; tools and tests that want the HTTP routes themselves turn it off)."""
        self._base = base_url.rstrip("/") + "/internal/v1/"
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = httpx.Timeout(timeout_s, connect=5.0)
        self._request_id = request_id
        self._http = httpx.AsyncClient(
            base_url=self._base,
            headers=self._headers,
            timeout=self._timeout,
            limits=httpx.Limits(
                max_keepalive_connections=64, max_connections=256, keepalive_expiry=IDLE_REUSE_S
            ),
            verify=tls.client_context(),  # shared: httpx would load the CA bundle for each host's link
        )
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside the event loop
        self.channel = AgentChannel(base_url, self._headers, self._aiohttp) if channel else None

    def _aiohttp(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=256, limit_per_host=256, keepalive_timeout=IDLE_REUSE_S),
                read_bufsize=_READ_BUFFER_BYTES,
                json_serialize=lambda doc: json.dumps(doc, separators=(",", ":")),
            )
        return self._session

    async def aclose(self) -> None:
        if self.channel is not None:
            await self.channel.aclose()
        await self._http.aclose()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> HostAgentClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _call_headers(self) -> dict[str, str]:
        request_id = self._request_id() if self._request_id is not None else None
        return {"X-Request-Id": request_id} if request_id else {}

    async def _call(
        self,
        method: str,
        path: str,
        parse: Callable[[bytes], Answer],
        *,
        body: BaseModel | None = None,
        params: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        content: AsyncIterator[bytes] | None = None,
    ) -> Answer:
        headers = self._call_headers()
        if content is not None:  # streamed request bodies go through httpx
            with _answered():
                resp = await self._http.request(method, path, params=params, content=content, headers=headers)
            if resp.status_code >= 400:
                raise error_from(resp.status_code, resp.content)
            return _parse(parse, resp.status_code, resp.content)
        with _answered():
            async with self._aiohttp().request(
                method,
                self._base + path,
                json=body.model_dump(mode="json") if body is not None else None,
                params=params,
                headers=headers,
                timeout=_aiohttp_timeout(timeout, self._timeout),
            ) as answer:
                raw = await answer.read()
        if answer.status >= 400:
            raise error_from(answer.status, raw)
        return _parse(parse, answer.status, raw)

    async def _hot_call(
        self,
        op: int,
        sandbox_id: str,
        path: str,
        parse: Callable[[bytes], Answer],
        *,
        body: BaseModel | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> Answer:
        """``POST <path>`` over the kept channel, or over HTTP when the channel cannot carry it (down,
        refused, an agent without it or without that call, a body too big). Errors are raised alike
        either way, and the HTTP call's read timeout bounds the wait on the channel too."""
        if self.channel is not None:
            raw_body = body.model_dump_json().encode() if body is not None else b""
            request_id = self._request_id() if self._request_id is not None else None
            with _answered():
                async with asyncio.timeout((timeout or self._timeout).read):
                    answer = await self.channel.call(op, sandbox_id, request_id or "", raw_body)
            if answer is not None:
                status, raw = answer
                if status >= 400:
                    raise error_from(status, raw)
                return _parse(parse, status, raw)
        return await self._call("POST", path, parse, body=body, timeout=timeout)

    @staticmethod
    def _sb(sandbox_id: str, *rest: str) -> str:
        return "/".join(["sandboxes", quote(sandbox_id, safe=""), *rest])

    async def info(self) -> HostInfo:
        return await self._call("GET", "info", HostInfo.model_validate_json)

    async def stats(self) -> HostStats:
        """Every live sandbox's resource use (the metrics worker's pull, stats.py)."""
        return await self._call("GET", "stats", HostStats.model_validate_json)

    async def create_sandbox(self, body: CreateSandboxBody) -> CreateSandboxResult:
        """Answers once the sandbox's guest agent answers (and its ``networks`` are joined)."""
        return await self._hot_call(
            channelwire.OP_CREATE,
            "",
            "sandboxes",
            CreateSandboxResult.model_validate_json,
            body=body,
            timeout=_CREATE_TIMEOUT,
        )

    async def list_sandboxes(self) -> list[SandboxView]:
        return await self._call("GET", "sandboxes", _VIEWS.validate_json)

    async def get_sandbox(self, sandbox_id: str) -> SandboxView:
        return await self._call("GET", self._sb(sandbox_id), SandboxView.model_validate_json)

    async def pause_sandbox(self, sandbox_id: str) -> StatusResult:
        return await self._hot_call(
            channelwire.OP_PAUSE, sandbox_id, self._sb(sandbox_id, "pause"), StatusResult.model_validate_json
        )

    async def resume_sandbox(self, sandbox_id: str) -> StatusResult:
        return await self._hot_call(
            channelwire.OP_RESUME,
            sandbox_id,
            self._sb(sandbox_id, "resume"),
            StatusResult.model_validate_json,
        )

    async def hibernate_sandbox(self, sandbox_id: str) -> StatusResult:
        """Stops the sandbox, keeping only its disk (answers once its slot is free)."""
        return await self._call(
            "POST",
            self._sb(sandbox_id, "hibernate"),
            StatusResult.model_validate_json,
            timeout=_CREATE_TIMEOUT,
        )

    async def wake_sandbox(self, sandbox_id: str) -> CreateSandboxResult:
        """Boots a hibernated sandbox from its kept disk; answers its (perhaps new) address."""
        return await self._call(
            "POST",
            self._sb(sandbox_id, "wake"),
            CreateSandboxResult.model_validate_json,
            timeout=_CREATE_TIMEOUT,
        )

    async def fork_sandbox(self, sandbox_id: str, body: ForkBody) -> CreateSandboxResult:
        return await self._hot_call(
            channelwire.OP_FORK,
            sandbox_id,
            self._sb(sandbox_id, "fork"),
            CreateSandboxResult.model_validate_json,
            body=body,
            timeout=_CREATE_TIMEOUT,
        )

    async def set_egress(self, sandbox_id: str, rules: list[str]) -> EgressResult:
        """Replaces the allowlist of a running or paused sandbox."""
        return await self._call(
            "PUT",
            self._sb(sandbox_id, "egress"),
            EgressResult.model_validate_json,
            body=EgressBody(egress=rules),
        )

    async def egress_attempts(self, epoch: str, after: int, limit: int = 1000) -> EgressAttempts:
        """The sandboxes' connection attempts after number ``after`` of agent run ``epoch`` (the audit
        trail's poll)."""
        params = {"epoch": epoch, "after": str(after), "limit": str(limit)}
        return await self._call("GET", "egress/attempts", EgressAttempts.model_validate_json, params=params)

    async def logs(self, sandbox_id: str, source: str, tail: int) -> SandboxLog:
        """The last ``tail`` lines of the sandbox's ``source`` log (boot or guest)."""
        params = {"source": source, "tail": str(tail)}
        return await self._call(
            "GET", self._sb(sandbox_id, "logs"), SandboxLog.model_validate_json, params=params
        )

    async def get_bandwidth(self, sandbox_id: str) -> BandwidthResult:
        """The counters as the kernel has them right now."""
        return await self._call("GET", self._sb(sandbox_id, "bandwidth"), BandwidthResult.model_validate_json)

    async def set_bandwidth(self, sandbox_id: str, quota_bytes: int) -> BandwidthResult:
        """A new total egress budget (-1: unmetered); answers the counters like ``get_bandwidth``."""
        return await self._call(
            "PUT",
            self._sb(sandbox_id, "bandwidth"),
            BandwidthResult.model_validate_json,
            body=BandwidthBody(quota_bytes=quota_bytes),
        )

    async def snapshot_sandbox(self, sandbox_id: str, snapshot_id: str) -> SnapshotView:
        """Copies the sandbox's disk into a snapshot kept on this host (answers once it is whole)."""
        return await self._call(
            "POST",
            self._sb(sandbox_id, "snapshots"),
            SnapshotView.model_validate_json,
            body=SnapshotBody(snapshot_id=snapshot_id),
            timeout=_CREATE_TIMEOUT,
        )

    async def get_snapshot(self, snapshot_id: str) -> SnapshotView:
        """The whole snapshot ``snapshot_id`` as this host keeps it; one it does not hold, or holds only
        half-written (``.partial-``), is a 404."""
        path = "/".join(["snapshots", quote(snapshot_id, safe="")])
        return await self._call("GET", path, SnapshotView.model_validate_json)

    async def delete_snapshot(self, snapshot_id: str) -> SnapshotDeleted:
        path = "/".join(["snapshots", quote(snapshot_id, safe="")])
        return await self._call("DELETE", path, SnapshotDeleted.model_validate_json)

    async def resize_sandbox(self, sandbox_id: str, disk_mib: int) -> ResizeResult:
        return await self._call(
            "POST",
            self._sb(sandbox_id, "resize"),
            ResizeResult.model_validate_json,
            body=ResizeBody(disk_mib=disk_mib),
        )

    async def destroy_sandbox(self, sandbox_id: str) -> DestroyResult:
        return await self._call("DELETE", self._sb(sandbox_id), DestroyResult.model_validate_json)

    async def attach_network(
        self, sandbox_id: str, *, network_id: str, ip: str, prefixlen: int
    ) -> NetworkAttachment:
        """Puts the sandbox on the network's bridge with ``ip/prefixlen``; idempotent. The answer's
        ``ifname`` is the interface inside the sandbox."""
        body = NetworkAttachBody(network_id=network_id, ip=IPv4Address(ip), prefixlen=prefixlen)
        return await self._call(
            "POST", self._sb(sandbox_id, "networks"), NetworkAttachment.model_validate_json, body=body
        )

    async def detach_network(self, sandbox_id: str, network_id: str) -> DetachResult:
        """Removes the sandbox's interface on that network; idempotent."""
        path = self._sb(sandbox_id, "networks", quote(network_id, safe=""))
        return await self._call("DELETE", path, DetachResult.model_validate_json)

    async def start_build(self, body: BuildBody) -> BuildView:
        """Starts one template build attempt in the background (the same attempt again is a no-op)."""
        return await self._call("POST", "builds", BuildView.model_validate_json, body=body)

    async def get_build(self, build_id: str, *, after: int = 0) -> BuildView:
        """The attempt's status and its log lines from ``after`` on (an unknown build: 404)."""
        path = "builds/" + quote(build_id, safe="")
        return await self._call("GET", path, BuildView.model_validate_json, params={"after": str(after)})

    async def delete_build(self, build_id: str) -> DestroyResult:
        """Cancels a running attempt and removes the template's image once no sandbox uses it."""
        return await self._call(
            "DELETE", "builds/" + quote(build_id, safe=""), DestroyResult.model_validate_json
        )

    async def fetch_image(self, image: str, source_url: str, limit_bytes: int | None = None) -> ImageFetched:
        """Has this host pull a template's image from the host agent at ``source_url`` (which holds
        it); answers once it is installed, so the timeout is a long one."""
        return await self._call(
            "POST",
            "images/" + quote(image, safe="") + "/fetch",
            ImageFetched.model_validate_json,
            body=ImageFetchBody(source_url=source_url, limit_bytes=limit_bytes),
            timeout=httpx.Timeout(1800.0, connect=10.0),
        )

    async def attach_disk(self, sandbox_id: str, body: DiskMountBody) -> DiskMountView:
        """Mounts an S3 disk into the sandbox; answers once it is ``mounted`` or ``error`` (the host
        bounds the wait), so the timeout is longer than a call's default."""
        return await self._call(
            "POST",
            self._sb(sandbox_id, "disks"),
            DiskMountView.model_validate_json,
            body=body,
            timeout=_MOUNT_TIMEOUT,
        )

    async def detach_disk(self, sandbox_id: str, mount_path: str) -> DetachResult:
        """Unmounts the disk at ``mount_path``; idempotent."""
        return await self._call(
            "DELETE",
            self._sb(sandbox_id, "disks"),
            DetachResult.model_validate_json,
            params={"mount_path": mount_path},
            timeout=_MOUNT_TIMEOUT,
        )

    # -- local volumes (issue #34) --------------------------------------------------------------

    async def create_volume(self, body: VolumeCreateBody) -> VolumeView:
        """Makes the volume's file and filesystem (mkfs: a longer timeout than a call's default)."""
        return await self._call(
            "POST",
            "volumes",
            VolumeView.model_validate_json,
            body=body,
            timeout=_MOUNT_TIMEOUT,
        )

    async def clone_volume(self, source_id: str, body: VolumeCloneBody) -> VolumeView:
        """Makes ``body.volume_id`` a copy of the volume ``source_id`` (a fork's or a snapshot's
        ``include_volumes``, a boot from such a snapshot). Bounded as a create: where the state
        filesystem cannot reflink, the copy reads and writes every byte the volume holds (seconds per GB),
        and a caller that gave up earlier would leave the host making a copy nobody records."""
        return await self._call(
            "POST",
            "volumes/" + quote(source_id, safe="") + "/clone",
            VolumeView.model_validate_json,
            body=body,
            timeout=_CREATE_TIMEOUT,
        )

    async def get_volume(self, volume_id: str) -> VolumeView:
        """The volume as this host keeps it (its size and the bytes it holds); one it does not hold is a
        400 naming it."""
        return await self._call("GET", "volumes/" + quote(volume_id, safe=""), VolumeView.model_validate_json)

    async def resize_volume(self, volume_id: str, size_mib: int) -> VolumeView:
        return await self._call(
            "PATCH",
            "volumes/" + quote(volume_id, safe=""),
            VolumeView.model_validate_json,
            body=VolumeResizeBody(size_mib=size_mib),
            timeout=_MOUNT_TIMEOUT,
        )

    async def delete_volume(self, volume_id: str) -> VolumeDeleted:
        return await self._call(
            "DELETE",
            "volumes/" + quote(volume_id, safe=""),
            VolumeDeleted.model_validate_json,
            timeout=_MOUNT_TIMEOUT,
        )

    # A volume's files without a sandbox (E2B's volume content API; sandboxes/volume_content.py). The
    # volume is mounted for the call when no sandbox holds it: a mount's time on top of a call's.

    def _content(self, volume_id: str, what: str) -> str:
        return "volumes/" + quote(volume_id, safe="") + "/content/" + what

    async def stat_volume_path(self, volume_id: str, path: str) -> VolumeEntry:
        return await self._call(
            "GET",
            self._content(volume_id, "path"),
            VolumeEntry.model_validate_json,
            params={"path": path},
            timeout=_MOUNT_TIMEOUT,
        )

    async def list_volume_dir(self, volume_id: str, path: str, depth: int) -> VolumeListing:
        return await self._call(
            "GET",
            self._content(volume_id, "dir"),
            VolumeListing.model_validate_json,
            params={"path": path, "depth": str(depth)},
            timeout=_MOUNT_TIMEOUT,
        )

    async def make_volume_dir(self, volume_id: str, body: VolumeDirBody) -> VolumeEntry:
        return await self._call(
            "POST",
            self._content(volume_id, "dir"),
            VolumeEntry.model_validate_json,
            body=body,
            timeout=_MOUNT_TIMEOUT,
        )

    async def read_volume_file(self, volume_id: str, path: str) -> bytes:
        return await self._call(
            "GET", self._content(volume_id, "file"), bytes, params={"path": path}, timeout=_MOUNT_TIMEOUT
        )

    async def write_volume_file(
        self, volume_id: str, path: str, data: bytes, metadata: VolumeEntryMetadata
    ) -> VolumeEntry:
        params = {"path": path} | {
            key: str(value) for key, value in metadata.model_dump(exclude_none=True).items()
        }

        async def body() -> AsyncIterator[bytes]:
            yield data

        return await self._call(
            "PUT",
            self._content(volume_id, "file"),
            VolumeEntry.model_validate_json,
            params=params,
            content=body(),
            timeout=_MOUNT_TIMEOUT,
        )

    async def update_volume_path(self, volume_id: str, body: VolumeMetadataBody) -> VolumeEntry:
        return await self._call(
            "PATCH",
            self._content(volume_id, "path"),
            VolumeEntry.model_validate_json,
            body=body,
            timeout=_MOUNT_TIMEOUT,
        )

    async def remove_volume_path(self, volume_id: str, path: str) -> None:
        await self._call(
            "DELETE", self._content(volume_id, "path"), bytes, params={"path": path}, timeout=_MOUNT_TIMEOUT
        )

    async def attach_volume(self, sandbox_id: str, body: VolumeMountBody) -> VolumeMountView:
        return await self._call(
            "POST",
            self._sb(sandbox_id, "volumes"),
            VolumeMountView.model_validate_json,
            body=body,
            timeout=_MOUNT_TIMEOUT,
        )

    async def detach_volume(self, sandbox_id: str, volume_id: str) -> DetachResult:
        return await self._call(
            "DELETE",
            self._sb(sandbox_id, "volumes", quote(volume_id, safe="")),
            DetachResult.model_validate_json,
            timeout=_MOUNT_TIMEOUT,
        )

    async def exec(
        self,
        sandbox_id: str,
        *,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        stdin: str | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        body = ExecBody(cmd=cmd, args=args, env=env, stdin=stdin, cwd=cwd, stream=False, user=user)
        return await self._hot_call(
            channelwire.OP_EXEC,
            sandbox_id,
            self._sb(sandbox_id, "exec"),
            ExecResult.model_validate_json,
            body=body,
            timeout=_EXEC_TIMEOUT,
        )

    async def exec_stream(
        self,
        sandbox_id: str,
        *,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        stdin: str | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Frames (``{"stdout"|"stderr"|"error": str}``, a last ``{"exit_code": int}``) as the command
        produces them; leaving the iteration early kills the command."""
        body = ExecBody(cmd=cmd, args=args, env=env, stdin=stdin, cwd=cwd, stream=True, user=user)
        with _answered():
            async with self._http.stream(
                "POST",
                self._sb(sandbox_id, "exec"),
                json=body.model_dump(mode="json"),
                headers=self._call_headers(),
                timeout=_EXEC_TIMEOUT,
            ) as resp:
                if resp.status_code >= 400:
                    raise error_from(resp.status_code, await resp.aread())
                async for line in resp.aiter_lines():
                    if line.strip():
                        yield json.loads(line)

    async def upload(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> FileWritten:
        return await self._call(
            "PUT",
            self._sb(sandbox_id, "files"),
            FileWritten.model_validate_json,
            params={"path": path},
            content=chunks,
        )

    async def download(self, sandbox_id: str, path: str) -> tuple[int | None, AsyncIterator[bytes]]:
        """Open a download: returns (size, chunks). Errors are raised before any byte is returned.

        Over aiohttp, whose chunks are whatever has arrived (up to ``_READ_BUFFER_BYTES`` or so): httpx
        hands over 64 KiB at a time through its Python HTTP parser, which cost the control plane ~1.5 ms
        of CPU per MB passed through."""
        with _answered():
            answer = await self._aiohttp().get(
                self._base + self._sb(sandbox_id, "files"),
                params={"path": path},
                headers=self._call_headers(),
                timeout=_aiohttp_timeout(None, self._timeout),
            )
        if answer.status >= 400:
            try:
                with _answered():
                    body = await answer.read()
            finally:
                answer.close()
            raise error_from(answer.status, body)
        length = answer.headers.get("content-length")

        async def chunks() -> AsyncIterator[bytes]:
            complete = False
            try:
                with _answered():
                    async for chunk in answer.content.iter_any():
                        yield chunk
                complete = True
            finally:
                # A download left half-read must not go back to the pool with its rest unread.
                if complete:
                    answer.release()
                else:
                    answer.close()

        return (int(length) if length and length.isdigit() else None), chunks()

    async def watch(
        self, sandbox_id: str, path: str, *, recursive: bool
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Opens a directory watch (the guest's inotify, ``watches.py``): refusals (404, 400, 409 when the
        sandbox's guest has no watch to give) are raised here, before any line. Then its NDJSON lines, the
        first ``{"watching": …}``, until the watch ends or the iterator is closed (which ends it)."""
        request = self._http.build_request(
            "GET",
            self._sb(sandbox_id, "files", "watch"),
            params={"path": path, "recursive": "true" if recursive else "false"},
            headers=self._call_headers(),
            timeout=_EXEC_TIMEOUT,
        )
        with _answered():
            resp = await self._http.send(request, stream=True)
        if resp.status_code >= 400:
            body = await resp.aread()
            await resp.aclose()
            raise error_from(resp.status_code, body)

        async def lines() -> AsyncGenerator[dict[str, Any], None]:
            try:
                with _answered():
                    async for line in resp.aiter_lines():
                        if line.strip():
                            yield json.loads(line)
            finally:
                await resp.aclose()

        return lines()

    # -- managed processes (spec §12.2; the host agent's ``processes.py``) ----------------------------

    def _proc(self, sandbox_id: str, *rest: str) -> str:
        return self._sb(sandbox_id, "processes", *(quote(part, safe="") for part in rest))

    async def start_process(self, sandbox_id: str, body: ProcessStartBody) -> ProcessView:
        return await self._call("POST", self._proc(sandbox_id), ProcessView.model_validate_json, body=body)

    async def list_processes(self, sandbox_id: str) -> ProcessList:
        return await self._call("GET", self._proc(sandbox_id), ProcessList.model_validate_json)

    async def get_process(self, sandbox_id: str, process_id: str) -> ProcessView:
        return await self._call("GET", self._proc(sandbox_id, process_id), ProcessView.model_validate_json)

    async def kill_process(self, sandbox_id: str, process_id: str, grace_ms: int) -> ProcessView:
        return await self._call(
            "DELETE",
            self._proc(sandbox_id, process_id),
            ProcessView.model_validate_json,
            params={"grace_ms": str(grace_ms)},
        )

    async def process_input(self, sandbox_id: str, process_id: str, data_base64: str) -> ProcessInputResult:
        return await self._call(
            "POST",
            self._proc(sandbox_id, process_id) + "/input",
            ProcessInputResult.model_validate_json,
            body=ProcessInputBody(data_base64=data_base64),
        )

    async def close_process_stdin(self, sandbox_id: str, process_id: str) -> OkResult:
        path = self._proc(sandbox_id, process_id) + "/stdin/close"
        return await self._call("POST", path, OkResult.model_validate_json)

    async def resize_process(self, sandbox_id: str, process_id: str, body: ProcessResizeBody) -> ProcessView:
        path = self._proc(sandbox_id, process_id) + "/resize"
        return await self._call("POST", path, ProcessView.model_validate_json, body=body)

    async def signal_process(self, sandbox_id: str, process_id: str, body: ProcessSignalBody) -> ProcessView:
        path = self._proc(sandbox_id, process_id) + "/signal"
        return await self._call("POST", path, ProcessView.model_validate_json, body=body)

    async def wait_process(
        self, sandbox_id: str, process_id: str, *, scope: str, timeout_ms: int
    ) -> ProcessView:
        """Long-polls on the host until the scope has exited or ``timeout_ms`` passed."""
        return await self._call(
            "GET",
            self._proc(sandbox_id, process_id) + "/wait",
            ProcessView.model_validate_json,
            params={"scope": scope, "timeout_ms": str(timeout_ms)},
            timeout=httpx.Timeout(timeout_ms / 1000 + 30.0, connect=5.0),
        )

    async def start_streaming(
        self, sandbox_id: str, body: ProcessStreamBody
    ) -> tuple[ProcessView, AsyncGenerator[ProcessFrame, None]] | None:
        """Starts a process and opens its stream in one call (``POST …/processes/stream``): its view,
        then its frames from its first output. ``None`` from an agent that predates the call (405):
        the caller makes the three calls it stands for. Errors are raised here, before any frame.

        Over the kept channel when it carries the call (``channelwire.OP_PROCESS_STREAM``), else over
        HTTP. A channel stream that ends early (the channel dropped, or its reader fell behind) goes
        on over HTTP from the last output it gave: the process runs on in the guest, which keeps its
        output, so the caller sees one stream either way."""
        if self.channel is not None:
            request_id = self._request_id() if self._request_id is not None else None
            raw = body.model_dump_json(exclude_none=True).encode()
            with _answered():
                async with asyncio.timeout(self._timeout.read):
                    opened = await self.channel.stream(
                        channelwire.OP_PROCESS_STREAM, sandbox_id, request_id or "", raw
                    )
            if opened is not None:
                status, head, streamed = opened
                if status >= 400 or streamed is None:
                    raise error_from(status, head)
                view = _parse(ProcessView.model_validate_json, status, head)
                return view, self._channel_frames(sandbox_id, view.process_id, streamed)
        request = self._http.build_request(
            "POST",
            self._proc(sandbox_id) + "/stream",
            content=body.model_dump_json(exclude_none=True).encode(),
            headers={**self._call_headers(), "Content-Type": "application/json"},
            timeout=_EXEC_TIMEOUT,
        )
        with _answered():
            resp = await self._http.send(request, stream=True)
        if resp.status_code >= 400:
            answer = await resp.aread()
            await resp.aclose()
            if resp.status_code == 405:
                return None
            raise error_from(resp.status_code, answer)
        lines = resp.aiter_lines()
        try:
            with _answered():
                first = await anext(lines, "")
            lead = _parse(ProcessFrame.model_validate_json, resp.status_code, first.encode())
            if lead.type != "start" or lead.process is None:
                raise HostAgentError("host agent answered outside the contract: no start frame", status=200)
        except BaseException:
            await resp.aclose()
            raise
        return lead.process, self._frames(resp, lines)

    async def connect_process(
        self, sandbox_id: str, process_id: str, after: int
    ) -> AsyncGenerator[ProcessFrame, None]:
        """Opens a connect stream: errors (404, 409) are raised here, before any frame. The frames
        follow until ``exit``; closing the iterator leaves the process running."""
        request = self._http.build_request(
            "GET",
            self._proc(sandbox_id, process_id) + "/connect",
            params={"after": str(after)},
            headers=self._call_headers(),
            timeout=_EXEC_TIMEOUT,
        )
        with _answered():
            resp = await self._http.send(request, stream=True)
        if resp.status_code >= 400:
            body = await resp.aread()
            await resp.aclose()
            raise error_from(resp.status_code, body)

        return self._frames(resp, resp.aiter_lines())

    async def _channel_frames(
        self, sandbox_id: str, process_id: str, lines: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[ProcessFrame, None]:
        """A channel stream's frames; if it ends before the process's ``exit`` frame, the rest over
        HTTP (``connect_process`` after the last output seen)."""
        after = 0
        try:
            async for line in lines:
                frame = _parse(ProcessFrame.model_validate_json, 200, line)
                after = frame.seq if frame.seq is not None else after
                yield frame
                if frame.type in ("exit", "error"):
                    return
        except (ChannelLostError, ChannelStreamLaggedError):
            pass
        finally:
            await lines.aclose()
        rest = await self.connect_process(sandbox_id, process_id, after)
        try:
            async for frame in rest:
                yield frame
        finally:
            await rest.aclose()

    @staticmethod
    async def _frames(resp: httpx.Response, lines: AsyncIterator[str]) -> AsyncGenerator[ProcessFrame, None]:
        """A connect stream's frames, one per NDJSON line; closing the iterator closes the response.
        The agent ends the stream at its ``exit`` (or ``error``) frame, so that frame is yielded once
        the answer's end has been read: a caller that stops there leaves the connection whole, and
        the pool reuses it, instead of a new TCP connection for the next stream."""
        try:
            with _answered():
                async for line in lines:
                    if not line.strip():
                        continue
                    frame = _parse(ProcessFrame.model_validate_json, resp.status_code, line.encode())
                    if frame.type in ("exit", "error"):
                        async for _ in lines:  # only the end of the body is left
                            pass
                    yield frame
        finally:
            await resp.aclose()
