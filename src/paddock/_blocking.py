"""What blocks in ``Client`` and is awaited in ``AsyncClient``, hand-written in both forms.

``_client.py``, ``_sandbox.py`` and ``_resources.py`` are generated from their ``_async_`` twins by
``scripts/unasync.py``, which substitutes tokens. The few places where the two clients truly differ —
sleeping, preparing an upload body, writing a download to a local file — live here as pairs whose names
that script maps one onto the other (``asleep`` → ``sleep``, ``aupload_body`` → ``upload_body``,
``AsyncFileSink`` → ``FileSink``, ``AsyncBytesBody`` → ``BytesBody``, ``AsyncSource`` → ``Source``), so the generated code calls the sync form.
A background command's output is read by a task (``abackground``) in the async client and by a thread
(``background``) in the sync one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import stat
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import IO, Any

#: Uploads are read, and downloads written, about this much at a time.
CHUNK_BYTES = 1 << 20

#: What ``files.write`` accepts: bytes or text (UTF-8), a local path, a binary file, or byte chunks.
Source = bytes | str | os.PathLike[str] | IO[bytes] | Iterable[bytes]
#: The async client also takes async iterables of byte chunks.
AsyncSource = bytes | str | os.PathLike[str] | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes]


async def asleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def abackground(work: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
    """Runs ``work`` beside the caller: a task on the running event loop."""
    return asyncio.get_running_loop().create_task(work())


def background(work: Callable[[], None]) -> threading.Thread:
    """Runs ``work`` beside the caller: a daemon thread."""
    thread = threading.Thread(target=work, name="paddock-output", daemon=True)
    thread.start()
    return thread


async def ajoin(worker: asyncio.Task[None], timeout_s: float | None) -> bool:
    """Waits for what ``abackground`` started; False when ``timeout_s`` passed first."""
    done, _ = await asyncio.wait({worker}, timeout=timeout_s)
    return bool(done)


def join(worker: threading.Thread, timeout_s: float | None) -> bool:
    """Waits for what ``background`` started; False when ``timeout_s`` passed first."""
    worker.join(timeout_s)
    return not worker.is_alive()


async def acallback(callback: Callable[[str], Any], text: str) -> None:
    """Calls an output callback, a plain function or a coroutine function."""
    result = callback(text)
    if inspect.isawaitable(result):
        await result


def callback(callback: Callable[[str], Any], text: str) -> None:
    """Calls an output callback (in the thread that reads the output)."""
    callback(text)


def aupload_body(source: Any, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The streamed body of an upload; a regular file's remaining length goes into ``headers`` so that an
    oversized upload is refused before it is sent. Files are read in a worker thread."""
    if hasattr(source, "read"):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                headers["Content-Length"] = str(os.fstat(source.fileno()).st_size - source.tell())
    return _achunks(source)


def upload_body(source: Any, headers: dict[str, str]) -> Any:
    """The streamed body of an upload: httpx streams a regular file itself, with its Content-Length;
    pipes and other iterables go out chunked. ``headers`` is left as it is."""
    return source if _regular_file(source) else _chunks(source)


class AsyncBytesBody:
    """An upload held in memory, sent as ``CHUNK_BYTES`` slices under its own Content-Length, and
    iterable again when the request is retried."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[memoryview]:
        view = memoryview(self._data)
        for start in range(0, len(view), CHUNK_BYTES):
            yield view[start : start + CHUNK_BYTES]


class BytesBody:
    """An upload held in memory, sent as ``CHUNK_BYTES`` slices under its own Content-Length, and
    iterable again when the request is retried. Handing httpx's sync transport the whole body instead
    costs time quadratic in its size (it copies what is left after every ``send``: ~0.5 s of CPU for
    100 MB)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __iter__(self) -> Iterator[memoryview]:
        view = memoryview(self._data)
        for start in range(0, len(view), CHUNK_BYTES):
            yield view[start : start + CHUNK_BYTES]


class AsyncFileSink:
    """Writes a download into a local file from a worker thread, about 1 MiB at a time, so the event
    loop never waits on the disk."""

    def __init__(self, dest: IO[bytes]) -> None:
        self._dest = dest
        self._pending = bytearray()

    async def write(self, chunk: bytes) -> None:
        self._pending += chunk
        if len(self._pending) >= CHUNK_BYTES:
            await self.finish()

    async def finish(self) -> None:
        """Write what is still held."""
        if self._pending:
            await asyncio.to_thread(self._dest.write, bytes(self._pending))
            self._pending.clear()


class FileSink:
    """Writes a download into a local file chunk by chunk, as it arrives."""

    def __init__(self, dest: IO[bytes]) -> None:
        self._dest = dest

    def write(self, chunk: bytes) -> None:
        self._dest.write(chunk)

    def finish(self) -> None:
        """Nothing is held back."""


def _regular_file(source: Any) -> bool:
    try:
        return hasattr(source, "read") and stat.S_ISREG(os.fstat(source.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):
        return False


async def _achunks(source: Any) -> AsyncIterator[bytes]:
    """Byte chunks from a binary file (read in a worker thread), an async iterable or an iterable."""
    if hasattr(source, "read"):
        while chunk := await asyncio.to_thread(source.read, CHUNK_BYTES):
            yield chunk
    elif hasattr(source, "__aiter__"):
        async for chunk in source:
            yield chunk
    else:
        for chunk in source:
            yield chunk


def _chunks(source: Any) -> Iterator[bytes]:
    """Byte chunks from a binary file or an iterable."""
    if hasattr(source, "read"):
        while chunk := source.read(CHUNK_BYTES):
            yield chunk
    else:
        yield from source
