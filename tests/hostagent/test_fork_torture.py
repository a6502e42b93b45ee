"""A fork boots only a clean copy of its source's disk, whatever the source went through before.

The torture runs random sequences of what a client does to a real sandbox that touches its disk (file
writes across many directories, uploads, large files, deletes, resizes, pause and resume, forks of forks)
and then forks it. Every fork must boot, hold the files its source had, and its disk, like its source's,
must pass ``xfs_repair -n``: each is checked through a copy taken while it is paused and synced (a crash
image, as a fork's clone is), mounted once so that its log is replayed, then unmounted and repaired
read-only. A grown disk's image must say its new size at once: a clone that has to replay a growth from
the log does not mount on this kernel (the cause of "mount exited with 117: Structure needs cleaning").

Every iteration has its own seed, printed, and a failure names it: ``PADDOCK_TORTURE_SEED=<seed>
PADDOCK_TORTURE_ITERATIONS=1`` runs that sequence again. The short run (20 iterations) is part of the
suite; ``make soak`` runs the long one (200 iterations, ``PADDOCK_TORTURE_ITERATIONS`` to change it).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import struct
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.client import HostAgentClient, HostAgentError
from paddock_hostagent.drivers.storage import loops, mounts, rootdisks
from paddock_hostagent.drivers.storage.rootdisks import Disk, DiskNotCleanError
from paddock_hostagent.drivers.system.commands import run_sync
from paddock_hostagent.schemas import ForkBody
from tests.hostagent.conftest import DISK_MIB, AgentProcess, Sandboxes, run, sandbox_cgroup_dirs, sh
from tests.loopdevices import wait_released

pytestmark = pytest.mark.root

SHORT_ITERATIONS = 20
SOAK_ITERATIONS = 200
MAX_DISK_MIB = 12288


def _seeds(default_iterations: int) -> list[int]:
    first = int(os.environ.get("PADDOCK_TORTURE_SEED") or secrets.randbelow(1 << 31))
    count = int(os.environ.get("PADDOCK_TORTURE_ITERATIONS") or default_iterations)
    return [first + index for index in range(count)]


# -- checking a disk ----------------------------------------------------------------------------


def superblock_blocks(image: Path) -> int:
    """The data blocks the primary superblock of the XFS image says it has (on disk, not in memory)."""
    with open(image, "rb") as file:
        raw = file.read(16)
    assert raw[:4] == b"XFSB", f"{image} holds no XFS superblock"
    return int(struct.unpack(">Q", raw[8:16])[0])


# Mounts the copy once and unmounts it in a mount namespace of its own: a container started meanwhile (the
# warm pool parks sandboxes in the background) copies the host's mounts, and would keep the copy's
# filesystem alive past the host's unmount, its log never closed, for xfs_repair to find dirty.
_MOUNT_ONCE = 'mkdir -p "$2" && mount -t xfs -o loop,nouuid "$1" "$2" && umount "$2"'


async def repair_check(host: HostAgentClient, agent: AgentProcess, sandbox_id: str, label: str) -> str:
    """Problems ``xfs_repair -n`` finds in a crash image of the sandbox's disk ('' when clean): the
    sandbox is paused and its disk synced, its image cloned, then resumed; the copy is mounted once
    (its log replayed, as a fork's mount does), unmounted and checked."""
    slot = agent.record(sandbox_id)["driver_state"]["slot"]
    image, mount_dir = Path(slot["disk_image"]), Path(slot["disk_mount"])
    was_paused = (await host.get_sandbox(sandbox_id)).status == "paused"
    name = f"check-{secrets.token_hex(4)}"
    copy, copy_mount = image.parent / f"{name}.img", image.parent.parent / name
    if not was_paused:
        await host.pause_sandbox(sandbox_id)
    try:
        mounts.sync_filesystem(mount_dir)
        rootdisks.clone_file(image, copy)
    finally:
        if not was_paused:
            await host.resume_sandbox(sandbox_id)
    try:
        replayed = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                _MOUNT_ONCE,
                "sh",
                str(copy),
                str(copy_mount),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if replayed.returncode != 0:
            return f"{label}: a crash image of its disk does not mount: {replayed.stderr.strip()[-500:]}"
        checked = subprocess.run(
            ["xfs_repair", "-n", "-f", str(copy)], capture_output=True, text=True, check=False
        )
        if checked.returncode != 0:
            said = [
                line
                for line in (checked.stdout + checked.stderr).splitlines()
                if not line.lstrip().startswith(("- agno", "Phase", "- "))
            ]
            return f"{label}: xfs_repair -n exited {checked.returncode}:\n" + "\n".join(said[:60])
        return ""
    finally:
        copy.unlink(missing_ok=True)
        if copy_mount.is_dir():
            copy_mount.rmdir()


# -- the sequences --------------------------------------------------------------------------------


@dataclass
class Run:
    """One seeded sequence on one sandbox: what was done, and the files the sandbox must hold."""

    seed: int
    host: HostAgentClient
    sandboxes: Sandboxes
    agent: AgentProcess
    rnd: random.Random
    sandbox_id: str = ""
    disk_mib: int = DISK_MIB
    done: list[str] = field(default_factory=list)
    expected_files: int = 0
    step: int = 0

    def fail(self, message: str) -> None:
        pytest.fail(
            f"fork torture seed={self.seed} after {self.done}: {message}\n"
            f"reproduce with PADDOCK_TORTURE_SEED={self.seed} PADDOCK_TORTURE_ITERATIONS=1",
            pytrace=False,
        )

    async def ok(self, command: str) -> dict[str, Any]:
        result = await sh(self.host, self.sandbox_id, command)
        if result["exit_code"] != 0:
            self.fail(f"{command!r} failed: {result}")
        return result

    # Each operation touches the sandbox's disk (egress is there because a real client's run does it).

    async def files(self) -> None:
        """Files in many new directories: XFS spreads directories over allocation groups, the new ones
        a resize added included."""
        dirs, per_dir = self.rnd.randint(4, 48), self.rnd.randint(2, 30)
        self.step += 1
        await self.ok(
            f"for d in $(seq {dirs}); do mkdir -p /root/t/s{self.step}-$d && cd /root/t/s{self.step}-$d && "
            f"seq -f f%g {per_dir} | xargs touch && echo data > f1; done"
        )
        self.expected_files += dirs * per_dir

    async def upload(self) -> None:
        data = self.rnd.randbytes(self.rnd.randint(1, 2 << 20))

        async def chunks() -> AsyncIterator[bytes]:
            yield data

        self.step += 1
        await self.host.upload(self.sandbox_id, f"/root/up{self.step}", chunks())

    async def big(self) -> None:
        self.step += 1
        await self.ok(f"head -c {self.rnd.randint(1, 48)}M /dev/urandom > /root/big{self.step}")

    async def delete(self) -> None:
        await self.ok("ls -d /root/t/* 2>/dev/null | head -n 3 | while read d; do rm -rf $d; done; true")
        self.expected_files = int((await self.ok("find /root/t -type f | wc -l"))["stdout"])

    async def resize(self) -> None:
        if self.disk_mib >= MAX_DISK_MIB:
            return
        self.disk_mib = min(MAX_DISK_MIB, self.disk_mib + self.rnd.choice([256, 1024, 2048, 8192]))
        await self.host.resize_sandbox(self.sandbox_id, self.disk_mib)
        self.check_size_on_disk()

    def size_on_disk(self, sandbox_id: str) -> int:
        """What the primary superblock written in the sandbox's disk image says, in MiB."""
        slot = self.agent.record(sandbox_id)["driver_state"]["slot"]
        return superblock_blocks(Path(slot["disk_image"])) >> 8

    def check_size_on_disk(self) -> None:
        """A resized disk's image says its new size at once (its superblock written home): a fork's
        clone of it never has to replay the growth from the log, which this kernel cannot do."""
        on_disk = self.size_on_disk(self.sandbox_id)
        if on_disk != self.disk_mib:
            self.fail(f"the disk is {self.disk_mib} MiB but its image's superblock says {on_disk} MiB")

    def check_size_after_create(self) -> None:
        """A create that claimed a smaller parked disk grew it without writing the superblock home (the
        freeze is left out of the create): the image says the parked size or, once XFS's log worker
        has pushed it (30 s), the new one; nothing outside those."""
        on_disk = self.size_on_disk(self.sandbox_id)
        if not DISK_MIB <= on_disk <= self.disk_mib:
            self.fail(f"the disk is {self.disk_mib} MiB but its image's superblock says {on_disk} MiB")

    async def pause(self) -> None:
        await self.host.pause_sandbox(self.sandbox_id)
        if self.rnd.random() < 0.5:
            await asyncio.sleep(self.rnd.uniform(0, 0.3))
        await self.host.resume_sandbox(self.sandbox_id)

    async def egress(self) -> None:
        await self.host.set_egress(self.sandbox_id, ["203.0.113.0/24"])
        await self.host.set_egress(self.sandbox_id, [])

    async def fork(self, *, paused: bool) -> str:
        """Forks the sandbox (paused first when ``paused``): the fork must boot and hold every file.
        Noted as ``fork`` or ``fork(quiesced)`` (the source was frozen for its clone)."""
        self.done.append("fork")
        if paused:
            await self.host.pause_sandbox(self.sandbox_id)
        child_id = f"sb-{secrets.token_hex(5)}"
        self.sandboxes.track(child_id)
        # Whether the source's grown superblock is home is not read here: XFS's log worker runs every
        # second (the agent sets it), so it may write it home between any read of ours and the agent's
        # own. A clone of a growth still in the log would not mount (117), so the fork below would
        # fail; test_a_disk_grown_by_an_older_agent_is_frozen_for_its_clone holds the freeze itself.
        try:
            await self.host.fork_sandbox(
                self.sandbox_id,
                ForkBody(new_id=child_id, name="torture", start_paused=self.rnd.random() < 0.2),
            )
        except Exception as exc:
            self.fail(f"the fork of {self.sandbox_id} failed: {exc}")
        finally:
            if paused:
                await self.host.resume_sandbox(self.sandbox_id)
        if "quiesce_ms" in self.agent.logged("fork_phases", child_id):
            self.done[-1] = "fork(quiesced)"
        self.check_size_on_disk()  # the fork's freeze wrote it home, if the log had not yet
        if (await self.host.get_sandbox(child_id)).status == "paused":
            await self.host.resume_sandbox(child_id)
        counted = await run(self.host, child_id, "bash", "-c", "find /root/t -type f 2>/dev/null | wc -l")
        if int(counted["stdout"] or 0) != self.expected_files:
            self.fail(f"the fork holds {counted['stdout'].strip()} files, its source {self.expected_files}")
        problem = await repair_check(self.host, self.agent, child_id, f"fork {child_id}")
        if problem:
            self.fail(problem)
        return child_id

    def operations(self) -> list[Callable[[], Any]]:
        return [self.files, self.files, self.upload, self.big, self.delete, self.resize, self.resize]

    async def sequence(self) -> None:
        self.disk_mib = self.rnd.choice([DISK_MIB, 4096, 10240])  # larger than the warm slot: grown
        created = await self.sandboxes.create(disk_mib=self.disk_mib, name="torture")
        self.sandbox_id = created["id"]
        self.check_size_after_create()
        await self.ok("mkdir -p /root/t")
        for _ in range(self.rnd.randint(2, 6)):
            choice = self.rnd.random()
            if choice < 0.12:
                name = "pause"
                await self.pause()
            elif choice < 0.17:
                name = "egress"
                await self.egress()
            elif choice < 0.25:
                child_id = await self.fork(paused=self.rnd.random() < 0.3)
                if self.rnd.random() < 0.5:  # go on with the fork: a fork of a fork next
                    self.sandbox_id = child_id
                    self.done.append("(continue on the fork)")
                continue
            else:
                operation = self.rnd.choice(self.operations())
                name = operation.__name__
                await operation()
            self.done.append(name)
        await self.fork(paused=self.rnd.random() < 0.3)
        problem = await repair_check(self.host, self.agent, self.sandbox_id, f"source {self.sandbox_id}")
        if problem:
            self.fail(problem)


async def torture(make_agent: Any, seeds: list[int]) -> None:
    agent: AgentProcess = make_agent()
    agent.start()
    started = time.monotonic()
    async with agent.client() as host:
        for seed in seeds:
            print(f"fork torture seed={seed}", flush=True)
            sandboxes = Sandboxes(host, agent)
            attempt = Run(seed, host, sandboxes, agent, random.Random(seed))
            began = time.monotonic()
            try:
                await attempt.sequence()
            finally:
                await sandboxes.destroy_all()
            print(
                f"  disk {attempt.disk_mib} MiB, {attempt.done}: {time.monotonic() - began:.1f} s", flush=True
            )
    print(f"fork torture: {len(seeds)} sequences in {time.monotonic() - started:.0f} s")


@pytest.mark.timeout(900)  # 20 sequences: 79 s here alone, 190 s beside other suites
async def test_fork_torture(make_agent: Any) -> None:
    await torture(make_agent, _seeds(SHORT_ITERATIONS))


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)  # ~4-15 s a sequence on a loaded 2-core box
async def test_fork_torture_soak(make_agent: Any) -> None:
    if os.environ.get("PADDOCK_SOAK") != "1":
        pytest.skip("the long run is `make soak` (PADDOCK_SOAK=1)")
    await torture(make_agent, _seeds(SOAK_ITERATIONS))


