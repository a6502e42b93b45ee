"""The VM tier (drivers/vm/qemu.py): create, exec, pause/resume and fork, beside the raw QEMU floor, in one run.

    sudo .venv/bin/python -m bench.vm_bench                 # 3 creates, 3 forks, 30 execs/pauses
    sudo .venv/bin/python -m bench.vm_bench --rounds 1 --execs 5
    sudo .venv/bin/python -m bench.vm_bench --snapshot-written 0,100,1024   # MiB written before snapshots

Rows (milliseconds, p50 / p90 / max):
- qemu boot (floor): QEMU with the same kernel and initramfs in probe mode, from exec to the initramfs
  writing its marker on the serial console (kernel + initramfs to userspace; no disk, network or agent).
- qmp stop / cont (floor): one QMP round trip each on the running VM, as the driver does them.
- create → running (cold boot): the driver's create with saved states off, as before them — netns +
  veth + tap, qcow2 overlay on the cached ext4, QEMU boot, switch_root, guest agent answering over the
  virtio-serial channel.
- saved state build: boot a guest for the image and shape, wait for its agent, migrate its memory to a
  file and keep its overlay (once per image, shape, kernel and QEMU; in the background on a cold create).
- memory.state read (floor): reading the saved state's memory file once (QEMU's ``-incoming`` reads it
  through ``cat``), page cache warm as on a host that restores it often.
- create → running (from saved state): the default create — netns + veth + tap, a copy of the saved
  overlay, QEMU ``-incoming`` from the memory file, the guest's own address, MAC, hostname, clock and
  random seed set over the channel, guest agent answering.
- exec `true`: a buffered exec round trip through GuestClient and the channel multiplexer.
- pause / resume: the driver's pause and resume (QMP + its paused marker).
- fork → running: the source running a counter; memory snapshot, overlay copy, restore, re-address,
  guest agent answering in the fork.
- VM snapshot (N MiB written): ``QemuRuntime.snapshot`` of the source (running its counter) after it
  wrote N MiB of random data to its disk: QMP stop, memory migrated to the snapshot's file, overlay
  copied (``cp --reflink=auto``), meta.json synced and the directory renamed, the source let go on.
  The written data is on the overlay and in the guest's page cache, so both files grow with it.
- boot from VM snapshot (N MiB written): ``create_from_snapshot`` to the guest agent answering: copy of
  the snapshot's overlay, QEMU ``-incoming`` from its memory file, the VM's own identity over CONFIG.

The accelerator (KVM or TCG) is printed: under TCG these are correctness numbers, not a product's.
Needs root and the debian:13 image. Writes bench/results/vm-<time>.json; never fails on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from bench.stats import Samples
from paddock_hostagent.drivers.base import SandboxSpec, Shape
from paddock_hostagent.drivers.net.network import NetworkManager
from paddock_hostagent.drivers.vm.qemu import QemuOptions, QemuRuntime
from paddock_hostagent.drivers.vm.vmimage import PROBE_MARKER, qemu_binary
from paddock_hostagent.guest import ExecRequest
from paddock_hostagent.guest.build import ensure_agent_binary
from paddock_hostagent.images import ImageStore

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = Shape(vcpu=1, mem_mib=512, disk_mib=2048)


async def qemu_boot_ms(runtime: QemuRuntime) -> float:
    """The floor: QEMU to the initramfs's first line of userspace, nothing else."""
    kernel, initramfs = runtime.boot_files()
    accel = "kvm" if runtime.accel == "kvm" else "tcg,thread=multi"
    argv = [
        *(qemu_binary(), "-M", "q35", "-accel", accel, "-m", str(SHAPE.mem_mib), "-nodefaults"),
        *("-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio"),
        *("-kernel", str(kernel), "-initrd", str(initramfs)),
        *("-append", "console=ttyS0 quiet panic=-1 paddock.probe=1"),
    ]
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    seen = b""
    async with asyncio.timeout(120):
        while PROBE_MARKER.encode() not in seen:
            chunk = await process.stdout.read(4096)
            if not chunk:
                break
            seen += chunk
    elapsed = (time.perf_counter() - started) * 1000
    await process.wait()
    return elapsed


