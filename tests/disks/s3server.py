"""A real S3-protocol server for the disk tests: moto's server (PyPI ``moto[server]``) on 127.0.0.1.

``S3Server.start(auth=True)`` turns on moto's IAM signature checks (after the three unauthenticated
calls that create a user, its policy and its key), so a wrong key is refused as by AWS. s3fs 1.90's
signed ListObjects is refused by that check even with the right key, so data tests use a server
without checks (any key is accepted there) and only the wrong-credentials tests use the checking one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx

MOTO_SERVER = str(Path(sys.executable).with_name("moto_server"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]
    access_key: str = "AKIATESTDISKS0000001"
    secret_key: str = "test-secret-key-for-paddock-disks-0001"
    buckets: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, *, auth: bool = False) -> S3Server:
        port = _free_port()
        env = dict(os.environ)
        env.pop("AWS_CA_BUNDLE", None)
        if auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
        process = subprocess.Popen(
            [MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        server = cls(endpoint=f"http://127.0.0.1:{port}", process=process)
        deadline = time.monotonic() + 30
        while True:  # ends: the server answers, or the assertion below
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(server.endpoint + "/moto-api/", timeout=1)
                break
            assert process.poll() is None and time.monotonic() < deadline, "moto_server did not start"
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
