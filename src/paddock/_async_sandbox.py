"""``AsyncSandboxes``, the ``AsyncSandbox`` handle and its ``AsyncFiles``."""

from __future__ import annotations

import io
import os
import secrets
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from paddock import _base, _blocking, _code
from paddock._async_computer import AsyncComputer
from paddock._async_processes import AsyncCommandHandle, AsyncProcesses
from paddock._async_processes import OutputCallback as OutputLineCallback
from paddock._async_resources import AsyncFileTree, AsyncSandboxDisks
from paddock._code import Execution, OutputCallback
from paddock._errors import (
    CommandStartError,
    CommandTimeoutError,
    PaddockError,
    SandboxStateError,
    TransportError,
    WaitTimeoutError,
)
from paddock._models import (
    AccessToken,
    AuditEvent,
    Bandwidth,
    ExecResult,
    FileEntry,
    FileEvent,
    SandboxInfo,
    SandboxLogs,
    SandboxMetrics,
    Snapshot,
)

if TYPE_CHECKING:
    from paddock._async_client import AsyncClient

#: What ``files.write`` accepts: bytes or text (UTF-8), a local path, a binary file, or byte chunks.
Source = _blocking.AsyncSource


class AsyncSandboxes:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        shape: str,
        *,
        rootfs: str | None = None,
        name: str | None = None,
        networks: Iterable[Mapping[str, str]] | None = None,
        disk_mib: int | None = None,
        egress: Iterable[str] | None = None,
        envs: Mapping[str, str] | None = None,
        ssh_pubkeys: Iterable[str] | None = None,
        host_id: str | None = None,
        node_selector: Mapping[str, str] | None = None,
        ingress_enabled: bool | None = None,
        ingress_host_header: str | None = None,
        ingress_https_ports: Iterable[int] | None = None,
        disks: Iterable[Mapping[str, str]] | None = None,
        region: str | None = None,
        auto_pause_after_seconds: int | None = None,
        start_paused: bool | None = None,
        timeout_s: int | None = None,
        on_timeout: str | None = None,
        on_idle: str | None = None,
        metadata: Mapping[str, str] | None = None,
        volumes: Iterable[Mapping[str, Any]] | None = None,
        wait_timeout_s: float = 120.0,
    ) -> AsyncSandbox:
        """Create a sandbox; returns once it is ``running`` (``paused`` with ``start_paused=True``).

        The POST itself waits for boot; if it answers with a transitional state the handle polls
        adaptively (for at most ``wait_timeout_s``). A sandbox that then fails to get there is destroyed
        before the error is raised.

        The other keywords are CreateSandboxRequest's fields (§10.6), named as on the wire; ``None``
        leaves a field out. ``rootfs``: a catalog image or a template's id or name. ``networks``:
        ``[{"id": "net_…"}]``. ``disk_mib``: the overlay disk (0 or None: the shape's). ``egress``: the
        egress rules (empty: all; docs/egress.md). ``envs``: set in every command. ``node_selector``: host labels to match.
        ``disks``: ``[{"disk_id", "mount_path", "sub_path"?}]`` mounted at boot. ``timeout_s``: the
        lifetime, after which it is destroyed (or paused: ``on_timeout="pause"``; hibernated, only its disk
        kept: ``on_timeout="hibernate"``). ``on_idle="hibernate"``: the idle pause of
        ``auto_pause_after_seconds`` hibernates instead of freezing (docs/hibernation.md). ``metadata``: labels
        that ``list(metadata=...)`` filters on. ``volumes``: ``[{"volume_id", "mount_path",
        "read_only"?}]``, local volumes mounted before it answers; it runs on their host (docs/volumes.md).
        ``ingress_host_header``: the ``Host`` its apps get through the ingress (``${PORT}`` stands for the
        port); ``ingress_https_ports``: ports whose app serves HTTPS itself (docs/ingress.md).
        A misspelled keyword is a ``TypeError``.
        """
        body = _base.drop_none(
            {
                "shape": shape,
                "rootfs": rootfs,
                "name": name,
                "networks": None if networks is None else [dict(n) for n in networks],
                "disk_mib": disk_mib,
                "egress": None if egress is None else list(egress),
                "envs": None if envs is None else dict(envs),
                "ssh_pubkeys": None if ssh_pubkeys is None else list(ssh_pubkeys),
                "host_id": host_id,
                "node_selector": None if node_selector is None else dict(node_selector),
                "ingress_enabled": ingress_enabled,
                "ingress_host_header": ingress_host_header,
                "ingress_https_ports": None if ingress_https_ports is None else list(ingress_https_ports),
                "disks": None if disks is None else [dict(d) for d in disks],
                "region": region,
                "auto_pause_after_seconds": auto_pause_after_seconds,
                "start_paused": start_paused,
                "timeout_s": timeout_s,
                "on_timeout": on_timeout,
                "on_idle": on_idle,
                "metadata": None if metadata is None else dict(metadata),
                "volumes": None if volumes is None else [dict(v) for v in volumes],
            }
        )
        data = await self._client.request("POST", "v1/sandboxes", json=body)
        sandbox = AsyncSandbox(self._client, SandboxInfo.from_api(data))
        target = "paused" if start_paused else "running"
        if sandbox.info.status != target:
            try:
                await sandbox.wait_until(target, timeout_s=wait_timeout_s)
            except PaddockError:
                await sandbox.destroy()
                raise
        return sandbox

    async def get(self, id_or_name: str) -> AsyncSandbox:
        """A sandbox by its id (``sb-…``) or by the name of a live one (the newest of that name).
        A sandbox access token may name its own sandbox either way."""
        if id_or_name.startswith("sb-"):
            data = await self._client.request("GET", _base.path("sandboxes", id_or_name))
        else:
            data = await self._client.request("GET", _base.path("sandboxes", "by-name", id_or_name))
        return AsyncSandbox(self._client, SandboxInfo.from_api(data))

    async def by_ip(self, ip: str) -> AsyncSandbox:
        data = await self._client.request("GET", _base.path("sandboxes", "by-ip", ip))
        return AsyncSandbox(self._client, SandboxInfo.from_api(data))

    async def iter(
        self, status: str | None = None, *, metadata: dict[str, str] | None = None
    ) -> AsyncIterator[SandboxInfo]:
        """Every sandbox (destroyed ones within retention too), oldest first, page by page; with
        ``metadata``, only those whose labels hold every given pair."""
        params: dict[str, str] = {"status": status} if status else {}
        params.update({f"metadata.{key}": value for key, value in (metadata or {}).items()})
        async for item in self._client.paginate("v1/sandboxes", params or None):
            yield SandboxInfo.from_api(item)

    async def list(
        self, status: str | None = None, *, metadata: dict[str, str] | None = None
    ) -> list[SandboxInfo]:
        return [info async for info in self.iter(status, metadata=metadata)]


