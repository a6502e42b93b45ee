"""One command running in a sandbox, as the API sees it: frames of decoded text, then an exit code.

Output bytes are decoded as UTF-8 with invalid sequences replaced; an incremental decoder per stream
keeps a multi-byte character that straddles two chunks whole. Whatever happens, the frames end with
exactly one ``{"exit_code": N}``; a command that could not start, a pause, or a lost guest agent end
with ``{"error": ...}`` then ``{"exit_code": -1}``.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from paddock_hostagent.guest import ExecSession, Exited, GuestError, Output, SpawnFailed

PAUSED_MESSAGE = "sandbox paused"
DESTROYED_MESSAGE = "sandbox destroyed"
Frame = dict[str, Any]


class ExecStream:
    """Wraps a connected guest ``ExecSession``; ``abort(reason)`` ends it from another task."""

    def __init__(self, session: ExecSession, on_close: Callable[[ExecStream], None]) -> None:
        self._session = session
        self._on_close = on_close
        self._abort_reason: str | None = None
        self._closed = False
        self.started = time.monotonic()

    async def abort(self, reason: str) -> None:
        """Ends the exchange (the guest then kills the command's process group)."""
        self._abort_reason = reason
        await self._session.aclose()

    async def frames(self) -> AsyncIterator[Frame]:
        decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
        try:
            async for event in self._session:
                if isinstance(event, Output):
                    text = decoders[event.stream].decode(event.data)
                    if text:
                        yield {event.stream: text}
                elif isinstance(event, Exited):
                    for name, decoder in decoders.items():
                        tail = decoder.decode(b"", final=True)
                        if tail:
                            yield {name: tail}
                    yield {"exit_code": event.exit_code}
                    return
                elif isinstance(event, SpawnFailed):
                    yield {"error": event.message}
                    yield {"exit_code": -1}
                    return
        except GuestError as exc:
            yield {"error": self._abort_reason or f"lost the guest agent: {exc}"}
            yield {"exit_code": -1}
        finally:
            await self.close()

    async def collect(self) -> dict[str, Any]:
        """Runs to the end and returns ``{stdout, stderr, exit_code, error?, exec_ms}``."""
        stdout: list[str] = []
        stderr: list[str] = []
        result: dict[str, Any] = {"exit_code": -1}
        async for frame in self.frames():
            if "stdout" in frame:
                stdout.append(frame["stdout"])
            elif "stderr" in frame:
                stderr.append(frame["stderr"])
            elif "error" in frame:
                result["error"] = frame["error"]
            elif "exit_code" in frame:
                result["exit_code"] = frame["exit_code"]
        result["stdout"] = "".join(stdout)
        result["stderr"] = "".join(stderr)
        result["exec_ms"] = round((time.monotonic() - self.started) * 1000, 3)
        return result

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._session.aclose()
            self._on_close(self)
