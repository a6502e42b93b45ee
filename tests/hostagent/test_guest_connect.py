"""Connecting to a guest agent under load (``guest/client.py``): a full listen backlog is waited out, a
guest that takes no connection is busy (503 upstream), one that is gone is unavailable.

A real unix socket stands in for the guest: a listener with a backlog of 1 that nobody accepts on is
what a guest meets when a burst of execs outruns its accept loop (its backlog is 128; connects past it
fail with EAGAIN, which answered 500 before)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.guest.client import ConnectGates, GuestBusyError, GuestClient, KeptConnections
from paddock_hostagent.guest.protocol import HEADER, PROTOCOL_VERSION, Frame, GuestUnavailableError


def answer_info(conn: socket.socket) -> None:
    conn.recv(HEADER.size)
    payload = struct.pack("<QII", 0, 0, PROTOCOL_VERSION) + struct.pack("<II", 0, 0)
    conn.sendall(HEADER.pack(Frame.INFO_REPLY, len(payload)) + payload)


@pytest.fixture
def full_backlog(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    """A listening socket whose backlog is full: the next connect meets EAGAIN."""
    path = tmp_path / "guest.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    fillers = []
    while True:
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(str(path))
        except BlockingIOError:
            filler.close()
            break
        fillers.append(filler)
    try:
        yield path, listener
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def client(path: Path, connect_timeout_s: float = 5.0, turn_timeout_s: float = 5.0) -> GuestClient:
    return GuestClient(
        path,
        connect_timeout_s=connect_timeout_s,
        turn_timeout_s=turn_timeout_s,
        kept=KeptConnections(),
        gates=ConnectGates(),
    )


def test_a_full_backlog_is_waited_out_until_the_guest_accepts(
    full_backlog: tuple[Path, socket.socket],
) -> None:
    path, listener = full_backlog

    def accept_later() -> None:
        time.sleep(0.3)
        while True:  # the fillers first, then our connection
            conn, _ = listener.accept()
            conn.settimeout(0.2)
            try:
                answer_info(conn)
                return
            except OSError:
                conn.close()

    acceptor = threading.Thread(target=accept_later, daemon=True)
    acceptor.start()
    started = time.monotonic()
    info = asyncio.run(client(path).info())
    acceptor.join(5)
    assert info.version == PROTOCOL_VERSION
    assert time.monotonic() - started >= 0.25, "answered before the guest accepted anything"


def test_a_backlog_that_stays_full_is_busy_within_the_connect_timeout(
    full_backlog: tuple[Path, socket.socket],
) -> None:
    path, _ = full_backlog
    started = time.monotonic()
    with pytest.raises(GuestBusyError, match="busy"):
        asyncio.run(client(path, connect_timeout_s=0.5).info())
    assert time.monotonic() - started < 2


def test_callers_past_the_queue_are_refused_as_busy_at_once(full_backlog: tuple[Path, socket.socket]) -> None:
    path, _ = full_backlog
    gates = ConnectGates(slots=2, max_waiting=3)

    async def burst() -> list[BaseException | object]:
        clients = [
            GuestClient(path, connect_timeout_s=0.5, turn_timeout_s=0.5, kept=None, gates=gates)
            for _ in range(8)
        ]
        return await asyncio.gather(*(each.info() for each in clients), return_exceptions=True)

    outcomes = asyncio.run(burst())
    assert all(isinstance(outcome, GuestBusyError) for outcome in outcomes), outcomes
    assert sum("connections waiting" in str(outcome) for outcome in outcomes) == 3  # 8 - 2 slots - 3 queued


def test_a_guest_that_is_gone_is_unavailable_not_busy(tmp_path: Path) -> None:
    path = tmp_path / "guest.sock"
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(str(path))  # a socket file nobody listens on
    with pytest.raises(GuestUnavailableError) as caught:
        asyncio.run(client(path).info())
    assert not isinstance(caught.value, GuestBusyError)
