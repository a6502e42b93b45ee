"""The host end of a VM's guest channel: the guest agent's unix socket, served over one virtio-serial port.

QEMU exposes the VM's ``paddock.0`` port as a unix socket (``chan.sock``, QEMU is the server). This
module connects to it and listens on ``guest.sock``: every connection a ``GuestClient`` opens there
becomes a channel, multiplexed over the port to ``paddock-vminit`` inside the VM, which opens a
connection to the guest agent for it (the frame table is in ``guest/vm/vminit.c``). So callers keep
the agent's protocol unchanged, whatever the tier: a connection per caller, which carries one request
after another while each leaves it clean (the host agent's kept connections).

On connect the host sends HELLO; the guest drops every channel and answers READY. The host skips any
bytes before READY, so a VM restored from a memory snapshot with half a frame in flight, or a host
agent restarted mid-request, starts again from a clean boundary. If the port closes (QEMU exited),
every client connection is closed too.

There is no per-channel flow control: a reader that stops reading makes the other side buffer what
the guest sends it (bounded by what the request produces: file reads, command output).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import struct
import time
from pathlib import Path

from paddock_core.logging import get_logger

log = get_logger(__name__)

HEADER = struct.Struct("<IBI")
MAGIC = b"paddock-vmchan-1"
HELLO, OPEN, DATA, CLOSE, CONFIG, READY, OOM = 1, 2, 3, 4, 5, 6, 7
_CHUNK = 64 * 1024


class GuestChannel:
    def __init__(self, port_path: Path, listen_path: Path) -> None:
        self.port_path = port_path
        self.listen_path = listen_path
        self.ready = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._port_writer: asyncio.StreamWriter | None = None
        self._pump: asyncio.Task[None] | None = None
        self._clients: dict[int, asyncio.StreamWriter] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_id = 1
        self.closed = asyncio.Event()
        # The guest kernel's OOM kill count, as the guest last reported it (OOM frames).
        self.oom_kills = 0

    async def start(self, *, connect_timeout_s: float = 10.0) -> None:
        """Connects to QEMU's end of the port (retrying while QEMU starts) and starts listening."""
        deadline = asyncio.get_running_loop().time() + connect_timeout_s
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(self.port_path), limit=1 << 22)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.01)
        self._port_writer = writer
        writer.write(HEADER.pack(0, HELLO, len(MAGIC)) + MAGIC)
        self._pump = asyncio.create_task(self._read_port(reader))
        self.listen_path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, str(self.listen_path))

    async def wait_ready(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            await self.ready.wait()

    def configure(self, ip: str, gateway: str, hostname: str, mac: str) -> None:
        """Gives a restored or forked VM its own identity: eth0's address, route and MAC, the hostname,
        the host's wall clock and 32 random bytes for the guest kernel to reseed its generator with
        (else every VM restored from one saved state draws the same numbers)."""
        now_ns = time.time_ns()
        when = f"{now_ns // 1_000_000_000}.{now_ns % 1_000_000_000:09d}"
        text = f"{ip} {gateway} {hostname} {mac} {when} {secrets.token_hex(32)}"
        self._send(0, CONFIG, text.encode())

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        self._drop_clients()
        for task in list(self._tasks):
            task.cancel()
        if self._port_writer is not None:
            self._port_writer.close()
        self.listen_path.unlink(missing_ok=True)
        self.closed.set()

    def _send(self, channel: int, kind: int, payload: bytes = b"") -> None:
        if self._port_writer is None or self._port_writer.is_closing():
            return
        self._port_writer.write(HEADER.pack(channel, kind, len(payload)) + payload)

    def _drop_clients(self) -> None:
        for writer in self._clients.values():
            writer.close()
        self._clients.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.ready.is_set():
            # the guest is not up yet: hold the connection until it is (a GuestClient's request waits)
            waiter = asyncio.ensure_future(self.ready.wait())
            closed = asyncio.ensure_future(self.closed.wait())
            await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            closed.cancel()
            if not self.ready.is_set():
                writer.close()
                return
        channel = self._next_id
        self._next_id = self._next_id % 0xFFFFFFF0 + 1
        self._clients[channel] = writer
        self._send(channel, OPEN)
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                self._send(channel, DATA, data)
                if self._port_writer is not None:
                    await self._port_writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if self._clients.pop(channel, None) is not None:
                self._send(channel, CLOSE)
            writer.close()

    async def _read_port(self, reader: asyncio.StreamReader) -> None:
        try:
            await self._sync(reader)
            while True:
                header = await reader.readexactly(HEADER.size)
                channel, kind, length = HEADER.unpack(header)
                payload = await reader.readexactly(length) if length else b""
                if kind == READY:
                    self._drop_clients()
                    self.ready.set()
                    continue
                if kind == OOM and length == 4:
                    self.oom_kills = struct.unpack("<I", payload)[0]
                    continue
                writer = self._clients.get(channel)
                if writer is None:
                    continue
                if kind == DATA:
                    writer.write(payload)
                    with contextlib.suppress(ConnectionError, OSError):
                        await writer.drain()
                elif kind == CLOSE:
                    self._clients.pop(channel, None)
                    writer.close()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            log.info("vm_channel_closed", port=str(self.port_path))
        finally:
            self.ready.clear()
            self.closed.set()
            self._drop_clients()

    async def _sync(self, reader: asyncio.StreamReader) -> None:
        """Skips bytes up to and including the first READY frame (a byte at a time: it is near)."""
        pattern = struct.pack("<BI", READY, len(MAGIC)) + MAGIC
        window = bytearray()
        while not (len(window) >= 4 + len(pattern) and window.endswith(pattern)):
            window += await reader.readexactly(1)
            del window[: -(4 + len(pattern))]
        self._drop_clients()
        self.ready.set()
