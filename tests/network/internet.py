"""A fake "internet" in a network namespace the test creates: no packet ever leaves this machine.

    host                                   netns pdkinet-<tag>
    pin<tag>  198.18.N.1/24  <--veth-->    eth0  198.18.N.2/24 + one /32 per server address
                                                 servers (one process, ``python -m tests.network.internet``):
                                                 HTTP on :80 and :8080 of every address (body "<label>:<port>"),
                                                 a byte sink on sink:9000, a 2 MB source on sink:9001,
                                                 DNS on dns:53, stats on dns:9999

N is a random free /24 of 198.18.0.0/15 (the benchmarking range, never routed on the real internet),
so several test runs can each have their own. Sandboxes reach it through the host agent's routing and
NAT exactly as they would reach the real internet; the agent resolves through ``dns_upstream``.

    with FakeInternet() as internet:
        internet.address("api.example.test")     # "198.18.N.10"
        internet.dns_upstream                    # "198.18.N.53" for PADDOCK_HOST_DNS_UPSTREAM
        internet.sink_bytes()                    # bytes the sink has received so far
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import random
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from tests.sweep import FAKE_INTERNET_PREFIX, held_file

#: Test names and the last octet of their address; ``raw-*`` entries have no DNS name.
HOSTS: dict[str, int] = {
    "api.example.test": 10,
    "other.example.test": 11,
    "example.test": 12,
    "sub.foo.test": 13,
    "foo.test": 14,
    "deep.sub.foo.test": 15,
    "sink.example.test": 30,
    "raw-a": 20,
    "raw-b": 21,
    "raw-c": 50,
    "cidr-in-1": 33,
    "cidr-in-2": 34,
    "dns": 53,
}
#: Where every fake internet's /24 comes from: the benchmarking range, never routed on the real internet.
RANGE = ipaddress.IPv4Network("198.18.0.0/15")
HTTP_PORTS = (80, 8080)
SINK_PORT = 9000
SOURCE_PORT = 9001  # on the sink's address: sends SOURCE_BYTES to whoever connects, then closes
SOURCE_BYTES = 2_000_000
STATS_PORT = 9999
DNS_TTL_S = 60


def _taken_prefixes() -> set[str]:
    out = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("198.1")}


class FakeInternet:
    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.netns = f"{FAKE_INTERNET_PREFIX}{tag}"
        self.host_if = f"pin{tag}"
        self.subnet = self._free_subnet()
        base = self.subnet.network_address
        self.gateway = str(base + 1)
        self.addresses = {name: str(base + octet) for name, octet in HOSTS.items()}
        self.cidr = str(ipaddress.IPv4Network(f"{base + 32}/28"))  # holds cidr-in-*, not raw-*
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(f"/tmp/{self.netns}.log")
        self._owned: IO[str] | None = None

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        taken = _taken_prefixes()
        for _ in range(100):
            candidate = ipaddress.IPv4Network(
                f"198.{random.choice((18, 19))}.{random.randrange(1, 255)}.0/24"
            )
            assert candidate.subnet_of(RANGE)
            if str(candidate) not in taken:
                return candidate
        raise RuntimeError(f"no free /24 left in {RANGE}")

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> FakeInternet:
        prefix = self.subnet.prefixlen
        inside = self.addresses.values()
        ns = ["ip", "-n", self.netns]
        commands = [
            ["ip", "netns", "add", self.netns],
            ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", self.netns],
            ["ip", "addr", "add", f"{self.gateway}/{prefix}", "dev", self.host_if],
            ["ip", "link", "set", self.host_if, "up"],
            [*ns, "link", "set", "lo", "up"],
            [*ns, "addr", "add", f"{self.subnet.network_address + 2}/{prefix}", "dev", "eth0"],
            *[[*ns, "addr", "add", f"{address}/32", "dev", "eth0"] for address in inside],
            [*ns, "link", "set", "eth0", "up"],
            [*ns, "route", "add", "default", "via", self.gateway],
        ]
        # The log first, locked for as long as this process owns the namespace: a run killed before
        # stop() leaves it free, and the next session's sweep then takes the namespace down.
        self._owned = held_file(self.log_path, "")
        try:
            for argv in commands:
                subprocess.run(argv, check=True, capture_output=True)
            config = {
                "http": [
                    [address, port, name] for name, address in self.addresses.items() for port in HTTP_PORTS
                ],
                "sink": [self.addresses["sink.example.test"], SINK_PORT],
                "source": [self.addresses["sink.example.test"], SOURCE_PORT],
                "stats": [self.addresses["dns"], STATS_PORT],
                "dns": [self.addresses["dns"], 53],
                "records": {name: address for name, address in self.addresses.items() if "." in name},
            }
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    # nsenter, not ``ip netns exec``: no mount namespace of its own, whose copy of every
                    # host mount would keep other tests' disks mounted while it runs (qemu.py).
                    [
                        "nsenter",
                        f"--net=/run/netns/{self.netns}",
                        "--",
                        sys.executable,
                        "-m",
                        "tests.network.internet",
                    ],
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=log,
                    env=env,
                )
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(config).encode())
            self.process.stdin.close()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"fake internet exited: {self.log_path.read_text(errors='replace')}")
            with contextlib.suppress(httpx.HTTPError):
                self.sink_bytes()
                return
            time.sleep(0.05)
        raise RuntimeError("fake internet did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "delete", self.host_if], capture_output=True)
        self.log_path.unlink(missing_ok=True)
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> FakeInternet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what tests ask -------------------------------------------------------------------------

    def address(self, name: str) -> str:
        return self.addresses[name]

    @property
    def dns_upstream(self) -> str:
        return self.addresses["dns"]

    def sink_bytes(self) -> int:
        """Payload bytes the sink has received over all connections so far."""
        url = f"http://{self.addresses['dns']}:{STATS_PORT}/"
        return int(httpx.get(url, timeout=2).json()["sink_bytes"])


# -- the servers, run inside the namespace -------------------------------------------------------


async def _serve(config: dict[str, Any]) -> None:
    from dnslib import QTYPE, RCODE, RR, A, DNSRecord

    sink_total = 0

    def http_handler(label: str, port: int) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            body = f"{label}:{port}".encode()
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()

        return handle

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sink_total
        with contextlib.suppress(Exception):
            while chunk := await reader.read(65536):
                sink_total += len(chunk)
        writer.close()

    async def source(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            for _ in range(SOURCE_BYTES // 100_000):
                writer.write(b"x" * 100_000)
                await writer.drain()
        writer.close()

    async def stats(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        body = json.dumps({"sink_bytes": sink_total}).encode()
        head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        writer.write(head + body)
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()

    records: dict[str, str] = config["records"]

    class Dns(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            query = DNSRecord.parse(data)
            reply = query.reply()
            name = str(query.q.qname).rstrip(".").lower()
            if name not in records:
                reply.header.rcode = RCODE.NXDOMAIN
            elif query.q.qtype == QTYPE.A:
                reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A(records[name]), ttl=DNS_TTL_S))
            self.transport.sendto(reply.pack(), addr)

    servers = []
    for address, port, label in config["http"]:
        servers.append(await asyncio.start_server(http_handler(label, port), address, port))
    servers.append(await asyncio.start_server(sink, *config["sink"]))
    servers.append(await asyncio.start_server(source, *config["source"]))
    servers.append(await asyncio.start_server(stats, *config["stats"]))
    loop = asyncio.get_running_loop()
    await loop.create_datagram_endpoint(Dns, local_addr=tuple(config["dns"]))
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve(json.loads(sys.stdin.read())))