class AsyncFiles(AsyncFileTree):
    """``sandbox.files``: uploads and downloads streamed in chunks, never held whole in memory; ``list``,
    ``stat``, ``exists``, ``remove`` and ``make_dir`` (``AsyncFileTree``) run inside the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @property
    def _url(self) -> str:
        return _base.path("sandboxes", self._sandbox.id, "files")

    async def write(self, path: str, source: Source) -> int:
        """Create or replace the file at ``path`` (absolute, parent must exist); returns bytes written.

        ``bytes``/``str`` are sent as they are (and retried like any PUT); a ``pathlib.Path``, an open
        binary file or an iterable of byte chunks is streamed once, without retries.
        """
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(source, bytes | str):
            body = source.encode() if isinstance(source, str) else source
            headers["Content-Length"] = str(len(body))
            data = await self._client.request(
                "PUT",
                self._url,
                params={"path": path},
                content=_blocking.AsyncBytesBody(body),
                headers=headers,
            )
            return int(data["size"])
        if isinstance(source, os.PathLike):
            with open(source, "rb") as handle:
                return await self.write(path, handle)
        content = _blocking.aupload_body(source, headers)
        data = await self._client.request(
            "PUT", self._url, params={"path": path}, content=content, headers=headers, retry=False
        )
        return int(data["size"])

    async def upload(self, local_path: str | os.PathLike[str], path: str) -> int:
        """Stream a local file to ``path`` in the sandbox."""
        return await self.write(path, Path(local_path))

    async def download_url(self, path: str, *, expires_in_s: int = 3600) -> str:
        """A link that downloads ``path`` with a plain ``GET``, no API key, for ``expires_in_s`` seconds
        (at most a week): hand it to a browser or another service. It opens that one file of this
        sandbox and nothing else, and cannot be revoked before it expires (docs/files.md)."""
        return await self._signed(path, "read", expires_in_s)

    async def upload_url(self, path: str, *, expires_in_s: int = 3600) -> str:
        """A link that writes the body of a plain ``PUT`` to ``path``, no API key, for ``expires_in_s``
        seconds (at most a week); like ``download_url`` otherwise."""
        return await self._signed(path, "write", expires_in_s)

    async def _signed(self, path: str, operation: str, expires_in_s: int) -> str:
        body = {"path": path, "operation": operation, "expires_in_s": expires_in_s}
        data = await self._client.request("POST", self._url + "/url", json=body)
        # The server's answer names itself as the request reached it; the client's own base URL is the
        # one that reaches it from here (behind a proxy the two differ).
        return self._client.base_url.rstrip("/") + str(data["path"])

    async def iter_bytes(self, path: str, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        resp = await self._client.open_stream("GET", self._url, params={"path": path})
        try:
            async for chunk in resp.aiter_bytes(chunk_size):
                yield chunk
        finally:
            await resp.aclose()

    async def read(self, path: str) -> bytes:
        return b"".join([chunk async for chunk in self.iter_bytes(path)])

    async def download(self, path: str, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Stream the file at ``path`` into a local file (or an open binary file); returns its size."""
        if isinstance(dest, str | os.PathLike):
            with open(dest, "wb") as handle:
                return await self.download(path, handle)
        size = 0
        sink = _blocking.AsyncFileSink(dest)
        async for chunk in self.iter_bytes(path):
            size += len(chunk)
            await sink.write(chunk)
        await sink.finish()
        return size

    # beyond one file's bytes: each runs inside the sandbox ------------------------------------------

    async def rename(self, source: str, destination: str) -> FileEntry:
        """Move ``source`` to ``destination`` (parents made; an existing file there is replaced)."""
        params = {"source": source, "destination": destination}
        return FileEntry.from_api(await self._client.request("POST", self._url + "/rename", params=params))

    async def write_files(self, files: dict[str, bytes | str]) -> int:
        """Write many files in one request (a tar unpacked in the sandbox); parents are made.
        Returns how many were written."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path, content in files.items():
                if not path.startswith("/"):
                    raise ValueError(f"{path!r}: paths must be absolute")
                data = content.encode() if isinstance(content, str) else content
                member = tarfile.TarInfo(path.lstrip("/"))
                member.size, member.mode, member.mtime = len(data), 0o644, int(time.time())
                tar.addfile(member, io.BytesIO(data))
        await self._put_tar("/", buffer.getvalue())
        return len(files)

    async def upload_dir(self, local_dir: str | os.PathLike[str], path: str) -> int:
        """Copy the local directory's contents into ``path`` in the sandbox (made if missing), as one
        tar stream; returns the tar's size in bytes."""
        with tempfile.TemporaryFile() as spool:
            with tarfile.open(fileobj=spool, mode="w") as tar:
                tar.add(os.fspath(local_dir), arcname=".")
            spool.seek(0)
            return await self._put_tar(path, spool)

    async def _put_tar(self, path: str, source: Source) -> int:
        headers = {"Content-Type": "application/x-tar"}
        if isinstance(source, bytes):
            headers["Content-Length"] = str(len(source))
            data = await self._client.request(
                "PUT",
                self._url + "/tar",
                params={"path": path},
                content=_blocking.AsyncBytesBody(source),
                headers=headers,
            )
            return int(data["size"])
        content = _blocking.aupload_body(source, headers)
        data = await self._client.request(
            "PUT", self._url + "/tar", params={"path": path}, content=content, headers=headers, retry=False
        )
        return int(data["size"])

    async def download_dir(self, path: str, local_dir: str | os.PathLike[str]) -> int:
        """Copy the sandbox's directory ``path`` into ``local_dir`` (made if missing) from one tar
        stream, unpacked with tarfile's ``data`` filter (no absolute names, no links out, no devices);
        returns the tar's size in bytes."""
        with tempfile.TemporaryFile() as spool:
            size = 0
            resp = await self._client.open_stream("GET", self._url + "/tar", params={"path": path})
            try:
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    spool.write(chunk)
            finally:
                await resp.aclose()
            spool.seek(0)
            os.makedirs(local_dir, exist_ok=True)
            with tarfile.open(fileobj=spool, mode="r") as tar:
                tar.extractall(local_dir, filter="data")
        return size

    async def watch(self, path: str, *, recursive: bool = False) -> AsyncIterator[FileEvent]:
        """Watch the directory ``path``: returns once the watch is in place, so a change made after this
        returns is reported. Iterate the result for ``FileEvent``s (``create``, ``modify``, ``delete``,
        and ``overflow`` with ``path`` itself when events were lost: list the directory again); close it
        (``aclose``) to stop. Events come from the sandbox's inotify as changes happen (where it has none,
        the tree is looked at every half second); a rename shows as a delete and a create."""
        params = {"path": path, "recursive": "true" if recursive else "false"}
        resp = await self._client.open_stream("GET", self._url + "/watch", params=params)
        lines = resp.aiter_lines()
        try:
            async for line in lines:
                if _base.ndjson_frame(line) is not None:
                    break  # ``{"watching": path}``: the starting state is read
        except BaseException:
            await resp.aclose()
            raise
        return self._events(resp, lines)

    async def _events(self, resp: Any, lines: AsyncIterator[str]) -> AsyncIterator[FileEvent]:
        try:
            async for line in lines:
                frame = _base.ndjson_frame(line)
                if frame is None or "event" not in frame:
                    if frame is not None and "error" in frame:
                        raise PaddockError(str(frame["error"]))
                    continue
                yield FileEvent(frame["event"], frame["path"], frame.get("type", ""))
        finally:
            await resp.aclose()

    @property
    def _client(self) -> AsyncClient:
        return self._sandbox._client