# -- the case the torture found -------------------------------------------------------------------


async def test_a_fork_after_the_disk_grew_mounts_without_quiescing(
    host: HostAgentClient, sandboxes: Sandboxes, agent: AgentProcess
) -> None:
    """A disk grown at its create (the warm slot's 2 GiB to 10 GiB) and by a resize, then written in
    many directories (some in the new allocation groups): the fork's clone, taken without a freeze (a
    short log), mounts and holds every file. Before, the grown superblock was only in the log, whose
    first checkpoint held buffers of the new allocation groups before it: the clone's log recovery read
    them against the old size and the fork failed with "mount exited with 117: Structure needs
    cleaning"."""
    source = await sandboxes.create(disk_mib=10240, name="grown")
    spread = "for d in $(seq 64); do mkdir -p /root/t/$d && touch /root/t/$d/a /root/t/$d/b; done"
    assert (await sh(host, source["id"], spread))["exit_code"] == 0
    await host.resize_sandbox(source["id"], 12288)
    more = "for d in $(seq 64); do mkdir -p /root/u/$d && touch /root/u/$d/c; done"
    assert (await sh(host, source["id"], more))["exit_code"] == 0

    child_id = f"{source['id']}-fork"
    sandboxes.track(child_id)
    await host.fork_sandbox(source["id"], ForkBody(new_id=child_id, name="grown-fork", start_paused=False))
    counted = await sh(host, child_id, "find /root/t /root/u -type f | wc -l")
    assert counted["stdout"].strip() == str(64 * 3)
    phases = agent.logged("fork_phases", child_id)
    assert "quiesce_ms" not in phases, "the plain clone (no freeze) is what this checks"
    slot = agent.record(source["id"])["driver_state"]["slot"]
    assert superblock_blocks(Path(slot["disk_image"])) == 12288 << 8, "the grown size is on disk"
    assert await repair_check(host, agent, child_id, "fork") == ""
    assert await repair_check(host, agent, source["id"], "source") == ""


