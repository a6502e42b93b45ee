"""``paddock sandbox shell NAME``: an interactive terminal in a sandbox, through the SDK's processes.

A login shell runs on a PTY in the sandbox (a managed process, §12.2). This terminal is put in raw mode
so every keystroke (Ctrl-C included) goes to the sandbox; output is written as it arrives from a
connect stream read in a thread; SIGWINCH resizes the remote PTY; the shell's exit code is returned.
Without a terminal on stdin (a pipe), the bytes are sent as they are and no raw mode is set.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import termios
import threading
import tty
from typing import Any

# How long a read of stdin may block before the loop looks at the stream again (exit, resize).
POLL_S = 0.1


def run_shell(sandbox: Any, command: str | None = None) -> int:
    """Runs a login shell (or ``bash -lc command``) on a PTY in ``sandbox``; returns its exit code."""
    interactive = os.isatty(sys.stdin.fileno())
    size = shutil.get_terminal_size((80, 24))
    args = ["-lc", command] if command else ["-l"]
    proc = sandbox.processes.start("bash", args, pty=(size.lines, size.columns))
    finished = threading.Event()
    result: dict[str, Any] = {"code": 255}

    def pump() -> None:
        out = sys.stdout.buffer
        try:
            for frame in sandbox.processes.connect(proc.process_id):
                if frame["type"] == "data":
                    out.write(frame["data"])
                    out.flush()
                elif frame["type"] == "exit":
                    result["code"] = int(frame.get("exit_code", 255))
                elif frame["type"] == "error":
                    sys.stderr.write(f"\r\nerror: {frame.get('error')}\r\n")
        finally:
            finished.set()

    resized = threading.Event()
    previous = signal.signal(signal.SIGWINCH, lambda *_: resized.set()) if interactive else None
    saved = termios.tcgetattr(sys.stdin.fileno()) if interactive else None
    reader = threading.Thread(target=pump, name="paddock-shell-output", daemon=True)
    reader.start()
    try:
        if interactive:
            tty.setraw(sys.stdin.fileno(), termios.TCSADRAIN)  # keep what was typed before
        _forward_input(sandbox, proc.process_id, finished, resized)
        finished.wait()
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
        if previous is not None:
            signal.signal(signal.SIGWINCH, previous)
        if not finished.is_set():  # we are leaving (an error): hang the shell up
            with contextlib.suppress(Exception):
                sandbox.processes.kill(proc.process_id, grace_ms=1000)
    return int(result["code"])


def _forward_input(
    sandbox: Any, process_id: str, finished: threading.Event, resized: threading.Event
) -> None:
    stdin = sys.stdin.fileno()
    while not finished.is_set():
        if resized.is_set():
            resized.clear()
            size = shutil.get_terminal_size((80, 24))
            sandbox.processes.resize(process_id, size.lines, size.columns)
        ready, _, _ = select.select([stdin], [], [], POLL_S)
        if not ready:
            continue
        data = os.read(stdin, 65536)
        if not data:  # end of input (a pipe): the shell reads its end, then exits by itself
            sandbox.processes.send_input(process_id, b"\x04")
            return
        sandbox.processes.send_input(process_id, data)