class AsyncSandbox:
    """A handle on one sandbox. ``with`` destroys it on exit."""

    def __init__(self, client: AsyncClient, info: SandboxInfo) -> None:
        self._client = client
        self.info = info
        self.files = AsyncFiles(self)
        self.disks = AsyncSandboxDisks(client, info.id)
        self.processes = AsyncProcesses(self)  # managed processes (§12.2)
        self.computer = AsyncComputer(self)  # computer use on desktop:1 (§12.3)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.status}>"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def name(self) -> str | None:
        return self.info.name

    @property
    def status(self) -> str:
        """The status as last seen (``refresh()`` asks again)."""
        return self.info.status

    def _path(self, *rest: str) -> str:
        return _base.path("sandboxes", self.id, *rest)

    def _set(self, data: Any) -> SandboxInfo:
        self.info = SandboxInfo.from_api(data)
        return self.info

    async def refresh(self, *, wait_for: str | None = None, wait_ms: int | None = None) -> SandboxInfo:
        """The sandbox as it is now; with ``wait_for``, the server answers once it is in that state, in a
        state it will not leave on its own, or after ``wait_ms`` (Paddock's long-poll; other servers
        answer at once)."""
        params = _base.wait_params(wait_for, wait_ms)
        return self._set(await self._client.request("GET", self._path(), params=params))

    async def wait_until(self, status: str, timeout_s: float = 120.0) -> SandboxInfo:
        """Wait until ``status``: long-polls ``GET …?wait_for=`` so the answer comes the moment the state
        changes; where a read comes back at once without it, polls (100 ms, growing ×1.25 after 1 s up
        to 2 s).

        Raises ``SandboxStateError`` on a state that can never lead there, ``WaitTimeoutError`` after
        ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        backoff = _base.Backoff()
        info = self.info
        while True:
            if info.status == status:
                return info
            if _base.wait_aborts(status, info.status):
                raise SandboxStateError(
                    f"sandbox {self.id} is {info.status}, not {status}",
                    sandbox_id=self.id,
                    status=info.status,
                )
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise WaitTimeoutError(f"sandbox {self.id} did not reach {status} in {timeout_s}s")
            asked = time.monotonic()
            info = await self.refresh(wait_for=status, wait_ms=_base.long_poll_ms(remaining_s))
            if info.status != status and time.monotonic() - asked < _base.LONG_POLL_QUICK_S:
                await _blocking.asleep(min(backoff.next(), max(deadline - time.monotonic(), 0)))

    # commands ----------------------------------------------------------------------------------------

    async def run(
        self,
        cmd: str,
        args: Iterable[str] = (),
        *,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        timeout_s: float | None = None,
        shell: bool = False,
        cwd: str | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run ``cmd`` and wait for it; a non-zero exit is a result, not an exception.

        ``cwd`` runs it in that directory; ``user`` (a name or uid of the sandbox's ``/etc/passwd``)
        runs it as that user, with its groups and its HOME, USER and LOGNAME; an unknown one raises
        :class:`ValidationError` naming ``user``.

        No shell unless ``shell=True`` (then ``cmd`` is a ``/bin/sh -c`` script and ``args`` its ``$1``…).
        The wait has no limit of its own: a command runs as long as it needs (the server sets none).
        With ``timeout_s`` a call with no answer by then raises :class:`CommandTimeoutError`. A command
        that cannot start raises :class:`CommandStartError`."""
        if shell:
            cmd, args = "/bin/sh", ["-c", cmd, "sh", *args]
        body = _base.drop_none(
            {"cmd": cmd, "args": list(args), "env": env, "stdin": stdin, "cwd": cwd, "user": user}
        )
        # No read limit by default: the client's own (60 s) had cut a long buffered command.
        wait: Any = timeout_s if timeout_s is not None else _base.no_read_timeout(self._client._http.timeout)
        try:
            data = await self._client.request("POST", self._path("exec"), json=body, timeout=wait)
        except TransportError as exc:
            if timeout_s is None or not _base.timed_out(exc):
                raise
            raise CommandTimeoutError(
                f"{cmd!r} got no answer within run(timeout_s={timeout_s}); it may still be running."
                " Raise timeout_s, or leave it unset: run has no limit of its own"
            ) from exc
        result = ExecResult.from_api(data)
        if result.exit_code == -1 and result.error:
            raise CommandStartError(f"{cmd!r} could not start: {result.error}", cmd=cmd)
        return result

    async def run_shell(
        self,
        script: str,
        *,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        timeout_s: float | None = None,
        cwd: str | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """``run(script, shell=True)``: ``/bin/sh -c script`` (pipes, ``&&``, globs)."""
        return await self.run(
            script, env=env, stdin=stdin, timeout_s=timeout_s, shell=True, cwd=cwd, user=user
        )

    async def run_background(
        self,
        cmd: str,
        args: Iterable[str] = (),
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        shell: bool = False,
        on_stdout: OutputLineCallback | None = None,
        on_stderr: OutputLineCallback | None = None,
        user: str | int | None = None,
    ) -> AsyncCommandHandle:
        """Start ``cmd`` as a managed process and return at once with a handle: each line it prints goes
        to ``on_stdout``/``on_stderr`` as it comes, ``await handle.wait()`` returns the exit code,
        ``await handle.kill()`` ends it. The command outlives the handle and the client."""
        if shell:
            cmd, args = "/bin/sh", ["-c", cmd, "sh", *args]
        process = await self.processes.start(cmd, args, cwd=cwd, env=env, user=user)
        return self.processes.attach(process.process_id, on_stdout=on_stdout, on_stderr=on_stderr)

    async def stream(
        self,
        cmd: str,
        args: Iterable[str] = (),
        *,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        user: str | int | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield the NDJSON frames: ``{"stdout"}``, ``{"stderr"}``, ``{"hb": True}``, ``{"error"}`` and a
        last ``{"exit_code"}``. Closing the iterator early closes the stream, which kills the command.
        An unknown ``user`` is an ``{"error"}`` frame then exit_code -1 (the stream had begun)."""
        body = _base.drop_none(
            {"cmd": cmd, "args": list(args), "env": env, "stdin": stdin, "stream": True, "user": user}
        )
        resp = await self._client.open_stream(
            "POST", self._path("exec"), params={"stream": "true"}, json=body
        )
        try:
            async for line in resp.aiter_lines():
                frame = _base.ndjson_frame(line)
                if frame is not None:
                    yield frame
        finally:
            await resp.aclose()

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        context: str = "default",
        timeout_s: float = 300.0,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        envs: Mapping[str, str] | None = None,
    ) -> Execution:
        """Run a cell in the sandbox's Jupyter kernel for ``context`` (code-interpreter:1, or any image
        with python3-ipykernel) and return its output, rich results and error.

        Variables persist between calls to one context; each context is its own kernel, started on its
        first call. A cell running past ``timeout_s`` is interrupted (KeyboardInterrupt) and returned
        with ``timed_out`` and a TimeoutError; the kernel and the sandbox keep running. An exception in
        the cell is ``Execution.error``, not raised; ``CodeInterpreterError`` means no kernel could run.
        ``on_stdout``/``on_stderr`` receive output as the cell prints it. ``envs``: environment
        variables for this cell alone (``os.environ`` and the processes it starts); the kernel's own
        values come back once it ends.
        """
        _code.check_arguments(language, context, timeout_s, envs)
        execution = await self._run_cell(code, context, timeout_s, on_stdout, on_stderr, envs)
        if execution is None:  # first run_code in this sandbox: ship the driver, then run again
            # Written beside their places and renamed into them, so a concurrent first call never runs
            # a half-written copy.
            token = secrets.token_hex(4)
            partial_server = f"{_code.SERVER_PATH}.{token}"
            partial_client = f"{_code.CLIENT_PATH}.{token}"
            await self.files.write(partial_server, _code.SERVER_SOURCE)
            await self.files.write(partial_client, _code.CLIENT_SOURCE)
            moved = await self.run("sh", _code.install_args(partial_server, partial_client))
            if not moved.ok:
                raise _code.CodeInterpreterError(
                    f"installing the driver failed: {moved.stderr or moved.error}"
                )
            execution = await self._run_cell(code, context, timeout_s, on_stdout, on_stderr, envs)
        if execution is None:
            raise _code.CodeInterpreterError(f"the driver is missing from sandbox {self.id} after upload")
        return execution

    async def _run_cell(
        self,
        code: str,
        context: str,
        timeout_s: float,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        envs: Mapping[str, str] | None = None,
    ) -> Execution | None:
        """One exec of the driver; None when the sandbox has no copy of it yet."""
        reader = _code.CellReader(on_stdout, on_stderr)
        args, stdin = _code.driver_args(context, timeout_s, envs), _code.driver_stdin(code, envs)
        async for frame in self.stream("python3", args, stdin=stdin):
            reader.feed(frame)
        if reader.driver_missing:
            return None
        return reader.finish(timeout_s)

    # files (kept for callers of the first release; ``files`` is the full interface) --------------

    async def write_file(self, path: str, data: Source) -> dict[str, Any]:
        return {"path": path, "size": await self.files.write(path, data)}

    async def read_file(self, path: str) -> bytes:
        return await self.files.read(path)

    def iter_file(self, path: str) -> AsyncIterator[bytes]:
        return self.files.iter_bytes(path)

    # lifecycle ---------------------------------------------------------------------------------------

    async def pause(
        self,
        *,
        keep_memory: bool = True,
        hibernate_after_seconds: int | None = None,
        wait: bool = True,
        timeout_s: float = 120.0,
    ) -> SandboxInfo:
        """Freezes the sandbox and stops its compute billing; with ``wait`` returns once ``paused`` (not
        ``pausing``). ``keep_memory=False`` hibernates it instead: its host keeps only its disk, and a
        resume boots that disk again (its processes restart; docs/hibernation.md). A frozen pause with
        ``hibernate_after_seconds`` is hibernated once it has stayed paused that long."""
        body = _base.drop_none(
            {
                "keep_memory": None if keep_memory else False,
                "hibernate_after_seconds": hibernate_after_seconds,
            }
        )
        options: dict[str, Any] = {"json": body} if body else {}  # no body: today's frozen pause
        self._set(await self._client.request("POST", self._path("pause"), **options))
        return await self.wait_until("paused", timeout_s) if wait else self.info

    async def hibernate(self, *, wait: bool = True, timeout_s: float = 120.0) -> SandboxInfo:
        """``pause(keep_memory=False)``: the host frees the sandbox's memory, slot and address, keeping
        its disk; ``resume()`` boots it again with its files, its processes started afresh."""
        return await self.pause(keep_memory=False, wait=wait, timeout_s=timeout_s)

    async def resume(self, *, wait: bool = True, timeout_s: float = 120.0) -> SandboxInfo:
        self._set(await self._client.request("POST", self._path("resume")))
        return await self.wait_until("running", timeout_s) if wait else self.info

    async def snapshot(self, *, name: str | None = None, include_volumes: bool | None = None) -> Snapshot:
        """A copy of this sandbox's disk (running or paused) that outlives it, ``ready`` when returned;
        ``client.sandboxes.create(rootfs=snapshot.id)`` (or its ``name``) boots new sandboxes from it.
        ``include_volumes=True`` keeps a copy of each local volume it holds too, and each sandbox booted
        from the snapshot gets its own new volumes copied from them, at the same paths."""
        body = _base.drop_none({"name": name, "include_volumes": include_volumes})
        return Snapshot.from_api(await self._client.request("POST", self._path("snapshots"), json=body))

    async def attach_volume(self, volume: str, mount_path: str, *, read_only: bool = False) -> dict[str, Any]:
        """Mount a local volume (id or name; kept on this sandbox's host) at ``mount_path``; returns
        once it is mounted. A volume another sandbox writes to is a ``ConflictError`` naming it."""
        body = {"volume_id": volume, "mount_path": mount_path, "read_only": read_only}
        return dict(await self._client.request("POST", self._path("volumes"), json=body))

    async def detach_volume(self, volume: str) -> None:
        """Unmount the volume (id or name) from this sandbox; its data stays in the volume."""
        await self._client.request("DELETE", self._path("volumes", volume))

    async def fork(
        self,
        *,
        start_paused: bool | None = None,
        ssh_pubkeys: Iterable[str] | None = None,
        egress: Iterable[str] | None = None,
        ingress_enabled: bool | None = None,
        envs: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        include_volumes: bool | None = None,
        wait: bool = True,
        timeout_s: float = 120.0,
    ) -> AsyncSandbox:
        """A child cut from this sandbox (running or paused); with ``wait`` returned once it runs
        (``paused`` with ``start_paused=True``), waiting at most ``timeout_s``; a child that fails is
        destroyed and the error raised.

        The child inherits the source's settings; ``start_paused``, ``ssh_pubkeys``, ``egress``,
        ``ingress_enabled``, ``envs`` (replacing the inherited map) and ``metadata`` override them (the
        fork body's fields, §11.9; ``None`` inherits). ``include_volumes=True`` gives the child its own
        copy of each local volume this sandbox holds, at the same paths (docs/volumes.md; container
        tier). ``timeout_s`` here is the wait, as in ``pause``
        and ``resume``: the child keeps the source's lifetime, and ``child.set_timeout(n)`` changes it.
        A misspelled keyword is a ``TypeError``."""
        body = _base.drop_none(
            {
                "start_paused": start_paused,
                "ssh_pubkeys": None if ssh_pubkeys is None else list(ssh_pubkeys),
                "egress": None if egress is None else list(egress),
                "ingress_enabled": ingress_enabled,
                "envs": None if envs is None else dict(envs),
                "metadata": None if metadata is None else dict(metadata),
                "include_volumes": include_volumes,
            }
        )
        data = await self._client.request("POST", self._path("fork"), json=body)
        child = AsyncSandbox(self._client, SandboxInfo.from_api(data))
        if wait:
            try:
                await child.wait_until("paused" if start_paused else "running", timeout_s)
            except PaddockError:
                await child.destroy()
                raise
        return child

    async def destroy(self, *, wait: bool = False, timeout_s: float = 120.0) -> str:
        """Destroy (idempotent); returns ``destroying`` or ``destroyed``, or waits for ``destroyed``."""
        data = await self._client.request("DELETE", self._path())
        status = str(data["status"])
        self.info.status = status
        if wait and status != "destroyed":
            info = await self.wait_until("destroyed", timeout_s)
            return info.status
        return status

    # settings ----------------------------------------------------------------------------------------

    async def patch(
        self,
        *,
        ingress_enabled: bool | None = None,
        auto_pause_after_seconds: int | None = None,
        disable_auto_pause: bool | None = None,
        on_idle: str | None = None,
        ingress_host_header: str | None = None,
        ingress_https_ports: Iterable[int] | None = None,
    ) -> SandboxInfo:
        """``on_idle``: what the idle pause does, ``"pause"`` (frozen) or ``"hibernate"``.
        ``ingress_host_header`` and ``ingress_https_ports`` as at create; ``""`` and ``[]`` clear them."""
        body = _base.drop_none(
            {
                "ingress_enabled": ingress_enabled,
                "ingress_host_header": ingress_host_header,
                "ingress_https_ports": None if ingress_https_ports is None else list(ingress_https_ports),
                "auto_pause_after_seconds": auto_pause_after_seconds,
                "disable_auto_pause": disable_auto_pause,
                "on_idle": on_idle,
            }
        )
        return self._set(await self._client.request("PATCH", self._path(), json=body))

    async def url(self, port: int) -> str:
        """The sandbox's ingress URL for ``port``; turns ingress on first if it is off."""
        if not self.info.ingress_enabled or not self.info.ingress_url_template:
            await self.patch(ingress_enabled=True)
        return self.info.ingress_url(port)

    async def set_timeout(self, timeout_s: int, *, on_timeout: str | None = None) -> SandboxInfo:
        """A new lifetime from now (extend or shorten; 0: none): at its end the sandbox is destroyed,
        or paused with ``on_timeout="pause"``, or hibernated with ``on_timeout="hibernate"`` (a 409 on a
        tier that does not hibernate)."""
        body = _base.drop_none({"timeout_s": timeout_s, "on_timeout": on_timeout})
        return self._set(await self._client.request("POST", self._path("timeout"), json=body))

    async def resize(self, disk_mib: int) -> int:
        """Grow the disk (strictly larger than now); returns the new size in MiB."""
        data = await self._client.request("POST", self._path("resize"), json={"disk_mib": disk_mib})
        self.info.disk_mib = int(data["disk_mib"])
        return self.info.disk_mib

    async def add_ssh_keys(self, keys: Iterable[str]) -> int:
        """Add OpenSSH public keys; returns how many the sandbox holds now."""
        data = await self._client.request("POST", self._path("ssh-pubkeys"), json={"keys": list(keys)})
        return int(data["count"])

    async def egress(self) -> list[str]:
        """The egress rules; ``[]`` means everything is allowed. Allow rules alone are an allowlist; a list
        with deny rules (``!ip``, ``!cidr``) lets everything out but what those name."""
        data = await self._client.request("GET", self._path("egress"))
        return list(data["egress"])

    async def set_egress(self, rules: Iterable[str] | None) -> list[str]:
        """Replace the egress rules (``None``, ``[]`` or ``["*"]`` allow all); returns the normalised list."""
        body = {"egress": None if rules is None else list(rules)}
        data = await self._client.request("PUT", self._path("egress"), json=body)
        return list(data["egress"])

    async def metrics(self, *, window_s: int = 300) -> SandboxMetrics:
        """Its CPU, memory, disk and network use over the last ``window_s`` seconds (1 to 86400): raw
        samples for up to an hour, one-minute averages beyond (docs/observability.md); E2B's
        ``get_metrics()``."""
        data = await self._client.request("GET", self._path("metrics"), params={"window_s": window_s})
        return SandboxMetrics.from_api(data)

    async def logs(self, *, source: str = "boot", tail: int = 100) -> SandboxLogs:
        """The last ``tail`` lines (1 to 1000) of its boot log, or with ``source="guest"`` of a VM's
        console (a container has none: 409)."""
        params = {"source": source, "tail": tail}
        return SandboxLogs.from_api(await self._client.request("GET", self._path("logs"), params=params))

    async def audit(
        self,
        *,
        kinds: Iterable[str] = (),
        since: str | None = None,
        until: str | None = None,
        newest_first: bool = False,
        page_size: int = 500,
    ) -> AsyncIterator[AuditEvent]:
        """Its audit trail (docs/audit.md): the calls on it, the commands and processes it ran, the
        files moved in and out and its egress attempts, with who made each; oldest first, or newest
        first, page after page (stop iterating to stop reading). ``kinds`` picks some (``"command"``,
        ``"egress"`` …); ``since`` (inclusive) and ``until`` are RFC 3339 times with a zone. Only the
        owner's account key reads it (a sandbox's access token gets ``PermissionDeniedError``); it
        outlives the sandbox until the server's retention (7 days by default) removes it."""
        params: dict[str, Any] = {"limit": page_size, "order": "newest" if newest_first else "oldest"}
        if kinds:
            params["kind"] = ",".join(kinds)
        params.update({name: at for name, at in (("since", since), ("until", until)) if at is not None})
        while True:
            page = await self._client.request("GET", self._path("audit"), params=params)
            for item in page["items"]:
                yield AuditEvent.from_api(item)
            cursor = (page.get("pagination") or {}).get("next_cursor")
            if not cursor or not page["items"]:
                return
            params["cursor"] = cursor

    async def bandwidth(self) -> Bandwidth:
        return Bandwidth.from_api(await self._client.request("GET", self._path("bandwidth")))

    async def recharge_bandwidth(self, add_bytes: int) -> Bandwidth:
        data = await self._client.request(
            "POST", self._path("bandwidth", "recharge"), json={"add_bytes": add_bytes}
        )
        return Bandwidth.from_api(data)

    async def join_network(self, network_id: str) -> None:
        await self._client.request("POST", self._path("networks"), json={"id": network_id})

    async def leave_network(self, network_id: str) -> None:
        await self._client.request("DELETE", self._path("networks", network_id))

    async def create_access_token(self, *, expires_in_seconds: int | None = None) -> AccessToken:
        """Issue this sandbox's delegated access token (§12.1); its ``token`` is shown only now.

        Whoever holds it passes it as the API key (``AsyncClient(api_key=token)``) and can then run
        commands, move files, pause, resume and destroy this one sandbox — nothing else of the
        account. ``expires_in_seconds`` (this server's extension) limits its life. A sandbox has at
        most one enabled token: a second create is a ``ConflictError``; rotate instead."""
        return AccessToken.from_api(
            await self._client.request("POST", self._path("access-token"), **_token_body(expires_in_seconds))
        )

    async def access_token(self) -> AccessToken:
        """Whether the sandbox has an enabled token, with its hint and times (never the secret)."""
        return AccessToken.from_api(await self._client.request("GET", self._path("access-token")))

    async def rotate_access_token(self, *, expires_in_seconds: int | None = None) -> AccessToken:
        """Replace the enabled token with a new one (the old one stops working at once); without
        ``expires_in_seconds`` the new token keeps the old one's lifetime."""
        return AccessToken.from_api(
            await self._client.request(
                "POST", self._path("access-token", "rotate"), **_token_body(expires_in_seconds)
            )
        )

    async def disable_access_token(self) -> AccessToken:
        """Revoke the token at once; idempotent."""
        return AccessToken.from_api(await self._client.request("DELETE", self._path("access-token")))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Destroy the sandbox; if the block raised, a failing destroy is noted on that error instead."""
        if exc is None:
            await self.destroy()
            return
        try:
            await self.destroy()
        except PaddockError as failed:
            exc.add_note(f"destroying sandbox {self.id} on the way out also failed: {failed}")


def _token_body(expires_in_seconds: int | None) -> dict[str, Any]:
    """Create and rotate send no body at all unless a lifetime is asked for (§2.2)."""
    return {} if expires_in_seconds is None else {"json": {"expires_in_seconds": expires_in_seconds}}
