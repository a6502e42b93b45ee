"""S3 disk probes (issue #29): what a tenant writes in a disk's settings steers s3fs, which runs as root.
Each probe aims at something of the host's that the probe owns, a TCP listener on 127.0.0.1 and a
directory, and proves that nothing reaches them; and at the sandbox's own /proc, which a disk must not
cover. The bodies go to the host agent as raw JSON, past the control plane's checks (which answer 400
for them: tests/disks/test_disks_api.py) and past the client's model, as a caller that skipped them
would send them: the agent must refuse them itself.

Real sandboxes under the default runtime, real s3fs, a real S3 server (moto, in a network namespace
the test makes, reached by sandboxes as the internet is).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from paddock_hostagent.client import HostAgentClient
from tests.disks.s3server import S3Server
from tests.hostagent.conftest import (
    TOKEN,
    AgentProcess,
    Sandboxes,
    agent,
    debian_image,
    guest_binary_dir,
    host,
    pytest_collection_modifyitems,
    sandboxes,
    sh,
)

__all__ = ["agent", "debian_image", "guest_binary_dir", "host", "pytest_collection_modifyitems", "sandboxes"]

pytestmark = [pytest.mark.root, pytest.mark.slow]


class Listener:
    """A TCP listener on the host's 127.0.0.1 that counts who connects (and closes at once)."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> Listener:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self._server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    probe = await Listener().start()
    try:
        yield probe
    finally:
        await probe.stop()


def mount_json(server: S3Server, bucket: str, mount_path: str, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "disk_id": "disk_" + secrets.token_hex(6),
        "mount_path": mount_path,
        "bucket": bucket,
        "endpoint": server.endpoint,
        "region": "us-east-1",
        "use_path_style": True,
        "access_key": server.access_key,
        "secret_key": server.secret_key,
    }
    body.update(overrides)
    return body


async def raw_attach(agent: AgentProcess, sandbox_id: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=agent.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=90
    ) as http:
        return await http.post(f"/internal/v1/sandboxes/{sandbox_id}/disks", json=body)


async def use_if_mounted(host: HostAgentClient, sandbox_id: str, answer: httpx.Response, path: str) -> None:
    """What a tenant does with a disk it got mounted (today's code mounts these): read, write."""
    if answer.status_code == 200 and answer.json().get("status") == "mounted":
        await sh(host, sandbox_id, f"cat {path}/object.txt; echo new > {path}/new.txt; sync")


async def test_a_comma_in_the_endpoint_reaches_neither_the_hosts_loopback_nor_a_host_directory(
    agent: AgentProcess,
    host: HostAgentClient,
    sandboxes: Sandboxes,
    s3: S3Server,
    listener: Listener,
    tmp_path: Path,
) -> None:
    cache = tmp_path / "host-dir"
    cache.mkdir()
    bucket = s3.bucket("probe-" + secrets.token_hex(4))
    s3.s3().put_object(Bucket=bucket, Key="object.txt", Body=b"the tenant's object")
    sandbox = await sandboxes.create()
    probes = {
        "/mnt/url": f"{s3.endpoint}/,url=http://127.0.0.1:{listener.port}",  # a second url: the host's
        "/mnt/cache": f"{s3.endpoint},use_cache={cache}",  # root s3fs caching objects in a host dir
        "/mnt/both": f"{s3.endpoint}/x,use_cache={cache},url=http://127.0.0.1:{listener.port}",
    }
    answers = {}
    for path, endpoint in probes.items():
        answers[path] = await raw_attach(
            agent, sandbox["id"], mount_json(s3, bucket, path, endpoint=endpoint)
        )
        await use_if_mounted(host, sandbox["id"], answers[path], path)
    await asyncio.sleep(1.0)
    assert listener.connections == 0, "s3fs connected to the host's loopback"
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) == [], "s3fs wrote into a host dir"
    for path, answer in answers.items():
        assert 400 <= answer.status_code < 500, (path, answer.status_code, answer.text)
        assert "endpoint" in answer.text, (path, answer.text)
    assert (await host.get_sandbox(sandbox["id"])).disks == []


async def test_the_hosts_loopback_as_the_endpoint_is_the_sandboxs_own(
    agent: AgentProcess, sandboxes: Sandboxes, s3: S3Server, listener: Listener
) -> None:
    """A well-formed endpoint at 127.0.0.1 (allowed private endpoints, or a name that resolves there
    by the time s3fs looks it up): s3fs connects from the sandbox's network namespace, where that
    is the sandbox's loopback, and the mount fails; the host's listener sees nothing."""
    bucket = s3.bucket("loop-" + secrets.token_hex(4))
    sandbox = await sandboxes.create()
    for endpoint in (f"http://127.0.0.1:{listener.port}", f"http://localhost:{listener.port}"):
        answer = await raw_attach(
            agent, sandbox["id"], mount_json(s3, bucket, "/mnt/loop", endpoint=endpoint)
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "error", answer.json()
    await asyncio.sleep(0.5)
    assert listener.connections == 0, "s3fs connected to the host's loopback"


async def test_a_disk_cannot_cover_the_sandboxs_proc_directly_or_through_a_link(
    agent: AgentProcess, host: HostAgentClient, sandboxes: Sandboxes, s3: S3Server
) -> None:
    bucket = s3.bucket("proc-" + secrets.token_hex(4))
    sandbox = await sandboxes.create()
    direct = await raw_attach(agent, sandbox["id"], mount_json(s3, bucket, "/proc"))
    if direct.status_code == 200:  # today's code mounted it: the tenant detaches it again
        await host.detach_disk(sandbox["id"], "/proc")
    linked = await sh(host, sandbox["id"], "mkdir -p /mnt && ln -sfn /proc /mnt/link && echo ok")
    assert linked["stdout"] == "ok\n", linked
    through_link = await raw_attach(agent, sandbox["id"], mount_json(s3, bucket, "/mnt/link"))
    seen = await sh(
        host, sandbox["id"], "head -c 4 /proc/self/status; echo; grep -c fuse /proc/self/mountinfo || true"
    )
    assert seen["stdout"].split() == ["Name", "0"], seen  # the sandbox's procfs, and no disk over it
    assert 400 <= direct.status_code < 500 and "mount_path" in direct.text, direct.text
    assert through_link.status_code == 200, through_link.text
    view = through_link.json()
    assert view["status"] == "error" and "symbolic link" in (view["error"] or ""), view
    assert (await host.get_sandbox(sandbox["id"])).disks == []
