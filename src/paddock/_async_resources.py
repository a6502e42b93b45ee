"""Webhook endpoints (§11.14), networks (§11.12), disks (§11.10, §11.11), templates (§11.13),
snapshots (docs/snapshots.md) and volumes (docs/volumes.md)."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from paddock import _base, _blocking
from paddock._errors import NotFoundError, WaitTimeoutError
from paddock._models import (
    BuildLogFrame,
    Disk,
    FileEntry,
    Network,
    SandboxDisk,
    Snapshot,
    Template,
    Volume,
    WebhookEndpoint,
)

if TYPE_CHECKING:
    from paddock._async_client import AsyncClient


class AsyncWebhooks:
    """``client.webhooks``: endpoints that receive signed events (verify them with ``paddock.webhooks``)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def actions(self) -> list[str]:
        """Every action name an endpoint can subscribe to (the server's list is the authority)."""
        return [str(a) for a in await self._client.request("GET", "v1/webhook-endpoints/actions")]

    async def create(self, url: str, events: Iterable[str] | None = None) -> WebhookEndpoint:
        """Register ``url``; no ``events`` means every action. The result carries ``secret`` (shown once)."""
        body = _base.drop_none({"url": url, "events": None if events is None else list(events)})
        return WebhookEndpoint.from_api(await self._client.request("POST", "v1/webhook-endpoints", json=body))

    async def list(self) -> list[WebhookEndpoint]:
        return [WebhookEndpoint.from_api(e) async for e in self._client.paginate("v1/webhook-endpoints")]

    async def get(self, endpoint_id: str) -> WebhookEndpoint:
        """The endpoint with its retained ``deliveries`` (newest first)."""
        return WebhookEndpoint.from_detail(
            await self._client.request("GET", _base.path("webhook-endpoints", endpoint_id))
        )

    async def suspend(self, endpoint_id: str) -> WebhookEndpoint:
        data = await self._client.request("POST", _base.path("webhook-endpoints", endpoint_id, "suspend"))
        return WebhookEndpoint.from_api(data)

    async def resume(self, endpoint_id: str) -> WebhookEndpoint:
        data = await self._client.request("POST", _base.path("webhook-endpoints", endpoint_id, "resume"))
        return WebhookEndpoint.from_api(data)

    async def delete(self, endpoint_id: str) -> None:
        await self._client.request("DELETE", _base.path("webhook-endpoints", endpoint_id))


