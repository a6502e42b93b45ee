"""The in-sandbox kernel server of ``sandbox.run_code``: one per sandbox, one IPython kernel per context.

The SDK uploads it as ``/tmp/.paddock-code-<hash>-server.py`` beside the per-call client
(``_code_client.py``), which starts it on the first call (``python3 <server> SOCKET``) in its own
session, so the end of that exec does not kill it. It listens on a unix socket in
``/tmp/.paddock-kernels`` named after the driver's version. A request is ``CONTEXT\tTIMEOUT_S\n`` (or
``CONTEXT\tTIMEOUT_S\tENVS\n``, ENVS a JSON object of environment variables for this cell alone) and the
cell's source, up to the client's end of writing; the answer is the cell's JSON lines, then the server
closes the connection.

It keeps one IPython kernel per context, started on the context's first cell, and one jupyter_client
connection to each, so a cell costs one execute round trip. Kernels talk over ZeroMQ IPC sockets in
``/tmp/.paddock-kernels``: no network interface or egress rule is involved. Cells of one context run one
at a time (a lock per context); different contexts run side by side. A pause freezes these processes
and a resume thaws them, state and all. A fork copies the disk but not the processes: the child's first
call finds the parent's files stale (no process listens, or the pid is not a kernel of that connection
file), starts its own server and kernels, and says so (``kernel_started``).

The lines, flushed as they happen so output streams: ``{"type": "stdout"|"stderr", "text"}``,
``{"type": "result", "data": {mime: value}, "is_main_result"}``, ``{"type": "error", "name", "value",
"traceback"}``, and last ``{"type": "end", "execution_count", "timed_out", "kernel_started",
"kernel_restarted"}``, or ``{"type": "driver_error", "message"}`` when the cell could not run.

It runs on the sandbox's Debian Python with python3-ipykernel and python3-jupyter-client, and needs
nothing from Paddock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

STATE_DIR = Path("/tmp/.paddock-kernels")
CONTEXT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
KERNEL_START_TIMEOUT_S = 60.0
#: After an interrupt, how long the kernel gets to go idle before it is killed and restarted.
INTERRUPT_GRACE_S = 10.0
#: How often a cell waiting for output checks that its kernel is still alive: a kernel killed under a
#: cell (out of memory, ``os.kill`` from the cell, a restart asked meanwhile) answers nothing, and the
#: call waited until its timeout, an hour by default.
LIVENESS_EVERY_S = 1.0
#: Where the inline backend sends figures: PNG in display_data, which becomes an image/png result.
KERNEL_ENV = {"MPLBACKEND": "module://matplotlib_inline.backend_inline", "MPLCONFIGDIR": "/tmp/.paddock-mpl"}

Emit = Callable[[dict[str, Any]], None]
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A cell's environment variables are set by a silent cell before it and put back by one after it,
#: both run in the kernel (its ``os.environ`` is the one the cell and its subprocesses see). The
#: saved values live under this name in the kernel's namespace while the cell runs.
SAVED_ENV = "_paddock_saved_env"
#: How long the silent cell that puts the variables back gets to answer.
RESTORE_TIMEOUT_S = 5.0


class DriverError(Exception):
    """The cell could not be run (no kernel, bad arguments, no server); reported as driver_error."""


# the server: one per sandbox ------------------------------------------------------------------------


class Kernel:
    """One context's kernel process: its files under STATE_DIR, started when missing or dead."""

    def __init__(self, context: str) -> None:
        self.context = context
        self.connection_file = STATE_DIR / f"{context}.json"
        self.pid_file = STATE_DIR / f"{context}.pid"
        self.log_file = STATE_DIR / f"{context}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def pid(self) -> int | None:
        if self.process is not None and self.process.poll() is None:
            # Our own child, not reaped: its pid cannot have been reused. Not told by its cmdline: Popen
            # returns once the exec began (the close-on-exec pipe closes), before the kernel has set the
            # new program's arguments, and a read in between finds an empty cmdline. Two contexts
            # starting at once in a full test run were called dead that way.
            return self.process.pid
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        # A zombie or a recycled pid is not our kernel: /proc/<pid>/cmdline names the connection file.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if str(self.connection_file).encode() in cmdline else None

    def start(self, write_connection_file: Callable[..., Any]) -> None:
        self.stop()
        write_connection_file(
            str(self.connection_file), transport="ipc", ip=str(STATE_DIR / f"{self.context}-ipc")
        )
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ipykernel_launcher", "-f", str(self.connection_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, **KERNEL_ENV},
                cwd=os.environ.get("HOME", "/root"),
                start_new_session=True,  # an interrupt or a kill of the kernel reaches it alone
            )
        self.pid_file.write_text(str(self.process.pid))

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            self.process = None
        for path in (self.connection_file, self.pid_file):
            path.unlink(missing_ok=True)
        for ipc in STATE_DIR.glob(f"{self.context}-ipc-*"):
            ipc.unlink(missing_ok=True)

    def interrupt(self) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGINT)  # ipykernel's interrupt_mode "signal": KeyboardInterrupt in the cell

    def log_tail(self) -> str:
        return self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""


