"""``AsyncProcesses``: the managed processes of one sandbox (§12.2), as ``sandbox.processes``.

    proc = await sandbox.processes.start("bash", pty=(24, 80))
    await sandbox.processes.send_input(proc.process_id, "ls\\n")
    async for frame in sandbox.processes.connect(proc.process_id):   # {"type": "data", "data": b"…"} …
        ...

A process outlives every client: leaving ``connect`` only closes the stream, and a later ``connect``
with ``after=<seq>`` gets what was printed since.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from paddock import _base
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
    ) -> ManagedProcess:
        """Starts ``cmd`` (no shell); ``pty=(rows, cols)`` gives it a terminal (then ``cmd`` may be
        left out for a login shell)."""
        body = _base.drop_none(
            {
                "cmd": cmd,
                "args": list(args) or None,
                "cwd": cwd,
                "env": env,
                "pty": {"rows": pty[0], "cols": pty[1]} if pty else None,
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