class AsyncNetworks:
    """``client.networks``: private overlay networks; sandboxes join with ``sandbox.join_network``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, name: str) -> Network:
        return Network.from_api(await self._client.request("POST", "v1/networks", json={"name": name}))

    async def list(self) -> list[Network]:
        return [Network.from_api(n) async for n in self._client.paginate("v1/networks")]

    async def get(self, network_id: str) -> Network:
        """The network with its ``members`` (sandbox id, status, overlay ip)."""
        return Network.from_api(await self._client.request("GET", _base.path("networks", network_id)))

    async def delete(self, network_id: str) -> None:
        """Delete; ``ConflictError`` (``IN_USE``) while a member sandbox is not terminal."""
        await self._client.request("DELETE", _base.path("networks", network_id))


class AsyncDisks:
    """``client.disks``: S3 buckets registered once and mounted into sandboxes (``sandbox.disks``).

    The credentials are sent on create and on ``rotate_credentials`` only; the API never returns them.
    """

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        name: str,
        *,
        bucket: str,
        endpoint: str,
        access_key: str,
        secret_key: str,
        region: str | None = None,
        use_path_style: bool | None = None,
    ) -> Disk:
        config: dict[str, Any] = {"bucket": bucket, "endpoint": endpoint}
        if region is not None:
            config["region"] = region
        if use_path_style is not None:
            config["use_path_style"] = use_path_style
        body = {
            "name": name,
            "kind": "s3",
            "config": config,
            "credentials": {"access_key": access_key, "secret_key": secret_key},
        }
        return Disk.from_api(await self._client.request("POST", "v1/disks", json=body))

    async def list(self) -> list[Disk]:
        return [Disk.from_api(d) async for d in self._client.paginate("v1/disks")]

    async def get(self, disk: str) -> Disk:
        """By ``disk_<ulid>`` id or by name."""
        return Disk.from_api(await self._client.request("GET", _base.path("disks", disk)))

    async def rotate_credentials(self, disk: str, *, access_key: str, secret_key: str) -> Disk:
        """New credentials for later mounts; mounts made before keep theirs until remounted."""
        body = {"credentials": {"access_key": access_key, "secret_key": secret_key}}
        return Disk.from_api(await self._client.request("PATCH", _base.path("disks", disk), json=body))

    async def delete(self, disk: str) -> None:
        """Refused (``ConflictError``, ``IN_USE``) while a sandbox that is not destroyed holds it."""
        await self._client.request("DELETE", _base.path("disks", disk))


class AsyncSandboxDisks:
    """``sandbox.disks``: the sandbox's mounted disks."""

    def __init__(self, client: AsyncClient, sandbox_id: str) -> None:
        self._client = client
        self._sandbox_id = sandbox_id

    def _path(self, *rest: str) -> str:
        return _base.path("sandboxes", self._sandbox_id, "disks", *rest)

    async def list(self) -> list[SandboxDisk]:
        return [SandboxDisk.from_api(d) async for d in self._client.paginate(self._path())]

    async def attach(
        self,
        disk: str,
        mount_path: str,
        *,
        sub_path: str | None = None,
        wait: bool = True,
        timeout_s: float = 60.0,
    ) -> SandboxDisk:
        """Mount ``disk`` (id or name) at ``mount_path``. With ``wait`` (the default) this returns once
        the mount is ``mounted`` or ``error``; a failed mount is returned, not raised (``mount_error``)."""
        body: dict[str, Any] = {"disk_id": disk, "mount_path": mount_path}
        if sub_path:
            body["sub_path"] = sub_path
        data = await self._client.request("POST", self._path(), json=body)
        if data.get("id") != self._sandbox_id:
            raise ValueError(f"attach answered for sandbox {data.get('id')!r}, not {self._sandbox_id!r}")
        if not wait:
            return SandboxDisk.from_api(data)
        return await self.wait(str(data.get("mount_path", mount_path)), timeout_s=timeout_s)

    async def wait(self, mount_path: str, *, timeout_s: float = 60.0) -> SandboxDisk:
        """The attachment at ``mount_path`` once it is no longer ``pending``."""
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while True:
            found = [d for d in await self.list() if d.mount_path == mount_path]
            if found and found[0].mount_status != "pending":
                return found[0]
            if time.monotonic() + delay > deadline:
                raise WaitTimeoutError(f"the disk at {mount_path} is still pending after {timeout_s}s")
            await _blocking.asleep(delay)
            delay = min(delay * 2, 1.0)

    async def detach(self, disk_id: str, mount_path: str) -> None:
        """Unmount the disk (its ``disk_<ulid>`` id) from ``mount_path``; the bucket is not touched."""
        await self._client.request("DELETE", self._path(disk_id), params={"mount_path": mount_path})