class Context:
    """A context's kernel and the server's connection to it, used by one cell at a time."""

    def __init__(self, name: str, jupyter: Any) -> None:
        self.kernel = Kernel(name)
        self.lock = threading.Lock()
        self.client: Any = None
        self._jupyter = jupyter  # the jupyter_client module

    def ensure(self) -> bool:
        """Starts the kernel if it is not running and connects to it; True when it was started."""
        started = False
        if self.kernel.pid() is None:
            self.disconnect()
            self.kernel.start(self._jupyter.connect.write_connection_file)
            started = True
        if self.client is None:
            client = self._jupyter.BlockingKernelClient()
            client.load_connection_file(str(self.kernel.connection_file))
            client.start_channels()
            try:
                wait_ready(client, self.kernel)
            except DriverError:
                client.stop_channels()
                raise
            self.client = client
        return started

    def disconnect(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
            self.client = None

    def restart(self) -> None:
        self.disconnect()
        self.kernel.stop()


def wait_ready(client: Any, kernel: Kernel) -> None:
    """Until the kernel answers kernel_info on shell *and* its status for that request reaches us on
    iopub: a ZeroMQ subscriber that has not finished joining silently misses messages, so without the
    second check a cell's first output could be lost. Liveness is the kernel's pid, not jupyter_client's
    heartbeat check, which calls a kernel dead when a busy CPU delays its first beat (two contexts
    starting at once on one vCPU did exactly that)."""
    deadline = time.monotonic() + KERNEL_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if kernel.pid() is None:
            status = kernel.process.poll() if kernel.process is not None else None
            tail = kernel.log_tail()
            kernel.stop()
            raise DriverError(
                f"the kernel for context {kernel.context!r} exited while starting (status {status}):\n{tail}"
            )
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


def forward(message: dict[str, Any], emit: Emit) -> None:
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


def parse_envs(text: str) -> dict[str, str]:
    """A request's ENVS: a JSON object of names (as a shell's) to values without NUL."""
    try:
        envs = json.loads(text) if text else {}
    except ValueError:
        raise DriverError("envs must be a JSON object") from None
    if not isinstance(envs, dict):
        raise DriverError("envs must be a JSON object")
    for key, value in envs.items():
        if not ENV_KEY_RE.match(key) or not isinstance(value, str) or "\0" in value:
            raise DriverError(
                f"envs: {key[:64]!r} must be a name as [A-Za-z_][A-Za-z0-9_]* with a string value"
            )
    return envs


def set_envs_source(envs: dict[str, str]) -> str:
    """The silent cell that saves the variables' values and sets them (``repr`` quotes the values)."""
    return (
        f"import os as _paddock_os\n{SAVED_ENV} = {{k: _paddock_os.environ.get(k) for k in {sorted(envs)!r}}}\n"
        f"_paddock_os.environ.update({envs!r})\ndel _paddock_os\n"
    )


RESTORE_ENVS_SOURCE = f"""import os as _paddock_os
for _paddock_k, _paddock_v in {SAVED_ENV}.items():
    if _paddock_v is None:
        _paddock_os.environ.pop(_paddock_k, None)
    else:
        _paddock_os.environ[_paddock_k] = _paddock_v
del _paddock_os, {SAVED_ENV}
"""


def restore_envs(client: Any) -> None:
    """Puts back what the cell's variables replaced. Sent once the cell is over: a request queued behind
    a cell that raised would be aborted by the kernel (``stop_on_error``), so it is asked again then."""
    for _ in range(2):
        msg_id = client.execute(RESTORE_ENVS_SOURCE, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + RESTORE_TIMEOUT_S
        while (remaining_s := deadline - time.monotonic()) > 0:
            try:
                reply = client.get_shell_msg(timeout=remaining_s)
            except Empty:
                break
            if reply["parent_header"].get("msg_id") == msg_id:
                if reply["content"].get("status") != "aborted":
                    return
                break


def run_cell(
    context: Context, code: str, timeout_s: float, emit: Emit, envs: dict[str, str] | None = None
) -> dict[str, Any]:
    started = context.ensure()
    client = context.client
    if envs:
        # Queued ahead of the cell, which the kernel runs after it; its reply is skipped below.
        client.execute(set_envs_source(envs), silent=True, store_history=False, allow_stdin=False)
    msg_id = client.execute(code, store_history=True, allow_stdin=False)
    deadline = time.monotonic() + timeout_s
    timed_out = restarted = False
    while True:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0 and not timed_out:
            timed_out = True
            context.kernel.interrupt()
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            continue
        if remaining_s <= 0:
            # The cell ignored the interrupt (a C loop holding the GIL, a signal handler): only a fresh
            # kernel frees the context, and its state is gone.
            context.restart()
            restarted = True
            break
        try:
            message = client.get_iopub_msg(timeout=min(remaining_s, LIVENESS_EVERY_S))
        except Empty:  # nothing to read yet: the deadline passed, or the kernel is gone
            if context.kernel.pid() is None:
                status = context.kernel.process.poll() if context.kernel.process is not None else None
                context.restart()
                emit(
                    {
                        "type": "error",
                        "name": "DeadKernelError",
                        "value": f"the kernel died while running the cell (status {status}); its state is"
                        " lost, and the next cell starts a fresh one",
                        "traceback": [],
                    }
                )
                restarted = True
                break
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            break
        forward(message, emit)
    count = None
    while not restarted:
        try:
            reply = client.get_shell_msg(timeout=5)
        except Empty:  # no reply: the count is unknown
            break
        if reply["parent_header"].get("msg_id") == msg_id:
            count = reply["content"].get("execution_count")
            break
    if envs and not restarted:  # a restarted kernel starts from the server's environment anyway
        restore_envs(client)
    return {
        "type": "end",
        "execution_count": count,
        "timed_out": timed_out,
        "kernel_started": started,
        "kernel_restarted": restarted,
    }


class KernelServer:
    def __init__(self, jupyter: Any) -> None:
        self._jupyter = jupyter
        self._contexts: dict[str, Context] = {}
        self._lock = threading.Lock()

    def context(self, name: str) -> Context:
        with self._lock:
            if name not in self._contexts:
                self._contexts[name] = Context(name, self._jupyter)
            return self._contexts[name]

    def handle(self, conn: socket.socket) -> None:
        """One call: read the request (header line, then the cell), run the cell, stream its lines back."""

        def send(message: dict[str, Any]) -> None:
            # A client that went away (its exec was cut off) must not stop the cell mid-way: the
            # kernel would be left busy with output nobody reads.
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(message).encode() + b"\n")

        with conn:
            try:
                header, _, code = conn.makefile("rb").read().partition(b"\n")
                name, _, rest = header.decode().partition("\t")
                timeout, _, envs = rest.partition("\t")
                if not CONTEXT_RE.match(name):
                    raise DriverError(f"context {name!r} must be 1-64 of A-Z a-z 0-9 _ . -")
                context = self.context(name)
                with context.lock:  # one cell at a time per context, as in a notebook
                    send(run_cell(context, code.decode(), float(timeout), send, parse_envs(envs)))
            except DriverError as exc:
                send({"type": "driver_error", "message": str(exc)})
            except Exception as exc:  # the boundary: any other failure is reported, logged, survived
                traceback.print_exc()
                send({"type": "driver_error", "message": f"the kernel server failed: {exc!r}"})

    def serve(self, path: Path) -> None:
        path.unlink(missing_ok=True)  # a stale socket of a server that is gone (the client holds a lock)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(64)
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 <server> SOCKET_PATH (started by the run_code client)", file=sys.stderr)
        return 2
    try:
        # Lazy, and named so: an image without a kernel gets this message in the log the client shows.
        import jupyter_client
        import jupyter_client.connect
    except ImportError as exc:
        print(f"this image has no Jupyter kernel ({exc}); use rootfs code-interpreter:1", file=sys.stderr)
        return 3
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    KernelServer(jupyter_client).serve(Path(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
