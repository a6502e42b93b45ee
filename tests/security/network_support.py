"""What the network probes need on the host side: listeners, a local link-local address, sockets opened
inside a sandbox's namespace, and hand-made IPv4 packets. Nothing here sends traffic off this machine.

``socket_in`` (through ``made_in``) opens a socket inside a network namespace without a subprocess: a
short-lived thread enters the namespace (setns) and creates the socket, which stays in that namespace
after the thread ends. The
test process is root, so it can do in a sandbox's namespace what the sandbox itself may not (raw
sockets, sysctls): that is how the probes show the host still refuses what a sandbox could do if it
had those powers.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from paddock_hostagent.drivers.system.nsthread import CLONE_NEWNET, in_namespace

T = TypeVar("T")
METADATA_ADDRESS = "169.254.169.254"
HELLO = b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\nhello host"


def sandbox_netns(record: dict[str, Any]) -> tuple[Path, str]:
    """The namespace path and host-side veth of a sandbox, from its agent record."""
    slot = str(record["driver_state"]["slot"]["id"])
    return Path(f"/run/netns/pdk-{slot}"), f"pdk{slot}"


@contextlib.contextmanager
def scratch_netns(prefix: str) -> Iterator[str]:
    """A network namespace of the test's own (``/run/netns/<name>``), deleted afterwards."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def made_in(netns_path: Path, make: Callable[[], T]) -> T:
    """``make()`` called by a short-lived thread inside the network namespace at ``netns_path``: what it
    opens there (a socket, a libnftables context's netlink socket) stays in that namespace, and acts on
    it from any thread afterwards."""
    return in_namespace(netns_path, CLONE_NEWNET, make, f"making {make!r} in {netns_path}")


def socket_in(netns_path: Path, family: int, kind: int, proto: int = 0) -> socket.socket:
    return made_in(netns_path, lambda: socket.socket(family, kind, proto))


def sysctl_in(netns: str, key: str, value: str) -> None:
    subprocess.run(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", f"{key}={value}"], check=True)


def mac_of(ifname: str, netns: str | None = None) -> str:
    argv = ["ip", *(["-n", netns] if netns else []), "-o", "link", "show", "dev", ifname]
    words = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.split()
    return words[words.index("link/ether") + 1]


def link_local_of(mac: str) -> str:
    """The EUI-64 fe80:: address the kernel gives an interface with this MAC when IPv6 is on."""
    octets = bytearray(int(part, 16) for part in mac.split(":"))
    octets[0] ^= 0x02
    eui = bytes(octets[:3]) + b"\xff\xfe" + bytes(octets[3:])
    return str(ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + eui))


def wait_for_link_local(netns: str, ifname: str, timeout_s: float = 10.0) -> str:
    """Waits until the interface's link-local address has passed duplicate address detection."""
    deadline = time.monotonic() + timeout_s
    out = ""
    while time.monotonic() < deadline:
        argv = ["ip", "-n", netns, "-6", "-o", "addr", "show", "dev", ifname, "scope", "link"]
        out = subprocess.run(argv, capture_output=True, text=True).stdout
        if "inet6 fe80" in out and "tentative" not in out:
            return out.split()[3].split("/")[0]
        time.sleep(0.1)
    raise AssertionError(f"no usable link-local address on {ifname} in {netns}: {out!r}")


@dataclass
class HostListener:
    """A TCP server in the host's namespace that records every connection it accepts."""

    family: int
    address: str
    port: int = 0
    accepted: list[str] = field(default_factory=list)
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None

    def start(self) -> HostListener:
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.family == socket.AF_INET6:  # only IPv6: an IPv4 connection must not count as one
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((self.address, 0))
        sock.listen(16)
        sock.settimeout(0.2)
        self.port = int(sock.getsockname()[1])
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while self._sock is not None:
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(str(peer[0]))
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                conn.recv(4096)
                conn.sendall(HELLO)

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)


@contextlib.contextmanager
def host_address_on_veth(address: str) -> Iterator[str]:
    """Gives the host ``address``/32 on one end of a veth pair kept in the host's namespace (the
    kernel here has no dummy links); both ends are removed afterwards. Names avoid ``pdk``, the
    prefix of sandbox veths."""
    tag = secrets.token_hex(3)
    near, far = f"pmd{tag}", f"pmp{tag}"
    subprocess.run(["ip", "link", "add", near, "type", "veth", "peer", "name", far], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", near], check=True)
        subprocess.run(["ip", "link", "set", near, "up"], check=True)
        subprocess.run(["ip", "link", "set", far, "up"], check=True)
        yield near
    finally:
        subprocess.run(["ip", "link", "delete", near], capture_output=True)


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_datagram(source: str, source_port: int, target: str, target_port: int, payload: bytes) -> bytes:
    """A whole IPv4 packet (header included), for a raw socket with IP_HDRINCL."""
    udp = struct.pack("!HHHH", source_port, target_port, 8 + len(payload), 0) + payload
    src, dst = socket.inet_aton(source), socket.inet_aton(target)
    pseudo = src + dst + struct.pack("!BBH", 0, socket.IPPROTO_UDP, len(udp))
    udp = udp[:6] + struct.pack("!H", _checksum(pseudo + udp) or 0xFFFF) + udp[8:]
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0x1234, 0, 64, socket.IPPROTO_UDP, 0, src, dst
    )
    header = header[:10] + struct.pack("!H", _checksum(header)) + header[12:]
    return header + udp
