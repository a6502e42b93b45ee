"""The per-call half of ``sandbox.run_code``, run in the sandbox through exec with the cell on stdin:

    python3 -S /tmp/.paddock-code-<hash>.py CONTEXT TIMEOUT_S [--envs] < cell.py

It passes the cell to the sandbox's kernel server (``_code_server.py``, shipped beside it as
``/tmp/.paddock-code-<hash>-server.py``) over a unix socket, starting the server when none answers, and
copies the server's JSON lines to stdout as they come, until the server closes the connection after the
cell's last line. The SDK uploads both files (neither is imported on the client side).

This runs once per call, so it starts in as little time as Python allows: ``-S`` skips site, and the
only imports are built-in modules (``_socket`` rather than ``socket``, which pulls in enum and
selectors). The first version, importing argparse, json, re, socket, subprocess and threading, took
~70 ms longer to start than ``python3 -c pass`` on the test machine. Any failure is one
``{"type": "driver_error"}`` line (exit code 3); the server validates the request.
"""

from __future__ import annotations

import _socket
import fcntl
import os
import sys
import time

STATE_DIR = "/tmp/.paddock-kernels"
ENVS_FLAG = "--envs"
SERVER_START_TIMEOUT_S = 30.0


def fail(message: str) -> int:
    # Written by hand, json's import costs more than this whole client: escape what JSON requires.
    text = message.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    text = "".join(char if char >= " " else " " for char in text)
    os.write(1, b'{"type": "driver_error", "message": "' + text.encode() + b'"}\n')
    return 3


def connect(path: str) -> _socket.socket | None:
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:  # no socket yet, or a stale one left by a server that is gone
        conn.close()
        return None
    return conn


def start_server(server_file: str, path: str, log_path: str) -> _socket.socket:
    """Starts the kernel server (once, under a lock) and returns a connection to it."""
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    with open(os.path.join(STATE_DIR, "server.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = connect(path)
        if conn is not None:
            return conn
        # Lazy, and named so: only the first call of a sandbox starts the server, and only it pays for
        # subprocess's import.
        import subprocess

        with open(log_path, "ab") as log:
            server = subprocess.Popen(
                [sys.executable, server_file, path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # outlives this exec, whose process group is killed at its end
            )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = connect(path)
            if conn is not None:
                return conn
            if server.poll() is not None:
                with open(log_path, "rb") as log:
                    tail = log.read()[-1500:].decode(errors="replace")
                raise OSError(f"the kernel server exited at start (exit {server.returncode}): {tail}")
            time.sleep(0.01)
    raise OSError(f"the kernel server did not listen within {SERVER_START_TIMEOUT_S}s")


def main() -> int:
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], [ENVS_FLAG]):
        return fail(f"usage: python3 -S <client> CONTEXT TIMEOUT_S [{ENVS_FLAG}] < cell")
    context, timeout_s = sys.argv[1], sys.argv[2]
    base = os.path.abspath(__file__)[: -len(".py")]
    path = os.path.join(STATE_DIR, os.path.basename(base) + ".sock")  # one server per driver version
    code = sys.stdin.buffer.read()
    header = f"{context}\t{timeout_s}".encode()
    if sys.argv[3:]:
        # The cell's own environment variables: a JSON line before the cell, passed on as it is (the
        # server checks it). On stdin, not in the arguments or the environment: the audit trail records
        # a command's arguments, and an exec's environment must be declared on its sandbox.
        envs, _, code = code.partition(b"\n")
        header += b"\t" + envs
    try:
        conn = connect(path) or start_server(base + "-server.py", path, os.path.join(STATE_DIR, "server.log"))
        try:
            conn.sendall(header + b"\n" + code)
            conn.shutdown(_socket.SHUT_WR)
            while chunk := conn.recv(65536):
                os.write(1, chunk)
        finally:
            conn.close()
    except OSError as exc:
        return fail(f"run_code could not reach the kernel server: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