class AsyncSnapshots:
    """``client.snapshots``: copies of a sandbox's disk that outlive it; ``rootfs=`` a snapshot's id or
    name boots a new sandbox from it, on the host that keeps it (container tier: crun, runc)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self, sandbox: str, *, name: str | None = None, include_volumes: bool | None = None
    ) -> Snapshot:
        """Snapshot the disk of ``sandbox`` (its id; running or paused); returns once it is ``ready``.
        ``include_volumes=True`` keeps a copy of each local volume it holds too: a sandbox booted from
        the snapshot gets its own new volumes copied from them (docs/volumes.md)."""
        body = _base.drop_none({"name": name, "include_volumes": include_volumes})
        return Snapshot.from_api(
            await self._client.request("POST", _base.path("sandboxes", sandbox, "snapshots"), json=body)
        )

    async def list(self) -> list[Snapshot]:
        return [Snapshot.from_api(s) async for s in self._client.paginate("v1/snapshots")]

    async def get(self, snapshot: str) -> Snapshot:
        """By ``snap_<ulid>`` id or by name."""
        return Snapshot.from_api(await self._client.request("GET", _base.path("snapshots", snapshot)))

    async def delete(self, snapshot: str) -> None:
        """Delete; sandboxes booted from it keep running with their disks."""
        await self._client.request("DELETE", _base.path("snapshots", snapshot))


class AsyncVolumes:
    """``client.volumes``: local persistent volumes (docs/volumes.md), XFS filesystems kept on the host
    that made them, which outlive every sandbox they are mounted into (container tier: crun, runc).
    Mount one with ``sandboxes.create(..., volumes=[{"volume_id", "mount_path", "read_only"?}])`` or
    ``sandbox.attach_volume(...)``; one sandbox writes at a time, any number read."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, name: str, size_mib: int, *, host_id: str | None = None) -> Volume:
        """Make a volume of ``size_mib`` (at least 512; at most the plan's disk size)."""
        body = _base.drop_none({"name": name, "size_mib": size_mib, "host_id": host_id})
        return Volume.from_api(await self._client.request("POST", "v1/volumes", json=body))

    async def list(self) -> list[Volume]:
        return [Volume.from_api(v) async for v in self._client.paginate("v1/volumes")]

    async def get(self, volume: str) -> Volume:
        """By ``vol_<ulid>`` id or by name."""
        return Volume.from_api(await self._client.request("GET", _base.path("volumes", volume)))

    async def resize(self, volume: str, size_mib: int) -> Volume:
        """Grow the volume to ``size_mib`` (larger only; online while a sandbox holds it)."""
        return Volume.from_api(
            await self._client.request("PATCH", _base.path("volumes", volume), json={"size_mib": size_mib})
        )

    async def delete(self, volume: str) -> None:
        """Delete it and its data; a volume a sandbox holds is a ``ConflictError``."""
        await self._client.request("DELETE", _base.path("volumes", volume))

    def files(self, volume: str) -> AsyncVolumeFiles:
        """The volume's files, read and written without a sandbox (``AsyncVolumeFiles``)."""
        return AsyncVolumeFiles(self._client, volume)


class AsyncFileTree:
    """The calls on a tree of files beyond one file's bytes, at ``…/files``: a sandbox's (``sandbox.files``,
    run inside it) and a volume's (``client.volumes.files(...)``, run by its host), one shape for both."""

    @property
    def _client(self) -> AsyncClient:
        raise NotImplementedError

    @property
    def _url(self) -> str:
        raise NotImplementedError

    async def list(self, path: str, *, depth: int = 1) -> list[FileEntry]:
        """The entries under the directory ``path`` (``depth`` levels, 1 = its children)."""
        data = await self._client.request(
            "GET", self._url + "/list", params={"path": path, "depth": str(depth)}
        )
        return [FileEntry.from_api(entry) for entry in data["entries"]]

    async def stat(self, path: str) -> FileEntry:
        """``path``'s type, size, mode, owner and time (a symlink itself, not its target)."""
        return FileEntry.from_api(
            await self._client.request("GET", self._url + "/stat", params={"path": path})
        )

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFoundError:
            return False
        return True

    async def remove(self, path: str) -> None:
        """Remove a file, a symlink (not what it names) or a whole directory; a missing path raises
        ``NotFoundError``."""
        await self._client.request("DELETE", self._url, params={"path": path})

    async def make_dir(self, path: str) -> bool:
        """Make the directory and its parents; ``False`` when it was already there."""
        data = await self._client.request("POST", self._url + "/mkdir", params={"path": path})
        return bool(data["created"])


