"""The control plane's end of the kept channel to one host agent (``channelwire.py``).

``AgentChannel.call`` sends a call over the channel and waits for its answer; calls share the one
WebSocket, told apart by ids. It returns ``None`` when the channel cannot carry the call (it is down and
could not be opened, the agent refused or does not know it or that call, the call is too big): the caller then makes
the same call over HTTP, which stays the contract. After a failed open the channel is not tried again
for ``retry_after_s``, so a host without it costs one attempt, not one per call.

The channel is opened through the caller's ``aiohttp.ClientSession`` at the agent's own URL
(``https://`` → ``wss://``), so it verifies the agent's certificate exactly as the HTTP calls do.
A channel that drops fails the calls in flight with :class:`ChannelLostError` (their commands are
killed on the agent, as they would be when an HTTP connection drops); the next call opens a new one.
A cancelled call sends a cancel frame, so the agent stops its command at once.

``AgentChannel.stream`` makes a streamed call (``channelwire.STREAM_OPS``): its first answer, then its
lines as they come. The agent sends at most ``channelwire.STREAM_WINDOW_BYTES`` ahead of the reader,
which grants more as it reads, so a slow reader slows its stream and never the channel's one reader
(every call on the channel would wait with it). Lines beyond the window (an agent that ignores it) are
not kept: past ``MAX_STREAM_BUFFER_BYTES`` the stream is cancelled on the agent and ends in
:class:`ChannelStreamLaggedError` once what was buffered is read, and its caller goes on another way
(over HTTP, from where the channel left off).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from paddock_hostagent import channelwire

# As long as an HTTP call may take to connect: past it, HTTP carries the call.
_OPEN_TIMEOUT_S = 5.0
_HEARTBEAT_S = 20.0


#: What a stream may hold for its reader before it is given up (module docstring): its window and
#: the one line that may overdraw it.
MAX_STREAM_BUFFER_BYTES = channelwire.STREAM_WINDOW_BYTES + (1 << 20)


class ChannelLostError(ConnectionError):
    """The channel closed before the call's answer arrived (the call may or may not have run)."""


class ChannelStreamLaggedError(ConnectionError):
    """A stream's reader fell ``MAX_STREAM_BUFFER_BYTES`` behind: the agent was told to stop it."""


@dataclass(eq=False)
class _Stream:
    """A streamed call's answers: the first, then its lines (``None`` ends them)."""

    head: asyncio.Future[tuple[int, bytes]]
    lines: asyncio.Queue[bytes | BaseException | None] = field(default_factory=asyncio.Queue)
    buffered: int = 0
    ended: bool = False

    def take(self, status: int, body: bytes) -> bool:
        """Files one answer; False once the reader is too far behind (the call is to be cancelled)."""
        if not self.head.done():
            self.head.set_result((status, body))
            self.ended = status != 200
            return True
        if self.ended:
            return True
        if status == channelwire.STATUS_END:
            self.ended = True
            if body:
                self.buffered += len(body)
                self.lines.put_nowait(body)
            self.lines.put_nowait(None)
            return True
        self.buffered += len(body)
        if self.buffered > MAX_STREAM_BUFFER_BYTES:
            self.fail(ChannelStreamLaggedError("the stream's reader fell behind the agent"))
            return False
        self.lines.put_nowait(body)
        return True

    def fail(self, exc: BaseException) -> None:
        if not self.head.done():
            self.head.set_exception(exc)
        elif not self.ended:
            self.ended = True
            self.lines.put_nowait(exc)


@dataclass(eq=False)
class _Link:
    """One open WebSocket and the calls waiting for an answer on it."""

    ws: aiohttp.ClientWebSocketResponse
    #: The calls the agent takes (``channelwire.ops_of`` its answer to the upgrade).
    ops: frozenset[int]
    pending: dict[int, asyncio.Future[tuple[int, bytes]]] = field(default_factory=dict)
    streams: dict[int, _Stream] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        return not self.ws.closed


