"""The in-sandbox half of ``sandbox.run_code``: runs one cell in a context's Jupyter kernel.

The SDK uploads this file into the sandbox (it is not imported on the client side) and runs it per call
through exec, with the cell on stdin:

    python3 /tmp/.paddock-code-<hash>.py --context NAME --timeout-s SECONDS < cell.py

Each context has its own IPython kernel, started here on first use and left running in its own session
(so the exec's process-group kill at exit does not reach it); its connection file, pid and lock live in
``/tmp/.paddock-kernels``. The kernel talks over ZeroMQ IPC sockets in that directory, so it needs no
network interface and no egress rule. Calls to one context are serialised by a lock on its file; calls to
different contexts run side by side.

Everything the SDK reads is one JSON object a line on stdout, flushed as it happens so output streams:
``{"type": "stdout"|"stderr", "text"}``, ``{"type": "result", "data": {mime: value}, "is_main_result"}``,
``{"type": "error", "name", "value", "traceback"}``, and last ``{"type": "end", "execution_count",
"timed_out", "kernel_started", "kernel_restarted"}``; a failure of the driver itself is
``{"type": "driver_error", "message"}`` (exit code 3).

It runs on the sandbox's Debian Python with python3-ipykernel and python3-jupyter-client, and needs
nothing from Paddock.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from queue import Empty
from typing import Any

STATE_DIR = Path("/tmp/.paddock-kernels")
CONTEXT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
KERNEL_START_TIMEOUT_S = 60.0
#: After an interrupt, how long the kernel gets to go idle before it is killed and restarted.
INTERRUPT_GRACE_S = 10.0
#: Where the inline backend sends figures: PNG in display_data, which becomes an image/png result.
KERNEL_ENV = {"MPLBACKEND": "module://matplotlib_inline.backend_inline", "MPLCONFIGDIR": "/tmp/.paddock-mpl"}


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class DriverError(Exception):
    """The driver could not run the cell (no kernel, bad arguments); reported as driver_error."""


class Kernel:
    """One context's kernel: its files under STATE_DIR, started when missing or dead."""

    def __init__(self, context: str) -> None:
        self.context = context
        self.connection_file = STATE_DIR / f"{context}.json"
        self.pid_file = STATE_DIR / f"{context}.pid"
        self.log_file = STATE_DIR / f"{context}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        # A zombie or a recycled pid is not our kernel: /proc/<pid>/cmdline names the connection file.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if str(self.connection_file).encode() in cmdline else None

    def start(self) -> None:
        from jupyter_client.connect import write_connection_file  # the sandbox's package, not the SDK's

        self.stop()
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        write_connection_file(
            str(self.connection_file), transport="ipc", ip=str(STATE_DIR / f"{self.context}-ipc")
        )
        env = {**os.environ, **KERNEL_ENV}
        with open(self.log_file, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "ipykernel_launcher", "-f", str(self.connection_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                cwd=os.environ.get("HOME", "/root"),
                start_new_session=True,  # outlives this exec, whose process group is killed at its end
            )
        self.pid_file.write_text(str(process.pid))

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for path in (self.connection_file, self.pid_file):
            path.unlink(missing_ok=True)
        for ipc in STATE_DIR.glob(f"{self.context}-ipc-*"):
            ipc.unlink(missing_ok=True)

    def interrupt(self) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGINT)  # ipykernel's interrupt_mode "signal": KeyboardInterrupt in the cell


def connect(kernel: Kernel) -> tuple[Any, bool]:
    """A ready client for the context's kernel, and whether the kernel was started for this call."""
    from jupyter_client import BlockingKernelClient  # the sandbox's package, imported lazily as above

    started = False
    if kernel.pid() is None:
        kernel.start()
        started = True
    client = BlockingKernelClient()
    client.load_connection_file(str(kernel.connection_file))
    client.start_channels()
    wait_ready(client, kernel)
    return client, started