class AsyncVolumeFiles(AsyncFileTree):
    """``client.volumes.files(volume)``: a volume's files without a sandbox (docs/volumes.md), read and
    written by its host beside any sandbox that mounts it, with ``sandbox.files``' calls and entries
    (``owner`` and ``group`` are numeric ids here). A symlink in the volume is shown, never followed;
    one file read or written is at most 64 MiB (``PayloadTooLargeError`` beyond)."""

    #: The most one call reads or writes (the server's bound, which refuses more with a 413).
    MAX_FILE_BYTES = 64 << 20

    def __init__(self, client: AsyncClient, volume: str) -> None:
        self._owner = client
        self._files_url = _base.path("volumes", volume, "files")

    @property
    def _client(self) -> AsyncClient:
        return self._owner

    @property
    def _url(self) -> str:
        return self._files_url

    async def write(self, path: str, data: bytes | str) -> int:
        """Create or replace the file at ``path`` (absolute; missing parents are made); returns its size."""
        body = data.encode() if isinstance(data, str) else data
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(body))}
        answer = await self._client.request(
            "PUT", self._url, params={"path": path}, content=_blocking.AsyncBytesBody(body), headers=headers
        )
        return int(answer["size"])

    async def read(self, path: str) -> bytes:
        resp = await self._client.open_stream("GET", self._url, params={"path": path})
        try:
            return b"".join([chunk async for chunk in resp.aiter_bytes()])
        finally:
            await resp.aclose()


class AsyncTemplates:
    """``client.templates``: Dockerfiles built into images that sandboxes boot (``rootfs=`` the
    template's id or name). A build runs on the server; follow it with ``logs(..., follow=True)``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        name: str,
        dockerfile: str,
        *,
        base: str | None = None,
        context: bytes | None = None,
        rebuild: bool = False,
    ) -> Template:
        """Submit a build; the template comes back ``pending``. ``base`` is what ``FROM base`` means;
        ``context`` is a tar archive (gzip-compressed or not) of the files ``COPY``/``ADD`` read.
        ``rebuild=True`` builds an existing name again (a new id): the name boots the old image until
        the new one is ready, sandboxes booted from the old one keep it."""
        body = _base.drop_none(
            {
                "name": name,
                "dockerfile": dockerfile,
                "base": base,
                "context": base64.b64encode(context).decode() if context is not None else None,
                "rebuild": True if rebuild else None,
            }
        )
        return Template.from_api(await self._client.request("POST", "v1/templates", json=body))

    async def list(self) -> list[Template]:
        return [Template.from_api(t) async for t in self._client.paginate("v1/templates")]

    async def get(self, template: str, *, include_dockerfile: bool = False) -> Template:
        """By ``tpl_<ulid>`` id or by name."""
        params = {"include": "dockerfile"} if include_dockerfile else None
        return Template.from_api(
            await self._client.request("GET", _base.path("templates", template), params=params)
        )

    async def delete(self, template: str) -> None:
        """Delete; a build in progress is cancelled. Sandboxes booted from it keep running."""
        await self._client.request("DELETE", _base.path("templates", template))

    async def log_text(self, template: str, *, attempt: int | None = None) -> str:
        """The build log recorded so far as the server sends it (NDJSON text)."""
        params = {"attempt": attempt} if attempt is not None else None
        resp = await self._client.open_stream("GET", _base.path("templates", template, "logs"), params=params)
        try:
            body: bytes = await resp.aread()
            return body.decode()
        finally:
            await resp.aclose()

    async def logs(
        self, template: str, *, attempt: int | None = None, follow: bool = False
    ) -> AsyncIterator[BuildLogFrame]:
        """The build log's frames; with ``follow`` it streams new ones until the terminal frame
        (``frame.final``, ``frame.status``) of a finished build."""
        params: dict[str, Any] = {"follow": "true"} if follow else {}
        if attempt is not None:
            params["attempt"] = attempt
        resp = await self._client.open_stream("GET", _base.path("templates", template, "logs"), params=params)
        try:
            async for line in resp.aiter_lines():
                frame = _base.ndjson_frame(line)
                if frame is not None:
                    yield BuildLogFrame.from_api(frame)
        finally:
            await resp.aclose()

    async def wait(self, template: str, *, timeout_s: float = 1800.0) -> Template:
        """The template once its build has ended (``ready`` or ``failed``)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.2
        while True:
            found = await self.get(template)
            if found.status in ("ready", "failed"):
                return found
            if time.monotonic() + delay > deadline:
                raise WaitTimeoutError(f"template {template} is still {found.status} after {timeout_s}s")
            await _blocking.asleep(delay)
            delay = min(delay * 2, 2.0)
