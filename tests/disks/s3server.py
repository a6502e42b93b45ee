"""A real S3-protocol server for the disk tests: moto's server (PyPI ``moto[server]``) in a network
namespace the test makes.

s3fs runs in the sandbox's network namespace (``drivers/storage/s3mounts.py``), so the host's loopback is out
of its reach: the server listens where a sandbox reaches it, as it reaches the internet (routed and
NATed by the host agent). By default each server has a namespace of its own (``pdks3-<tag>``, joined to
the host by a veth on a free /24 of 198.18.0.0/15, the benchmarking range); ``start(internet=…)`` runs
it inside a fake internet (``tests/network/internet.py``) at ``api.example.test``, whose DNS the test's
agent resolves through. The tests on the host reach it over the veth.

``S3Server.start(auth=True)`` turns on moto's IAM signature checks (after the three unauthenticated
calls that create a user, its policy and its key), so a wrong key is refused as by AWS. s3fs 1.90's
signed ListObjects is refused by that check even with the right key, so data tests use a server
without checks (any key is accepted there) and only the wrong-credentials tests use the checking one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx

from tests.network.internet import FakeInternet

MOTO_SERVER = str(Path(sys.executable).with_name("moto_server"))


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]
    access_key: str = "AKIATESTDISKS0000001"
    secret_key: str = "test-secret-key-for-paddock-disks-0001"
    buckets: list[str] = field(default_factory=list)
    #: The namespace this server made (None: it runs in someone else's, a fake internet's).
    netns: str | None = None
    host_if: str | None = None
    #: The endpoint by DNS name (``http://api.example.test:<port>``) when inside a fake internet.
    named_endpoint: str | None = None

    @classmethod
    def start(cls, *, auth: bool = False, internet: FakeInternet | None = None) -> S3Server:
        env = dict(os.environ)
        env.pop("AWS_CA_BUNDLE", None)
        if auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
        port = random.randrange(20000, 60000)
        netns: str | None = None
        host_if: str | None = None
        named: str | None = None
        if internet is not None:
            namespace, address = internet.netns, internet.address("api.example.test")
            named = f"http://api.example.test:{port}"
            env["MOTO_S3_CUSTOM_ENDPOINTS"] = named  # else moto reads "api" as a virtual-hosted bucket
        else:
            netns, host_if, address = _namespace()
            namespace = netns
        try:
            process = subprocess.Popen(
                # nsenter, not ``ip netns exec``: no copy of every host mount held while it runs (qemu.py).
                [
                    "nsenter",
                    f"--net=/run/netns/{namespace}",
                    "--",
                    MOTO_SERVER,
                    "-H",
                    address,
                    "-p",
                    str(port),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            _remove_namespace(netns, host_if)
            raise
        server = cls(
            endpoint=f"http://{address}:{port}",
            process=process,
            netns=netns,
            host_if=host_if,
            named_endpoint=named,
        )
        deadline = time.monotonic() + 30
        while True:  # ends: the server answers, or the assertion below
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(server.endpoint + "/moto-api/", timeout=1)
                break
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise AssertionError("moto_server did not start")
            time.sleep(0.1)
        if auth:
            iam = boto3.client(
                "iam",
                endpoint_url=server.endpoint,
                region_name="us-east-1",
                aws_access_key_id="bootstrap",
                aws_secret_access_key="bootstrap",
            )
            iam.create_user(UserName="paddock")
            policy = {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
            }
            iam.put_user_policy(UserName="paddock", PolicyName="all", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName="paddock")["AccessKey"]
            server.access_key, server.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        return server

    def s3(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def bucket(self, name: str) -> str:
        self.s3().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)
        _remove_namespace(self.netns, self.host_if)


def _namespace() -> tuple[str, str, str]:
    """A namespace ``pdks3-<tag>`` joined to the host by a veth: (its name, the host's link, the
    address inside)."""
    tag = secrets.token_hex(3)
    netns, host_if = f"pdks3-{tag}", f"ps3{tag}"
    subnet = FakeInternet._free_subnet()
    gateway, inside = subnet.network_address + 1, subnet.network_address + 2
    ns = ["ip", "-n", netns]
    try:
        for argv in (
            ["ip", "netns", "add", netns],
            ["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns],
            ["ip", "addr", "add", f"{gateway}/24", "dev", host_if],
            ["ip", "link", "set", host_if, "up"],
            [*ns, "link", "set", "lo", "up"],
            [*ns, "addr", "add", f"{inside}/24", "dev", "eth0"],
            [*ns, "link", "set", "eth0", "up"],
            [*ns, "route", "add", "default", "via", str(gateway)],
        ):
            subprocess.run(argv, check=True, capture_output=True)
    except BaseException:
        _remove_namespace(netns, host_if)
        raise
    return netns, host_if, str(inside)


def _remove_namespace(netns: str | None, host_if: str | None) -> None:
    if netns is not None:
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
    if host_if is not None:
        subprocess.run(["ip", "link", "delete", host_if], capture_output=True)