def wait_ready(client: Any, kernel: Kernel) -> None:
    """Until the kernel answers kernel_info on shell *and* its status for that request reaches us on
    iopub: a ZeroMQ subscriber that has not finished joining silently misses messages, so without the
    second check a cell's first output could be lost. Liveness is the kernel's pid, not jupyter_client's
    heartbeat check, which calls a kernel dead when a busy CPU delays its first beat (two contexts
    starting at once on one vCPU did exactly that)."""
    deadline = time.monotonic() + KERNEL_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if kernel.pid() is None:
            log_tail = kernel.log_file.read_text(errors="replace")[-2000:] if kernel.log_file.exists() else ""
            kernel.stop()
            raise DriverError(f"the kernel for context {kernel.context!r} exited while starting:\n{log_tail}")
        msg_id = client.kernel_info()
        try:
            while client.get_shell_msg(timeout=1.0)["parent_header"].get("msg_id") != msg_id:
                pass
            while client.get_iopub_msg(timeout=0.5)["parent_header"].get("msg_id") != msg_id:
                pass
            return
        except Empty:
            continue
    kernel.stop()
    raise DriverError(
        f"the kernel for context {kernel.context!r} did not answer in {KERNEL_START_TIMEOUT_S}s"
    )


def forward(message: dict[str, Any]) -> None:
    """One iopub message of our cell → the line the SDK reads (other kinds are dropped)."""
    kind = message["msg_type"]
    content = message["content"]
    if kind == "stream":
        emit({"type": content["name"], "text": content["text"]})
    elif kind in ("execute_result", "display_data"):
        emit({"type": "result", "data": content["data"], "is_main_result": kind == "execute_result"})
    elif kind == "error":
        emit(
            {
                "type": "error",
                "name": content["ename"],
                "value": content["evalue"],
                # IPython colours its tracebacks for terminals; a model or a log wants plain text.
                "traceback": [ANSI_RE.sub("", line) for line in content["traceback"]],
            }
        )


def run_cell(kernel: Kernel, code: str, timeout_s: float) -> dict[str, Any]:
    client, started = connect(kernel)
    try:
        msg_id = client.execute(code, store_history=True, allow_stdin=False)
        deadline = time.monotonic() + timeout_s
        timed_out = restarted = False
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 and not timed_out:
                timed_out = True
                kernel.interrupt()
                deadline = time.monotonic() + INTERRUPT_GRACE_S
                continue
            if remaining_s <= 0:
                # The cell ignored the interrupt (a C loop holding the GIL, a signal handler): only a
                # fresh kernel frees the context, and its state is gone.
                kernel.stop()
                restarted = True
                break
            try:
                message = client.get_iopub_msg(timeout=remaining_s)
            except Empty:  # the deadline passed with nothing to read
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                break
            forward(message)
        count = None
        if not restarted:
            try:
                reply = client.get_shell_msg(timeout=5)
                count = reply["content"].get("execution_count")
            except Empty:  # no reply: the count is unknown
                pass
        return {
            "type": "end",
            "execution_count": count,
            "timed_out": timed_out,
            "kernel_started": started,
            "kernel_restarted": restarted,
        }
    finally:
        client.stop_channels()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", default="default")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    try:
        if not CONTEXT_RE.match(args.context):
            raise DriverError(f"context {args.context!r} must be 1-64 of A-Z a-z 0-9 _ . -")
        code = sys.stdin.read()
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        kernel = Kernel(args.context)
        with open(STATE_DIR / f"{args.context}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one cell at a time per context, as in a notebook
            emit(run_cell(kernel, code, args.timeout_s))
    except ImportError as exc:
        emit(
            {
                "type": "driver_error",
                "message": f"this image has no Jupyter kernel ({exc}); use code-interpreter:1",
            }
        )
        return 3
    except DriverError as exc:
        emit({"type": "driver_error", "message": str(exc)})
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