# -- the clone itself (drivers/rootdisks.py), on a store as the agent makes one ---------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    """An XFS store with reflink on a direct-I/O loop device, as ``rootdisks.open_store`` makes one."""
    backing = tmp_path / "disks.xfs"
    with open(backing, "wb") as image:
        image.truncate(32 << 30)
    run_sync(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", str(backing)])
    device = asyncio.run(loops.attach(backing, direct_io=True))
    directory = tmp_path / "disks"
    directory.mkdir()
    try:
        mounts.mount(device, directory, "xfs")
        try:
            yield directory
        finally:
            mounts.unmount(directory)
    finally:
        asyncio.run(loops.detach(device))


async def _disk(store: Path, name: str, mib: int, *, mounted: bool = True) -> Disk:
    disk = Disk(store / f"{name}.img", store.parent / name, "xfs")
    await rootdisks.format_from_blank(disk.image_path, mib, "xfs", store)
    await rootdisks.attach(disk)
    if not mounted:  # a warm slot readied for a fork: its loop device, no mount
        mounts.unmount(disk.mount_dir)
    return disk


def _repair(image: Path) -> subprocess.CompletedProcess[str]:
    # A copy of its mount held by a namespace made meanwhile keeps the log dirty until it goes.
    assert wait_released(image), f"{image} is still held by a loop device"
    return subprocess.run(["xfs_repair", "-n", "-f", str(image)], capture_output=True, text=True, check=False)


@pytest.mark.serial  # XFS's log worker every 30 s (its fixture): the grown superblock stays in the log
async def test_a_disk_grown_by_an_older_agent_is_frozen_for_its_clone(
    store: Path, xfs_log_worker_every_30_s: None
) -> None:
    """An agent before this one grew a disk with ``xfs_growfs`` alone, leaving the grown superblock in
    the log only: a fork of such a disk freezes it for the clone (which writes the superblock home), so
    the clone has nothing of the growth to replay; it mounts, holds every file and repairs clean."""
    source = await _disk(store, "source", 2048)
    slot = await _disk(store, "slot", 2048, mounted=False)
    try:
        with open(source.image_path, "r+b") as image:
            image.truncate(10240 << 20)
        loops.refresh_capacity(source.loop_device)
        run_sync(["xfs_growfs", str(source.mount_dir)])  # the old grow: nothing written home
        for index in range(64):  # directories spread over allocation groups, the new ones included
            (source.upper_dir / str(index)).mkdir()
            (source.upper_dir / str(index) / "file").write_bytes(b"x")
        assert superblock_blocks(source.image_path) == 2048 << 8

        steps: list[str] = []
        await rootdisks.clone_disk(source, slot, step=steps.append)
        assert steps == ["sync", "quiesce", "clone", "loop", "mount"], steps
        assert len(list(slot.upper_dir.glob("*/file"))) == 64
        assert superblock_blocks(source.image_path) == 10240 << 8
        (source.upper_dir / "after").write_bytes(b"the source writes on")
        await rootdisks.detach(slot)
        checked = _repair(slot.image_path)
        assert checked.returncode == 0, checked.stdout[-2000:]
    finally:
        await rootdisks.detach(slot)
        await rootdisks.detach(source)
    checked = _repair(source.image_path)
    assert checked.returncode == 0, checked.stdout[-2000:]


def _break_root_inode(image: Path) -> Callable[[], None]:
    """Overwrites the magic number of the root directory's inode in the XFS ``image`` of a live
    filesystem; returns what puts it back. The live filesystem holds that inode (and its cluster's
    buffer) in memory and has no reason to read it again, and a fork's own writes to the source
    before its clone (its sync, its log record, which rewrites the superblocks) leave it alone; a
    copy's mount reads it and fails ("Structure needs cleaning")."""
    with open(image, "r+b") as file:
        sb = file.read(128)
        (root,) = struct.unpack(">Q", sb[56:64])  # sb_rootino
        (block_size,) = struct.unpack(">I", sb[4:8])
        (ag_blocks,) = struct.unpack(">I", sb[84:88])
        (inode_size,) = struct.unpack(">H", sb[104:106])
        per_block_log, ag_blocks_log = sb[123], sb[124]  # sb_inopblog, sb_agblklog
        # An inode number is (AG << (agblklog + inopblog)) | (block in the AG << inopblog) | slot.
        ag, block = (
            root >> (ag_blocks_log + per_block_log),
            (root >> per_block_log) & ((1 << ag_blocks_log) - 1),
        )
        slot = root & ((1 << per_block_log) - 1)
        offset = (ag * ag_blocks + block) * block_size + slot * inode_size
        file.seek(offset)
        kept = file.read(2)
        assert kept == b"IN"
        file.seek(offset)
        file.write(b"!!")

    def put_back() -> None:
        with open(image, "r+b") as file:
            file.seek(offset)
            file.write(kept)

    return put_back


async def test_a_copy_that_does_not_mount_clean_is_refused_unmounted(store: Path) -> None:
    """A copy whose mount fails as a damaged filesystem does (here its root inode, broken in the
    source's image under the live source) is ``DiskNotCleanError`` saying so, and is left unmounted;
    the source, which holds that inode in its memory, is untouched."""
    source = await _disk(store, "source", 2048)
    slot = await _disk(store, "slot", 2048, mounted=False)
    try:
        (source.upper_dir / "kept").write_bytes(b"x")
        mounts.sync_filesystem(source.mount_dir)
        put_back = _break_root_inode(source.image_path)
        with pytest.raises(DiskNotCleanError, match=r"not a clean filesystem.*nothing was booted"):
            await rootdisks.clone_disk(source, slot)
        assert not mounts.is_mountpoint(slot.mount_dir)
        assert (source.upper_dir / "kept").read_bytes() == b"x"
        put_back()
    finally:
        await rootdisks.detach(slot)
        await rootdisks.detach(source)
    checked = _repair(source.image_path)
    assert checked.returncode == 0, checked.stdout[-2000:]


async def test_a_fork_whose_copy_is_not_clean_is_refused_and_leaves_nothing(
    host: HostAgentClient, sandboxes: Sandboxes, agent: AgentProcess
) -> None:
    """A fork whose copy of the disk does not mount clean (here: the root inode broken in the source's
    image under the live source, which holds it in its memory) is refused with an error that says so,
    before anything boots: no sandbox, record or cgroup of it is left, and the source runs on
    untouched; once the inode is whole again, the same fork works."""
    source = await sandboxes.create(name="damaged")
    assert (await sh(host, source["id"], "echo kept > /root/kept && sync"))["exit_code"] == 0
    slot = agent.record(source["id"])["driver_state"]["slot"]
    put_back = _break_root_inode(Path(slot["disk_image"]))
    child_id = f"{source['id']}-fork"
    sandboxes.track(child_id)
    with pytest.raises(HostAgentError, match="not a clean filesystem") as refused:
        await host.fork_sandbox(source["id"], ForkBody(new_id=child_id, name="refused", start_paused=False))
    assert refused.value.status == 500 and "nothing was booted" in str(refused.value)
    assert child_id not in [view.id for view in await host.list_sandboxes()]
    assert not (agent.state_dir / "sandboxes" / f"{child_id}.json").exists()
    assert sandbox_cgroup_dirs([child_id]) == []
    put_back()  # first: the source's reads below may have it write inodes of that cluster
    assert (await sh(host, source["id"], "cat /root/kept"))["stdout"] == "kept\n"

    await host.fork_sandbox(source["id"], ForkBody(new_id=child_id, name="healed", start_paused=False))
    assert (await sh(host, child_id, "cat /root/kept"))["stdout"] == "kept\n"
