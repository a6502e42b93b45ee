"""Files beyond one file's bytes, through the SDK against the real platform (control plane and host
agent processes, runc sandboxes): list, stat, exists, remove, make_dir, rename, many files in one call,
a directory up and down as a tar stream, and a watch that sees a file created after it started.

Written once for the async client; ``scripts/unasync.py`` generates ``test_live_files.py``, the same
tests through the sync client.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx
import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

SHAPE = "s-1vcpu-256mb"
DISK_MIB = 2048  # the warm pool's size


async def test_listing_stat_make_rename_remove_and_many_files(live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        # many files in one request, parents made, bytes and text
        assert (
            await sb.files.write_files({"/root/proj/a.txt": "héllo", "/root/proj/sub/b.bin": b"\x00\xff"})
            == 2
        )
        assert await sb.files.read("/root/proj/a.txt") == "héllo".encode()
        assert await sb.files.read("/root/proj/sub/b.bin") == b"\x00\xff"

        top = {e.name: e for e in await sb.files.list("/root/proj")}
        assert set(top) == {"a.txt", "sub"}
        assert (top["a.txt"].type, top["a.txt"].size, top["a.txt"].path) == (
            "file",
            6,
            "/root/proj/a.txt",
        )
        assert top["sub"].type == "dir"
        deep = {e.path for e in await sb.files.list("/root/proj", depth=2)}
        assert deep == {"/root/proj/a.txt", "/root/proj/sub", "/root/proj/sub/b.bin"}

        entry = await sb.files.stat("/root/proj/sub/b.bin")
        assert (entry.type, entry.size, entry.permissions) == ("file", 2, "-rw-r--r--")
        await sb.run("ln", ["-s", "/etc/hostname", "/root/proj/link"])
        link = await sb.files.stat("/root/proj/link")
        assert (link.type, link.symlink_target) == ("symlink", "/etc/hostname")
        assert await sb.files.exists("/root/proj/a.txt")
        assert not await sb.files.exists("/root/proj/absent")
        with pytest.raises(paddock.NotFoundError):
            await sb.files.stat("/root/proj/absent")
        with pytest.raises(paddock.ValidationError) as not_dir:
            await sb.files.list("/root/proj/a.txt")
        assert "path" in not_dir.value.fields

        assert await sb.files.make_dir("/root/proj/new/deep") is True
        assert await sb.files.make_dir("/root/proj/new/deep") is False  # already there
        moved = await sb.files.rename("/root/proj/a.txt", "/root/proj/new/deep/a2.txt")
        assert (moved.path, moved.size) == ("/root/proj/new/deep/a2.txt", 6)
        assert not await sb.files.exists("/root/proj/a.txt")

        await sb.files.remove("/root/proj/sub")  # a whole directory
        assert not await sb.files.exists("/root/proj/sub")
        with pytest.raises(paddock.NotFoundError):
            await sb.files.remove("/root/proj/sub")

        # a path full of shell syntax is a name, never a command
        odd = "/root/proj/$(touch /root/pwned); x"
        assert await sb.files.write_files({odd: "odd"}) == 1
        assert await sb.files.exists(odd)
        await sb.files.remove(odd)
        assert not await sb.files.exists("/root/pwned")


async def test_a_listing_names_owners_from_the_sandboxs_own_accounts(live: LivePlatform) -> None:
    """Owners and groups are named as ``find`` names them in the sandbox: a user the tenant added, the
    first of two lines with one id, a number for an id no line names; a NUL the tenant wrote into
    ``/etc/passwd`` leaves every entry whole."""
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        made = await sb.run_shell(
            "printf 'agent:x:4242:4242::/:/bin/sh\\nshadow:x:4242:4242::/:/bin/sh\\n' >> /etc/passwd"
            " && printf 'team:x:4242:\\n' >> /etc/group"
            " && mkdir -p /root/own/sub && echo a > /root/own/a && echo bb > /root/own/sub/b"
            " && touch /root/own/c && chown 4242:4242 /root/own/a && chown 4244:4343 /root/own/sub/b"
            " && chown nobody:nogroup /root/own/c"
        )
        assert made.exit_code == 0, made.stderr
        found = await sb.run("find", ["/root/own", "-mindepth", "1", "-printf", "%p %u %g %s\\n"])
        expected = {
            path: (u, g, int(s)) for path, u, g, s in (line.split() for line in found.stdout.splitlines())
        }
        assert expected["/root/own/a"] == ("agent", "team", 2)
        assert expected["/root/own/sub/b"] == ("4244", "4343", 3)
        listed = await sb.files.list("/root/own", depth=2)
        assert {e.path: (e.owner, e.group, e.size) for e in listed} == expected

        garbled = await sb.run_shell("printf 'x\\000y:x:9:9::/:/bin/sh\\n' >> /etc/passwd")
        assert garbled.exit_code == 0, garbled.stderr
        again = await sb.files.list("/root/own", depth=2)
        assert {e.path: (e.owner, e.group, e.size) for e in again} == expected

        # A FIFO in a table's place would block a read of it: that table is left out, its ids numbers.
        fifo = await sb.run_shell("mv /etc/group /etc/group.kept && mkfifo /etc/group")
        assert fifo.exit_code == 0, fifo.stderr
        unnamed = {e.path: (e.owner, e.group) for e in await sb.files.list("/root/own", depth=2)}
        assert unnamed["/root/own/a"] == ("agent", "4242")
        assert unnamed["/root/own/c"] == ("nobody", "65534")


async def test_a_directory_up_and_down_as_one_tar(live: LivePlatform, tmp_path: Path) -> None:
    local = tmp_path / "src"
    (local / "nested" / "deeper").mkdir(parents=True)
    blob = os.urandom(3 * 1024 * 1024 + 7)
    (local / "blob.bin").write_bytes(blob)
    (local / "nested" / "deeper" / "note.txt").write_text("deep\n")
    (local / "empty").mkdir()
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        assert await sb.files.upload_dir(local, "/root/app") > len(blob)
        sums = (
            await sb.run("sh", ["-c", "cd /root/app && sha256sum blob.bin nested/deeper/note.txt"])
        ).stdout
        assert hashlib.sha256(blob).hexdigest() in sums
        assert hashlib.sha256(b"deep\n").hexdigest() in sums
        assert (await sb.files.stat("/root/app/empty")).type == "dir"
        assert not await sb.files.exists("/tmp/.paddock-tar")  # scratch removed
        assert (await sb.run("sh", ["-c", "ls -A /tmp | grep -c paddock-tar || true"])).stdout == "0\n"

        await sb.run("sh", ["-c", "echo made-inside > /root/app/nested/inside.txt"])
        back = tmp_path / "back"
        assert await sb.files.download_dir("/root/app", back) > len(blob)
        assert (back / "blob.bin").read_bytes() == blob
        assert (back / "nested" / "deeper" / "note.txt").read_text() == "deep\n"
        assert (back / "nested" / "inside.txt").read_text() == "made-inside\n"
        assert (back / "empty").is_dir()
        assert (await sb.run("sh", ["-c", "ls -A /tmp | grep -c paddock-tar || true"])).stdout == "0\n"
        with pytest.raises(paddock.NotFoundError):
            await sb.files.download_dir("/root/absent", tmp_path / "none")


async def test_a_watch_sees_what_changes_after_it_started(live: LivePlatform) -> None:
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        await sb.files.write_files({"/root/w/before.txt": "old"})
        events = await sb.files.watch("/root/w")
        try:
            await sb.files.write("/root/w/new.txt", "x")
            seen = []
            async for event in events:
                seen.append(event)
                if event.event == "create":
                    break
            assert paddock.FileEvent("create", "/root/w/new.txt", "file") in seen
            assert all(e.path != "/root/w/before.txt" for e in seen)  # what was there is no event

            await sb.files.remove("/root/w/before.txt")
            async for event in events:
                if event.event == "delete":
                    break
            assert event == paddock.FileEvent("delete", "/root/w/before.txt", "file")
        finally:
            await events.aclose()
        with pytest.raises(paddock.NotFoundError):
            await sb.files.watch("/root/absent")


async def test_signed_links_read_and_write_one_file_without_a_key(live: LivePlatform) -> None:
    """``files.download_url``/``upload_url``: a plain GET or PUT with no key reads or writes that one
    path of that one sandbox until the link expires; another path, another operation or a late use is
    401; the trail files the use under ``signed_url``."""
    async with (
        paddock.AsyncClient(live.url, live.api_key()) as client,
        await client.sandboxes.create(SHAPE, disk_mib=DISK_MIB) as sb,
    ):
        await sb.files.write("/root/shared.txt", "for anyone with the link")
        read = await sb.files.download_url("/root/shared.txt", expires_in_s=60)
        write = await sb.files.upload_url("/root/dropped.txt")
        short = await sb.files.download_url("/root/shared.txt", expires_in_s=1)
        async with httpx.AsyncClient(timeout=30) as anyone:  # no key at all
            got = await anyone.get(read)
            assert (got.status_code, got.content) == (200, b"for anyone with the link")
            put = await anyone.put(write, content=b"sent without a key")
            assert put.status_code == 200, put.text
            assert await sb.files.read("/root/dropped.txt") == b"sent without a key"
            refused = {
                "another path": await anyone.get(read.replace("shared.txt", "dropped.txt")),
                "a write through a read link": await anyone.put(read, content=b"overwritten"),
                "a read through a write link": await anyone.get(write),
                "a later expiry": await anyone.get(read.replace("expires=", "expires=9")),
            }
            assert {what: r.status_code for what, r in refused.items()} == dict.fromkeys(refused, 401)
            assert await sb.files.read("/root/shared.txt") == b"for anyone with the link"
            await paddock._blocking.asleep(2.1)
            late = await anyone.get(short)
            assert late.status_code == 401 and "expired" in late.text, late.text
        with pytest.raises(paddock.ValidationError) as bad:
            await sb.files.download_url("root/relative.txt")
        assert "path" in bad.value.fields
        with pytest.raises(paddock.ValidationError) as bad:
            await sb.files.download_url("/root/shared.txt", expires_in_s=8 * 86400)
        assert "expires_in_s" in bad.value.fields
        used = {(e.detail["direction"], e.actor) async for e in sb.audit(kinds=["file"])}
        assert {("read", "signed_url"), ("write", "signed_url")} <= used, used