class AgentChannel:
    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        session: Callable[[], aiohttp.ClientSession],
        *,
        retry_after_s: float = 5.0,
    ) -> None:
        self._url = base_url.rstrip("/") + channelwire.PATH
        self._headers = headers
        self._session = session
        self._retry_after_s = retry_after_s
        self._link: _Link | None = None
        self._opening: asyncio.Lock | None = None
        self._closed_until = 0.0
        self._ids = itertools.count(1)
        self._background: set[asyncio.Task[Any]] = set()
        #: Why the last open failed, for logs and tests (``None`` once one succeeds).
        self.last_failure: str | None = None

    @property
    def is_open(self) -> bool:
        return self._link is not None and self._link.up

    async def _carrier(
        self, op: int, sandbox_id: str, request_id: str, body: bytes
    ) -> tuple[_Link, int, bytes] | None:
        """The open link, the call's id and its frame; ``None`` when the channel cannot carry the call
        (too big, down and not to be opened now, an agent without that call)."""
        call_id = next(self._ids) & 0xFFFFFFFF
        frame = channelwire.encode_call(call_id, op, request_id, sandbox_id, body)
        if len(frame) > channelwire.MAX_CALL_BYTES:
            return None
        link = await self._open()
        if link is None or op not in link.ops:
            return None
        return link, call_id, frame

    async def call(self, op: int, sandbox_id: str, request_id: str, body: bytes) -> tuple[int, bytes] | None:
        """(status, answer body), or ``None`` when HTTP should carry this call instead."""
        carried = await self._carrier(op, sandbox_id, request_id, body)
        if carried is None:
            return None
        link, call_id, frame = carried
        answer: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        link.pending[call_id] = answer
        try:
            try:
                await link.ws.send_bytes(frame)
            except (ConnectionError, aiohttp.ClientError):
                # Nothing reached the agent whole (it acts on whole messages only): HTTP can carry it.
                self._lost(link)
                return None
            try:
                return await answer
            except asyncio.CancelledError:
                # (cancelling this task cancelled ``answer`` too: an answer that arrived is a result)
                answered = answer.done() and not answer.cancelled()
                if not answered and link.up:
                    self._spawn(self._cancel(link, call_id))
                raise
        finally:
            link.pending.pop(call_id, None)

    async def stream(
        self, op: int, sandbox_id: str, request_id: str, body: bytes
    ) -> tuple[int, bytes, AsyncGenerator[bytes, None] | None] | None:
        """A streamed call: (status, first answer's body, its lines after a 200), or ``None`` when
        HTTP should carry it. The lines end with the stream; they raise :class:`ChannelLostError` if
        the channel drops first, :class:`ChannelStreamLaggedError` if their reader fell too far
        behind. Closing them early cancels the call on the agent."""
        carried = await self._carrier(op, sandbox_id, request_id, body)
        if carried is None:
            return None
        link, call_id, frame = carried
        stream = _Stream(asyncio.get_running_loop().create_future())
        link.streams[call_id] = stream
        try:
            try:
                await link.ws.send_bytes(frame)
            except (ConnectionError, aiohttp.ClientError):
                self._lost(link)
                link.streams.pop(call_id, None)
                return None
            status, head = await stream.head
        except BaseException:
            link.streams.pop(call_id, None)
            if link.up:
                self._spawn(self._cancel(link, call_id))
            raise
        if status != 200:
            link.streams.pop(call_id, None)
            return status, head, None
        return status, head, self._lines(link, call_id, stream)

    async def _lines(self, link: _Link, call_id: int, stream: _Stream) -> AsyncGenerator[bytes, None]:
        read = 0  # bytes read since the last credit
        try:
            while True:
                line = await stream.lines.get()
                if line is None:
                    return
                if isinstance(line, BaseException):
                    raise line
                stream.buffered -= len(line)
                read += len(line)
                if read >= channelwire.STREAM_WINDOW_BYTES // 4 and link.up:
                    self._spawn(self._credit(link, call_id, read))
                    read = 0
                yield line
        finally:
            link.streams.pop(call_id, None)
            if not stream.ended and link.up:  # the reader left early: the agent stops streaming
                self._spawn(self._cancel(link, call_id))

    async def aclose(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.ws.close()
            if link.reader is not None:
                link.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await link.reader
        for task in list(self._background):
            task.cancel()

    async def _open(self) -> _Link | None:
        if self._link is not None and self._link.up:
            return self._link
        if time.monotonic() < self._closed_until:
            return None
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:  # one open at a time; the others use what it opened
            if self._link is not None and self._link.up:
                return self._link
            if time.monotonic() < self._closed_until:
                return None
            try:
                async with asyncio.timeout(_OPEN_TIMEOUT_S):
                    ws = await self._session().ws_connect(
                        self._url,
                        headers=self._headers,
                        max_msg_size=0,  # answers are as large as the HTTP route's (output is capped there)
                        timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0),
                        # A link that dies silently (a host gone from the network) is closed within
                        # ~1.5 heartbeats, failing its calls, instead of leaving them waiting.
                        heartbeat=_HEARTBEAT_S,
                        compress=0,
                        protocols=channelwire.PROTOCOLS,
                    )
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                # 403 (a token the agent refuses), 404 (an agent without the channel), no answer:
                # HTTP carries the calls, and says what is wrong when it is wrong there too.
                self.last_failure = str(exc) or type(exc).__name__
                self._closed_until = time.monotonic() + self._retry_after_s
                return None
            self.last_failure = None
            link = self._link = _Link(ws, channelwire.ops_of(ws.protocol))
            link.reader = asyncio.create_task(self._read(link))
            return link

    async def _read(self, link: _Link) -> None:
        try:
            async for message in link.ws:
                if message.type != aiohttp.WSMsgType.BINARY:
                    break
                try:
                    call_id, status, body = channelwire.decode_answer(message.data)
                except channelwire.FrameError:
                    break
                stream = link.streams.get(call_id)
                if stream is not None:
                    if not stream.take(status, body):
                        link.streams.pop(call_id, None)
                        self._spawn(self._cancel(link, call_id))
                    continue
                answer = link.pending.get(call_id)
                if answer is not None and not answer.done():
                    answer.set_result((status, body))
        except (aiohttp.ClientError, ConnectionError):
            pass
        finally:
            self._lost(link)
            if not link.ws.closed:
                self._spawn(link.ws.close())

    def _lost(self, link: _Link) -> None:
        """The link is gone: its calls in flight fail, the next call opens a new one."""
        if self._link is link:
            self._link = None
        for answer in link.pending.values():
            if not answer.done():
                answer.set_exception(ChannelLostError("the channel to the host agent closed"))
        for stream in link.streams.values():
            stream.fail(ChannelLostError("the channel to the host agent closed"))

    async def _credit(self, link: _Link, call_id: int, nbytes: int) -> None:
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            await link.ws.send_bytes(channelwire.encode_credit(call_id, nbytes))

    async def _cancel(self, link: _Link, call_id: int) -> None:
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            await link.ws.send_bytes(channelwire.encode_cancel(call_id))

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
