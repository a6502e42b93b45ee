"""``AsyncProcesses``: the managed processes of one sandbox (§12.2), as ``sandbox.processes``.

    proc = await sandbox.processes.start("bash", pty=(24, 80))
    await sandbox.processes.send_input(proc.process_id, "ls\\n")
    async for frame in sandbox.processes.connect(proc.process_id):   # {"type": "data", "data": b"…"} …
        ...

A process outlives every client: leaving ``connect`` only closes the stream, and a later ``connect``
with ``after=<seq>`` gets what was printed since.

``sandbox.run_background(cmd, on_stdout=cb, on_stderr=cb)`` (or ``processes.attach(process_id, …)``)
gives an ``AsyncCommandHandle`` whose output reaches the callbacks line by line as it is printed, with
``wait()``, ``kill()`` and ``exit_code``.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

from paddock import _base, _blocking
from paddock._errors import PaddockError, WaitTimeoutError
from paddock._models import ManagedProcess

if TYPE_CHECKING:
    from paddock._async_sandbox import AsyncSandbox


class AsyncProcesses:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    def _path(self, *rest: str) -> str:
        return self._sandbox._path("processes", *rest)

    async def _process(self, method: str, path: str, **kwargs: Any) -> ManagedProcess:
        return ManagedProcess.from_api(await self._sandbox._client.request(method, path, **kwargs))

    async def start(
        self,
        cmd: str | None = None,
        args: Iterable[str] = (),
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        pty: tuple[int, int] | None = None,
        user: str | int | None = None,
    ) -> ManagedProcess:
        """Starts ``cmd`` (no shell); ``pty=(rows, cols)`` gives it a terminal (then ``cmd`` may be
        left out for a login shell); ``user`` (a name or uid of the sandbox) runs it as that user."""
        body = _base.drop_none(
            {
                "cmd": cmd,
                "args": list(args) or None,
                "cwd": cwd,
                "env": env,
                "pty": {"rows": pty[0], "cols": pty[1]} if pty else None,
                "user": user,
            }
        )
        return await self._process("POST", self._path(), json=body)

    async def list(self) -> list[ManagedProcess]:
        data = await self._sandbox._client.request("GET", self._path())
        return [ManagedProcess.from_api(item) for item in data["processes"]]

    async def get(self, process_id: str) -> ManagedProcess:
        return await self._process("GET", self._path(process_id))

    async def kill(self, process_id: str, *, grace_ms: int = 5000) -> ManagedProcess:
        """SIGTERM to the process tree, SIGKILL once ``grace_ms`` has passed."""
        return await self._process("DELETE", self._path(process_id), params={"grace_ms": grace_ms})

    async def send_input(self, process_id: str, data: bytes | str) -> int:
        raw = data.encode() if isinstance(data, str) else data
        body = {"data_base64": base64.b64encode(raw).decode()}
        answer = await self._sandbox._client.request("POST", self._path(process_id, "input"), json=body)
        return int(answer["input_seq"])

    async def close_stdin(self, process_id: str) -> None:
        await self._sandbox._client.request("POST", self._path(process_id, "stdin", "close"))

    async def resize(self, process_id: str, rows: int, cols: int) -> ManagedProcess:
        body = {"rows": rows, "cols": cols}
        return await self._process("POST", self._path(process_id, "resize"), json=body)

    async def signal(self, process_id: str, signal: str) -> ManagedProcess:
        """``signal``: SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGTERM, SIGUSR1, SIGUSR2 or SIGWINCH."""
        return await self._process("POST", self._path(process_id, "signal"), json={"signal": signal})

    async def wait(
        self, process_id: str, *, scope: str = "leader", timeout_ms: int = 30000
    ) -> ManagedProcess:
        """Long-polls until the leader (or the whole ``tree``) has exited, or ``timeout_ms`` passed."""
        params = {"scope": scope, "timeout_ms": timeout_ms}
        return await self._process(
            "GET", self._path(process_id, "wait"), params=params, timeout=timeout_ms / 1000 + 30
        )

    def attach(
        self,
        process_id: str,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        after: int = 0,
    ) -> AsyncCommandHandle:
        """A handle on a running process whose output (from ``after``) goes to the callbacks."""
        return AsyncCommandHandle(self, process_id, on_stdout=on_stdout, on_stderr=on_stderr, after=after)

    async def connect(self, process_id: str, *, after: int = 0) -> AsyncIterator[dict[str, Any]]:
        """The output after ``after`` then live: ``{"type": "data", "seq", "stream", "data": bytes}``,
        heartbeats, and a last ``exit`` (or ``error``) frame. Leaving early leaves the process running."""
        resp = await self._sandbox._client.open_stream(
            "GET", self._path(process_id, "connect"), params={"after": after}
        )
        try:
            async for line in resp.aiter_lines():
                frame = _base.ndjson_frame(line)
                if frame is None:
                    continue
                if frame.get("type") == "data":
                    frame["data"] = base64.b64decode(frame.get("data_base64", ""), validate=True)
                yield frame
        finally:
            await resp.aclose()


#: An output callback: called with each line (its newline taken off), a plain function or, in the
#: async client, a coroutine function.
OutputCallback = Callable[[str], Any]

#: A line longer than this is handed over in pieces of this size, so the held part stays bounded.
MAX_LINE_BYTES = 64 * 1024


class AsyncCommandHandle:
    """A command running in the sandbox as a managed process, its output read in the background.

    Each line of stdout (a terminal's output too) goes to ``on_stdout`` and each line of stderr to
    ``on_stderr`` as it arrives, without its newline; a last line without one comes when the command ends.
    The callbacks run in the client's event loop (async client) or in a reading thread (sync client). A
    callback that raises stops the reading, and ``wait()`` raises its exception; the command runs on.
    The command outlives the handle and the client: ``kill()`` ends it."""

    def __init__(
        self,
        processes: AsyncProcesses,
        process_id: str,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        after: int = 0,
    ) -> None:
        self._processes = processes
        self.process_id = process_id
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._held = {"stdout": b"", "stderr": b""}
        self._seq = after
        self._exit: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._worker = _blocking.abackground(self._read)

    def __repr__(self) -> str:
        return f"<CommandHandle {self.process_id} exit_code={self.exit_code}>"

    @property
    def exit_code(self) -> int | None:
        """The command's exit code once it has ended (-1 when a signal ended it), otherwise None."""
        if self._exit is None:
            return None
        code = self._exit.get("exit_code")
        return int(code) if code is not None else -1

    @property
    def signal(self) -> str | None:
        """The signal that ended the command, if one did."""
        return None if self._exit is None else self._exit.get("signal")

    async def wait(self, timeout_s: float | None = None) -> int:
        """Waits until the command has ended and its output has reached the callbacks; returns its exit
        code. Raises :class:`WaitTimeoutError` after ``timeout_s`` (the command runs on)."""
        if not await _blocking.ajoin(self._worker, timeout_s):
            raise WaitTimeoutError(
                f"process {self.process_id} still running after wait(timeout_s={timeout_s})"
            )
        if self._error is not None:
            raise self._error
        return self.exit_code if self.exit_code is not None else -1

    async def kill(self, *, grace_ms: int = 5000) -> int:
        """SIGTERM to the command's process tree, SIGKILL after ``grace_ms``; returns ``wait()``."""
        await self._processes.kill(self.process_id, grace_ms=grace_ms)
        return await self.wait(timeout_s=grace_ms / 1000 + 60)

    async def send_stdin(self, data: bytes | str) -> int:
        return await self._processes.send_input(self.process_id, data)

    async def close_stdin(self) -> None:
        await self._processes.close_stdin(self.process_id)

    async def _read(self) -> None:
        try:
            while self._exit is None:
                async for frame in self._processes.connect(self.process_id, after=self._seq):
                    kind = frame.get("type")
                    if kind == "data":
                        self._seq = max(self._seq, int(frame.get("seq", self._seq)))
                        stream = "stderr" if frame.get("stream") == "stderr" else "stdout"
                        await self._take(stream, frame["data"])
                    elif kind == "exit":
                        self._exit = frame
                    elif kind == "error":
                        raise PaddockError(f"process {self.process_id}: {frame.get('error')}")
                if self._exit is None:  # the stream ended early: connect again after what was seen
                    await _blocking.asleep(0.2)
            for stream in ("stdout", "stderr"):
                if self._held[stream]:
                    await self._deliver(stream, self._held[stream])
        except BaseException as exc:  # handed to wait()
            self._error = exc

    async def _take(self, stream: str, data: bytes) -> None:
        held = self._held[stream] + data
        *lines, rest = held.split(b"\n")
        for line in lines:
            await self._deliver(stream, line)
        while len(rest) >= MAX_LINE_BYTES:
            await self._deliver(stream, rest[:MAX_LINE_BYTES])
            rest = rest[MAX_LINE_BYTES:]
        self._held[stream] = rest

    async def _deliver(self, stream: str, line: bytes) -> None:
        callback = self._callbacks[stream]
        if callback is not None:
            await _blocking.acallback(callback, line.decode("utf-8", errors="replace"))
