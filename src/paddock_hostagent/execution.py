"""One command running in a sandbox, as the API sees it: frames of decoded text, then an exit code.

Output bytes are decoded as UTF-8 with invalid sequences replaced; an incremental decoder per stream
keeps a multi-byte character that straddles two chunks whole. Whatever happens, the frames end with
exactly one ``{"exit_code": N}``; a command that could not start, a pause, or a lost guest agent end
with ``{"error": ...}`` then ``{"exit_code": -1}``.

A buffered command (``collect``) keeps at most ``MAX_BUFFERED_OUTPUT_BYTES`` of each stream: a command
that prints more still runs to its end (its exit code is real), the rest of that stream is read and
dropped, and the result says ``stdout_truncated``/``stderr_truncated``. A stream has no such limit.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from paddock_hostagent.guest import ExecSession, Exited, GuestError, Output, SpawnFailed

PAUSED_MESSAGE = "sandbox paused"
DESTROYED_MESSAGE = "sandbox destroyed"
# Per stream. One JSON body then stays a few MiB (a 50 MB answer once came back whole); whoever needs
# everything streams it (``stream: true``) or writes it to a file and downloads that.
MAX_BUFFERED_OUTPUT_BYTES = 4 << 20
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

    async def collect(self, limit_bytes: int = MAX_BUFFERED_OUTPUT_BYTES) -> dict[str, Any]:
        """Runs to the end and returns ``{stdout, stderr, exit_code, error?, exec_ms}``, each stream cut
        at ``limit_bytes`` of UTF-8 (on a character boundary) with ``<stream>_truncated: true``."""
        kept: dict[str, list[str]] = {"stdout": [], "stderr": []}
        room = {"stdout": limit_bytes, "stderr": limit_bytes}
        result: dict[str, Any] = {"exit_code": -1}
        async for frame in self.frames():
            if "error" in frame:
                result["error"] = frame["error"]
            elif "exit_code" in frame:
                result["exit_code"] = frame["exit_code"]
            else:
                for name, text in frame.items():
                    if room[name] <= 0:
                        result[f"{name}_truncated"] = True
                        continue
                    size = len(text) if text.isascii() else len(text.encode())
                    if size > room[name]:
                        text = text.encode()[: room[name]].decode("utf-8", "ignore")
                        result[f"{name}_truncated"] = True
                        size = room[name]
                    kept[name].append(text)
                    room[name] -= size
        result["stdout"] = "".join(kept["stdout"])
        result["stderr"] = "".join(kept["stderr"])
        result["exec_ms"] = round((time.monotonic() - self.started) * 1000, 3)
        return result

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._session.aclose()
            self._on_close(self)