async def exec_true(runtime: QemuRuntime, record: Any) -> None:
    async with runtime.guest(record).exec(ExecRequest("true", [], {"PATH": "/usr/bin:/bin"})) as session:
        async for _ in session:
            pass


async def snapshots(
    runtime: QemuRuntime, source: Any, rootfs: Path, rounds: int, written_mib: list[int], samples: Samples
) -> dict[str, int]:
    """Snapshot and boot-from-snapshot rows after the source wrote each of ``written_mib`` (in
    total: each size is written on top of the last); returns each snapshot's size on the host."""
    sizes: dict[str, int] = {}
    total = 0
    for mib in written_mib:
        if mib > total:
            script = f"head -c {(mib - total) << 20} /dev/urandom > /root/written-{mib} && sync"
            await exec_sh(runtime, source, script)
            total = mib
        for index in range(rounds):
            snapshot_id = f"snap_vb{mib}x{index}"
            with samples.time(f"VM snapshot ({mib} MiB written)"):
                info = await runtime.snapshot(source, snapshot_id)
            sizes[f"{mib} MiB written"] = info.size_bytes
            spec = SandboxSpec(f"sb_vbs{mib}x{index}", f"vbs{mib}x{index}", "debian:13", rootfs, SHAPE)
            with samples.time(f"boot from VM snapshot ({mib} MiB written)"):
                copy = await runtime.create_from_snapshot(info, spec)
            await runtime.destroy(copy)
            await runtime.delete_snapshot(snapshot_id)
    return sizes


async def exec_sh(runtime: QemuRuntime, record: Any, script: str) -> None:
    request = ExecRequest("bash", ["-c", script], {"PATH": "/usr/bin:/bin"})
    async with runtime.guest(record).exec(request) as session:
        async for _ in session:
            pass


