"""What the VM tier's driver-level tests share: a QEMU runtime on a network of its own, taken down with a
check that it left nothing, and a command run in a VM through its guest agent."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from paddock_hostagent.drivers.base import SandboxRecord
from paddock_hostagent.drivers.net.network import NetworkManager
from paddock_hostagent.drivers.vm.qemu import QemuOptions, QemuRuntime
from paddock_hostagent.guest import ExecRequest, Exited, Output
from tests.hostagent.conftest import private_subnet

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@asynccontextmanager
async def qemu_runtime(
    state_dir: Path, guest_binary_dir: Path, table_prefix: str, **options: Any
) -> AsyncIterator[QemuRuntime]:
    """A started ``QemuRuntime`` (TCG) with its own nft table and subnet; on the way out its state dir
    goes (saved states, snapshots and image disks: hundreds of MiB), and no slot or run dir may be left."""
    table = f"{table_prefix}{secrets.token_hex(3)}"
    network = NetworkManager(private_subnet(), state_dir / "network", table, [])
    network.setup_host()
    run_root = Path(f"/run/{table}")
    qemu = QemuRuntime(
        QemuOptions(
            state_dir=state_dir,
            guest_binary=guest_binary_dir / "paddock-guest",
            network=network,
            runtime_root=run_root,
            accel="tcg",
            **options,
        )
    )
    await qemu.start([])
    try:
        yield qemu
    finally:
        await qemu.close()
        network.teardown_host()
        leftovers = list((state_dir / "vm" / "slots").glob("*")) + list((run_root / "vm").glob("*"))
        subprocess.run(["rm", "-rf", str(run_root)], check=False)
        shutil.rmtree(state_dir, ignore_errors=True)
        assert not leftovers, f"the VM tier left these behind: {leftovers}"


async def guest_run(
    runtime: QemuRuntime, record: SandboxRecord, script: str, stdin: bytes | None = None
) -> tuple[int, str, str]:
    """``bash -c script`` in the VM: its exit code, stdout and stderr."""
    out, err, code = b"", b"", -1
    request = ExecRequest("bash", ["-c", script], {"PATH": PATH}, "/", stdin)
    async with runtime.guest(record).exec(request) as session:
        async for event in session:
            if isinstance(event, Output):
                if event.stream == "stdout":
                    out += event.data
                else:
                    err += event.data
            elif isinstance(event, Exited):
                code = event.exit_code
    return code, out.decode(), err.decode()


async def sh(runtime: QemuRuntime, record: SandboxRecord, script: str) -> str:
    """The script's stdout; it must succeed."""
    code, out, err = await guest_run(runtime, record, script)
    assert code == 0, f"{script!r} exited {code}: {err}"
    return out
