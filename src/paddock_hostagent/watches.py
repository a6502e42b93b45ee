"""A directory watch in a sandbox: the guest agent's inotify events (``guest/watch.c``) as NDJSON lines,
for ``GET /internal/v1/sandboxes/{id}/files/watch?path=&recursive=``.

The first line is ``{"watching": path, "directories": n, "complete": bool}`` once the guest's watches are
in place (``complete`` is false when the tree holds more directories than the guest watches). Then
``{"event": "create"|"modify"|"delete"|"overflow", "type": "file"|"dir"|"symlink"|"other", "path": rel}``
with ``rel`` relative to the watched directory (an overflow: events were lost, list again), until the
client leaves or the watch ends with ``{"error": message, "code": "file_not_found"}`` (the watched
directory went) or ``{"error": message, "code": "sandbox_gone"}`` (the guest did: the sandbox was
destroyed or stopped). The path is resolved by the guest, inside the sandbox (rule 3).

Refusals come before any line: 404 ``file_not_found``, 400 ``bad_path`` (not a directory, not absolute),
409 ``unsupported_on_tier`` when the sandbox's guest has no watch to give (a guest older than WATCH, or no
inotify instance left: the caller may poll a listing instead), 503 ``busy`` past
``MAX_WATCHES_PER_SANDBOX`` open here. A watch is not activity: it does not keep a sandbox awake.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator

from paddock_hostagent import errors
from paddock_hostagent.guest import GuestBadPathError, GuestError, GuestFileNotFoundError
from paddock_hostagent.guest.client import DirectoryWatch, GuestBusyError
from paddock_hostagent.guest.protocol import GuestNotDirectoryError, GuestWatchUnavailableError
from paddock_hostagent.sandboxes import SandboxManager
from paddock_hostagent.sandboxes.checks import check_path

#: Open watches per sandbox on this host (each holds a guest handler process and an inotify instance);
#: the control plane allows fewer (``sandbox_fs.MAX_WATCHES_PER_SANDBOX``), this bounds any caller.
MAX_WATCHES_PER_SANDBOX = 16
_open: Counter[str] = Counter()


class WatchStream:
    """An open watch: ``lines()`` to stream it, ``close()`` (idempotent) when the response ends, even one
    whose body never started."""

    def __init__(self, sandbox_id: str, path: str, watch: DirectoryWatch) -> None:
        self.sandbox_id, self.path, self._watch = sandbox_id, path, watch
        self._closed = False

    async def lines(self) -> AsyncIterator[bytes]:
        watch = self._watch
        try:
            head = {"watching": self.path, "directories": watch.directories, "complete": watch.complete}
            yield _line(head)
            try:
                async for event in watch:
                    yield _line({"event": event.kind, "type": event.type, "path": event.path})
            except GuestFileNotFoundError as exc:
                yield _line({"error": str(exc), "code": "file_not_found"})
            except GuestError as exc:
                yield _line({"error": f"the sandbox is no longer running: {exc}", "code": "sandbox_gone"})
        finally:
            await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._watch.aclose()
            _open[self.sandbox_id] -= 1
            if _open[self.sandbox_id] <= 0:
                del _open[self.sandbox_id]


def _line(doc: dict[str, object]) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode() + b"\n"


async def open_watch(manager: SandboxManager, sandbox_id: str, path: str, recursive: bool) -> WatchStream:
    entry = manager.running_entry(sandbox_id)
    check_path(path)
    if _open[sandbox_id] >= MAX_WATCHES_PER_SANDBOX:
        raise errors.Busy(f"sandbox {sandbox_id} has {MAX_WATCHES_PER_SANDBOX} open watches; close one")
    watch = manager.runtime.guest(entry.record).watch(path, recursive=recursive)
    _open[sandbox_id] += 1
    stream = WatchStream(sandbox_id, path, watch)
    try:
        try:
            await watch.__aenter__()
        except GuestFileNotFoundError as exc:
            raise errors.FileNotFound(str(exc)) from exc
        except (GuestNotDirectoryError, GuestBadPathError) as exc:
            raise errors.BadPath(str(exc)) from exc
        except GuestWatchUnavailableError as exc:
            raise errors.UnsupportedOnTier(f"no directory watch from this sandbox: {exc}") from exc
        except GuestBusyError as exc:
            raise errors.Busy(f"sandbox {sandbox_id} is busy: {exc}; retry") from exc
        except GuestError as exc:
            manager.running_entry(sandbox_id)  # one that stopped is a 409
            raise errors.SandboxFailed(f"guest agent of {sandbox_id} unreachable: {exc}") from exc
    except BaseException:
        await stream.close()
        raise
    return stream