async def run(rounds: int, execs: int, work_dir: Path, written_mib: list[int]) -> dict[str, Any]:
    rootfs = ImageStore(Path("/var/lib/paddock/images")).build("debian:13")
    table = f"pdkvb{secrets.token_hex(2)}"
    network = NetworkManager("10.253.77.0/24", work_dir / "network", table, [])
    network.setup_host()
    runtime = QemuRuntime(
        QemuOptions(
            state_dir=work_dir,
            guest_binary=ensure_agent_binary(work_dir / "guest"),
            network=network,
            runtime_root=Path(f"/run/{table}"),
        )
    )
    samples = Samples()
    await runtime.start([])
    records = []
    try:
        for _ in range(rounds):
            samples.add("qemu boot (floor)", await qemu_boot_ms(runtime))
        # the base ext4 is built once per image and size: made here, untimed, as a warm host has it
        runtime.restore = False
        warm = await runtime.create(SandboxSpec("sb_vbwarm", "warm", "debian:13", rootfs, SHAPE))
        await runtime.destroy(warm)
        for index in range(rounds):
            spec = SandboxSpec(f"sb_vbc{index}", f"vbc{index}", "debian:13", rootfs, SHAPE)
            with samples.time("create → running (cold boot)"):
                cold = await runtime.create(spec)
            await runtime.destroy(cold)
        runtime.restore = True
        with samples.time("saved state build"):
            saved = await runtime.ensure_saved_state(rootfs, SHAPE.mem_mib, SHAPE.vcpu, SHAPE.disk_mib)
        memory_state_bytes = saved.memory.stat().st_size
        for _ in range(rounds):
            with samples.time("memory.state read (floor)"):
                await asyncio.to_thread(_read_file, saved.memory)
        for index in range(rounds):
            spec = SandboxSpec(f"sb_vb{index}", f"vb{index}", "debian:13", rootfs, SHAPE)
            with samples.time("create → running (from saved state)"):
                restored = await runtime.create(spec)
            assert restored.driver_state["boot"] == "restored", restored.driver_state
            await runtime.destroy(restored)  # as the cold creates: one VM at a time
        records.append(await runtime.create(SandboxSpec("sb_vbsrc", "vbsrc", "debian:13", rootfs, SHAPE)))
        source = records[0]
        for _ in range(execs):
            with samples.time("exec `true`"):
                await exec_true(runtime, source)
        for _ in range(execs):
            with samples.time("pause"):
                await runtime.pause(source)
            with samples.time("resume"):
                await runtime.resume(source)
        for _ in range(execs):
            with samples.time("qmp stop (floor)"):
                await runtime.qmp(source, "stop")
            with samples.time("qmp cont (floor)"):
                await runtime.qmp(source, "cont")
        counter = "i=0; while true; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done"
        request = ExecRequest(
            "bash", ["-c", f"nohup bash -c '{counter}' >/dev/null 2>&1 &"], {"PATH": "/usr/bin:/bin"}
        )
        async with runtime.guest(source).exec(request) as session:
            async for _ in session:
                pass
        for index in range(rounds):
            spec = SandboxSpec(f"sb_vbf{index}", f"vbf{index}", "debian:13", rootfs, SHAPE)
            with samples.time("fork → running"):
                records.append(await runtime.fork(source, spec))
        for fork in records[1:]:  # one VM beside the source while snapshots are timed
            await runtime.destroy(fork)
        del records[1:]
        snapshot_bytes = await snapshots(runtime, source, rootfs, rounds, written_mib, samples)
    finally:
        for record in records:
            await runtime.destroy(record)
        await runtime.close()
        network.teardown_host()
        shutil.rmtree(f"/run/{table}", ignore_errors=True)
    return {
        "accel": runtime.accel,
        "shape": SHAPE.__dict__,
        "memory_state_bytes": memory_state_bytes,
        "snapshot_bytes": snapshot_bytes,
        "ops": samples.summary(),
    }


def _read_file(path: Path) -> None:
    with open(path, "rb") as file:
        while file.read(1 << 20):
            pass


def render(result: dict[str, Any]) -> str:
    lines = [
        f"VM tier ({result['accel']}; {result['shape']['vcpu']} vCPU, {result['shape']['mem_mib']} MiB)",
        f"saved state memory file: {result['memory_state_bytes'] / 2**20:.1f} MiB",
        *(
            f"VM snapshot on the host ({written}): {size / 2**20:.1f} MiB"
            for written, size in result.get("snapshot_bytes", {}).items()
        ),
        "",
        "| operation | n | p50 ms | p90 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for op, stats in result["ops"].items():
        lines.append(
            f"| {op} | {stats['n']} | {stats['p50']:.1f} | {stats['p90']:.1f} | {stats['max']:.1f} |"
        )
    return "\n".join(lines)


def measure(rounds: int, execs: int, written_mib: list[int] | None = None) -> dict[str, Any]:
    """One VM-tier run in a scratch state dir (bench/run.py's ``vm`` section calls this)."""
    work_dir = Path(f"/var/tmp/paddock-vm-bench-{secrets.token_hex(3)}")
    work_dir.mkdir(parents=True)
    try:
        return asyncio.run(run(rounds, execs, work_dir, written_mib if written_mib is not None else [0, 100]))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="creates of each kind, forks and floor boots (default 3)"
    )
    parser.add_argument("--execs", type=int, default=30, help="exec and pause/resume rounds (default 30)")
    parser.add_argument(
        "--snapshot-written",
        default="0,100",
        help="MiB the source has written before each set of VM snapshots, comma-separated (default 0,100)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    written = sorted({int(part) for part in args.snapshot_written.split(",") if part.strip()})
    result = measure(args.rounds, args.execs, written)
    print(render(result))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    (args.out / f"vm-{stamp}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
