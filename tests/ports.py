"""Loopback ports for the services tests start.

A port the kernel picks (a bind to port 0) comes from the ephemeral range, the range it also picks
every outgoing connection's source port from, on the whole machine. In the seconds between a test
picking such a port and its service binding it, another test's connection can take it: CI saw a host
agent fail to start with ``address already in use`` on a port picked that way moments before. So the
tests pick below the ephemeral range, where the kernel hands out nothing by itself, and each pytest
worker (xdist's ``gwN``) picks in a slice of its own, so two workers never pick the same port.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

_LOW = 20000  # above the fixed ports the platform's defaults use (8443, 2222, 9090, 5432, ...)
_SLICES = 12


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_index() -> int:
    """This pytest worker's number (xdist's ``gwN``); the pid where there are no workers, so that two
    runs side by side most likely differ."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else os.getpid()


def _slice() -> range:
    size = max((min(_ephemeral_low(), 32768) - _LOW) // _SLICES, 100)
    start = _LOW + (worker_index() % _SLICES) * size
    return range(start, start + size)


_ports = _slice()
_next = itertools.count(os.getpid() % len(_ports))  # two runs one after the other start apart


def free_port() -> int:
    """A loopback port nothing is bound to now and no other worker of this run will pick."""
    for _ in range(len(_ports)):
        port = _ports[next(_next) % len(_ports)]
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free loopback port in {_ports.start}-{_ports.stop - 1}")
