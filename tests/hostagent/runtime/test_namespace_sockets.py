"""What a network namespace's sockets look like to the check that decides whether a destroyed
sandbox's network may serve the next one (``network.open_sockets``, used by
``NetworkManager.pristine``): counted from ``/proc/net/sockstat`` rather than listed from
``/proc/net/tcp``, which walks the host's whole TCP tables (31 + 50 ms for tcp and tcp6 in an empty
namespace here). Every socket a tenant can leave must still count: listening, bound, connected on
either family, and one in TIME_WAIT after every descriptor is closed.

On a namespace this test makes; ``test_slot_recycling.py`` recycles real sandboxes' networks."""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from paddock_hostagent.drivers.net.network import open_sockets
from paddock_hostagent.drivers.system.nsthread import CLONE_NEWNET, in_namespace

pytestmark = [pytest.mark.root]

T = TypeVar("T")
NET = Path("/proc/thread-self/net")


@pytest.fixture
def netns() -> Iterator[Path]:
    name = f"pdk-sock-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield Path("/run/netns") / name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def inside(netns: Path, work: Callable[[], T]) -> T:
    return in_namespace(netns, CLONE_NEWNET, work, "the test's namespace")


def test_an_empty_namespace_holds_no_socket_and_each_kind_left_open_counts(netns: Path) -> None:
    assert inside(netns, lambda: open_sockets(NET)) == []
    made: list[socket.socket] = []

    def make(family: socket.AddressFamily, kind: socket.SocketKind, address: str) -> None:
        sock = socket.socket(family, kind)
        sock.bind((address, 0))
        if kind == socket.SOCK_STREAM:
            sock.listen()
        made.append(sock)

    cases = [
        (socket.AF_INET6, socket.SOCK_STREAM, "::", "TCP6 inuse 1"),
        (socket.AF_INET, socket.SOCK_DGRAM, "0.0.0.0", "UDP inuse 1"),
        (socket.AF_INET6, socket.SOCK_DGRAM, "::", "UDP6 inuse 1"),
        (socket.AF_INET, socket.SOCK_STREAM, "127.0.0.1", "TCP inuse 1"),
    ]
    try:
        for family, kind, address, seen in cases:
            inside(netns, lambda: make(family, kind, address))  # noqa: B023 (called at once)
            assert seen in inside(netns, lambda: open_sockets(NET)), seen
    finally:
        for sock in made:
            sock.close()
    assert inside(netns, lambda: open_sockets(NET)) == []
    unix = inside(netns, lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    try:
        assert "unix" in inside(netns, lambda: open_sockets(NET))
    finally:
        unix.close()


def test_a_connection_closed_first_by_its_client_leaves_time_wait_that_counts(netns: Path) -> None:
    def connect_and_close() -> None:
        with socket.create_server(("127.0.0.1", 0)) as server:
            client = socket.create_connection(server.getsockname())
            accepted, _ = server.accept()
            client.close()  # the side that closes first is the one left in TIME_WAIT
            accepted.recv(1)
            accepted.close()

    inside(netns, connect_and_close)
    deadline = time.monotonic() + 5
    found = inside(netns, lambda: open_sockets(NET))
    while found != ["TCP tw 1"] and time.monotonic() < deadline:  # the last FIN's ACK, on loopback
        time.sleep(0.05)
        found = inside(netns, lambda: open_sockets(NET))
    assert found == ["TCP tw 1"], "no descriptor is open, yet the connection's TIME_WAIT must count"
