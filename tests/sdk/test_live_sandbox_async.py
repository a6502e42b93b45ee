"""The SDK against the real platform: a control plane and a host agent as processes, runc sandboxes.

Written once, in ``test_live_sandbox_async.py`` for the async client; ``scripts/unasync.py``
generates ``test_live_sandbox.py``, the same tests through the sync client.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size: creates take ~0.1 s instead of a cold boot


async def test_a_sandbox_through_its_whole_life(live: LivePlatform, tmp_path: Path) -> None:
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        async with await client.sandboxes.create(
            SHAPE, disk_mib=DISK_MIB, name="sdk-life", envs={"MODE": "demo"}
        ) as sb:
            assert sb.info.status == "running" and sb.info.name == "sdk-life" and sb.info.ip
            assert (await client.sandboxes.get(sb.id)).info.envs == ["MODE"]

            # buffered exec: output, exit codes, env (declared keys only), stdin, a missing binary
            hello = await sb.run("sh", ["-c", 'echo "mode=$MODE"; echo oops >&2; exit 3'])
            assert (hello.stdout, hello.stderr, hello.exit_code, hello.ok) == (
                "mode=demo\n",
                "oops\n",
                3,
                False,
            )
            assert (await sb.run("sh", ["-c", "echo $MODE"], env={"MODE": "override"})).stdout == "override\n"
            assert (await sb.run("cat", stdin="from stdin")).stdout == "from stdin"
            with pytest.raises(paddock.CommandStartError):
                await sb.run("no-such-binary")
            with pytest.raises(paddock.ValidationError) as undeclared:
                await sb.run("true", env={"NEW": "x"})
            assert "env.NEW" in undeclared.value.fields

            # streamed exec: frames in order, the exit code last
            frames = [f async for f in sb.stream("sh", ["-c", "echo one; sleep 0.2; echo two >&2; exit 2"])]
            out = "".join(f.get("stdout", "") for f in frames)
            err = "".join(f.get("stderr", "") for f in frames)
            assert (out, err, frames[-1]) == ("one\n", "two\n", {"exit_code": 2})

            # files: 6 MiB streamed up from a local file and down into one, byte-exact
            payload = os.urandom(6 * 1024 * 1024 + 123)
            source = tmp_path / "up.bin"
            source.write_bytes(payload)
            assert await sb.files.upload(source, "/root/big.bin") == len(payload)
            sha = (await sb.run("sha256sum", ["/root/big.bin"])).stdout.split()[0]
            assert sha == hashlib.sha256(payload).hexdigest()
            assert await sb.files.download("/root/big.bin", tmp_path / "down.bin") == len(payload)
            assert (tmp_path / "down.bin").read_bytes() == payload
            assert await sb.files.write("/root/chunks.txt", iter([b"a" * 10, b"b" * 5])) == 15
            assert await sb.files.write("/root/fileobj.bin", io.BytesIO(b"\x00\xff" * 100)) == 200
            assert await sb.files.read("/root/fileobj.bin") == b"\x00\xff" * 100
            assert await sb.files.write("/root/text.txt", "héllo") == len("héllo".encode())
            with pytest.raises(paddock.NotFoundError):
                await sb.files.read("/root/absent")
            with pytest.raises(paddock.ValidationError) as relative:
                await sb.files.write("relative.txt", b"x")
            assert "path" in relative.value.fields

            # settings
            assert await sb.set_egress(["Example.COM", "10.0.0.0/8:443", "example.com"]) == [
                "example.com",
                "10.0.0.0/8:443",
            ]
            assert await sb.egress() == ["example.com", "10.0.0.0/8:443"]
            assert await sb.set_egress(["*"]) == [] and await sb.egress() == []
            bandwidth = await sb.bandwidth()
            assert bandwidth.quota_bytes == 5 * 1024**3 and not bandwidth.capped
            assert (await sb.recharge_bandwidth(1000)).quota_bytes == 5 * 1024**3 + 1000
            key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test"
            assert await sb.add_ssh_keys([key, key]) == 1
            assert (await sb.patch(auto_pause_after_seconds=600)).auto_pause_after_seconds == 600
            assert (await sb.patch(disable_auto_pause=True)).auto_pause_after_seconds is None
            assert await sb.resize(3072) == 3072
            assert (await client.sandboxes.by_ip(sb.info.ip)).id == sb.id

            # pause / resume keep the disk; commands are refused while paused
            assert (await sb.pause()).status == "paused"
            with pytest.raises(paddock.ConflictError) as paused:
                await sb.run("true")
            assert paused.value.code == "INVALID_STATE"
            assert (await sb.resume()).status == "running"
            assert await sb.files.read("/root/chunks.txt") == b"a" * 10 + b"b" * 5

            # fork: the child runs with the parent's files and env, and is its own sandbox
            async with await sb.fork() as child:
                assert child.info.status == "running" and child.info.forked_from == sb.id
                assert await child.files.read("/root/fileobj.bin") == b"\x00\xff" * 100
                await child.files.write("/root/only-in-child", b"c")
                assert (await child.run("printenv", ["MODE"])).stdout == "demo\n"
            with pytest.raises(paddock.NotFoundError):
                await sb.files.read("/root/only-in-child")
            assert (await client.sandboxes.get(child.id)).info.status in ("destroying", "destroyed")

        # the context manager destroyed it; the row stays readable, operations are refused
        assert await sb.destroy(wait=True) == "destroyed"
        assert (await client.sandboxes.get(sb.id)).info.status == "destroyed"
        with pytest.raises(paddock.ConflictError) as gone:
            await sb.run("true")
        assert gone.value.status == 409 and gone.value.code == "INVALID_STATE" and gone.value.request_id


async def test_errors_are_typed_against_the_real_service(live: LivePlatform) -> None:
    async with paddock.AsyncClient(live.url, "pdk_not_a_key") as anonymous:
        with pytest.raises(paddock.AuthenticationError):
            await anonymous.whoami()
    owner, stranger = live.api_key(), live.api_key()
    async with (
        paddock.AsyncClient(live.url, owner) as client,
        paddock.AsyncClient(live.url, stranger) as other,
    ):
        with pytest.raises(paddock.NotFoundError) as unknown:
            await client.sandboxes.get("sb-01jzzzzzzzzzzzzzzzzzzzzzzz")
        assert unknown.value.code == "NOT_FOUND" and unknown.value.message == "sandbox not found"
        with pytest.raises(paddock.ValidationError) as bad_shape:
            await client.sandboxes.create("s-64vcpu-1tb")
        assert "shape" in bad_shape.value.fields
        async with await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb:
            with pytest.raises(paddock.NotFoundError):  # someone else's sandbox does not exist for you
                await other.sandboxes.get(sb.id)
            with pytest.raises(paddock.NotFoundError):
                await (await other.sandboxes.get(sb.id)).destroy()
            with pytest.raises(paddock.NotFoundError):  # nor does its address
                await other.sandboxes.by_ip(sb.info.ip)
            with pytest.raises(paddock.ConflictError):
                await sb.resume()  # only a paused sandbox resumes
            with pytest.raises(paddock.ValidationError):
                await sb.resize(1024)  # must grow
        no_retry = paddock.RetryPolicy(max_retries=0)
        async with paddock.AsyncClient("http://127.0.0.1:9", owner, retry=no_retry) as nowhere:
            with pytest.raises(paddock.TransportError):
                await nowhere.whoami()
        # a failing block still destroys its sandbox, and the block's own error is what propagates
        with pytest.raises(ZeroDivisionError):
            async with await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as doomed:
                1 / 0  # noqa: B018
        assert (await client.sandboxes.get(doomed.id)).info.status in ("destroying", "destroyed")


async def test_pagination_follows_total(live: LivePlatform) -> None:
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        made = [await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) for _ in range(3)]
        try:
            one_by_one = [item["id"] async for item in client.paginate("v1/sandboxes", page_size=1)]
            assert one_by_one == [sb.id for sb in made]
            assert [s.id for s in await client.sandboxes.list(status="running")] == one_by_one
            assert [s["id"] async for s in client.paginate("v1/shapes", page_size=4)][:2] == [
                "s-0.25vcpu-512mb",
                "s-0.5vcpu-1gb",
            ]
            assert len(await client.shapes()) == 11
        finally:
            for sb in made:
                await sb.destroy()


async def test_streams_and_moves_files_then_forks_a_paused_sandbox(
    live: LivePlatform, tmp_path: Path
) -> None:
    payload = os.urandom(3 * 1024 * 1024)
    (tmp_path / "a.bin").write_bytes(payload)
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        async with await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb:
            frames = [f async for f in sb.stream("sh", ["-c", "echo hi; exit 4"])]
            assert frames[-1] == {"exit_code": 4} and {"stdout": "hi\n"} in frames
            assert await sb.files.upload(tmp_path / "a.bin", "/tmp/a.bin") == len(payload)
            assert await sb.files.download("/tmp/a.bin", tmp_path / "b.bin") == len(payload)
            assert (tmp_path / "b.bin").read_bytes() == payload

            async def chunks() -> AsyncIterator[bytes]:
                yield b"x" * 7
                yield b"y" * 3

            assert await sb.files.write("/tmp/c", chunks()) == 10
            assert await sb.files.read("/tmp/c") == b"x" * 7 + b"y" * 3
            assert (await sb.pause()).status == "paused"
            child = await sb.fork()
            assert child.info.status == "running" and child.info.forked_from == sb.id
            assert (await child.run("cat", ["/tmp/c"])).stdout == "x" * 7 + "y" * 3
            assert await child.destroy(wait=True) == "destroyed"
        assert (await client.sandboxes.get(sb.id)).info.status == "destroyed"


async def test_create_destroys_a_sandbox_that_never_reaches_running() -> None:
    """Unit seam: a POST that answers ``creating`` and a boot that then fails leaves nothing behind."""
    calls: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        sandbox = {"id": "sb-x", "status": "creating"}
        if request.method == "GET":
            sandbox["status"] = "failed"
        if request.method == "DELETE":
            return httpx.Response(
                200, json={"status": "success", "data": {"id": "sb-x", "status": "destroyed"}}
            )
        return httpx.Response(200, json={"status": "success", "data": sandbox})

    async with paddock.AsyncClient("http://test", "k", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(paddock.SandboxStateError) as failed:
            await client.sandboxes.create(SHAPE)
        assert failed.value.status == "failed" and isinstance(failed.value, RuntimeError)
    assert calls == [
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/sb-x"),
        ("DELETE", "/v1/sandboxes/sb-x"),
    ]


async def test_a_snapshot_boots_new_sandboxes_and_outlives_its_source(live: LivePlatform) -> None:
    async with paddock.AsyncClient(live.url, live.api_key()) as client:
        source = await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB)
        async with source:
            await source.run("sh", ["-c", "echo kept > /root/kept.txt"])
            named = await source.snapshot(name="sdk-snap")
            plain = await client.snapshots.create(source.id)
        assert named.status == "ready" and named.name == "sdk-snap" and named.source_sandbox_id == source.id
        assert plain.name is None and plain.id != named.id
        try:
            assert {s.id for s in await client.snapshots.list()} == {named.id, plain.id}
            assert (await client.snapshots.get("sdk-snap")).id == named.id
            async with await client.sandboxes.create(SHAPE, rootfs="sdk-snap") as copy:
                assert (await copy.run("cat", ["/root/kept.txt"])).stdout == "kept\n"
            await client.snapshots.delete(plain.id)
            with pytest.raises(paddock.NotFoundError):
                await client.snapshots.get(plain.id)
        finally:
            await client.snapshots.delete(named.id)
        assert await client.snapshots.list() == []
