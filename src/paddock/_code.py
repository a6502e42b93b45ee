"""``sandbox.run_code``'s models and the reader of the in-sandbox driver's output (no I/O here).

The driver runs in the sandbox: a light client (``_code_client.py``) run once per call through exec,
which hands the cell to a kernel server (``_code_server.py``) and prints its JSON lines, one object a
line. ``CellReader`` turns the exec's stdout frames (which may cut a line anywhere) into those
objects, calls the caller's ``on_stdout``/``on_stderr`` as output arrives and builds the ``Execution``.
Both the async and the generated sync sandbox use it, so the parsing exists once.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddock._errors import PaddockError

#: The driver's two files, shipped into a sandbox on its first run_code.
CLIENT_SOURCE = (Path(__file__).parent / "_code_client.py").read_bytes()
SERVER_SOURCE = (Path(__file__).parent / "_code_server.py").read_bytes()
#: Named after their content, so an SDK with another driver never runs a stale copy left in the sandbox
#: (nor talks to a server of another version: the socket is named after the client).
_DRIVER_HASH = hashlib.sha256(CLIENT_SOURCE + b"\0" + SERVER_SOURCE).hexdigest()[:12]
CLIENT_PATH = f"/tmp/.paddock-code-{_DRIVER_HASH}.py"
SERVER_PATH = f"/tmp/.paddock-code-{_DRIVER_HASH}-server.py"
CONTEXT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
LANGUAGES = ("python",)
#: Added to the cell's timeout for the exec itself: kernel start-up and the interrupt's grace period.
EXEC_MARGIN_S = 90.0

OutputCallback = Callable[[str], None]


class CodeInterpreterError(PaddockError):
    """run_code could not run the cell: no Jupyter kernel in the image, the kernel did not start, or
    the driver's output was cut off. An exception *in* the cell is not this: it is ``Execution.error``."""


@dataclass
class Result:
    """One rich output of a cell: the last expression's value (``is_main_result``) or a display
    (a matplotlib figure, ``display(df)``). ``data`` maps MIME types to values as Jupyter sends them:
    text as ``str``, images as base64 ``str``."""

    data: dict[str, Any]
    is_main_result: bool = False

    @property
    def text(self) -> str | None:
        value = self.data.get("text/plain")
        return value if isinstance(value, str) else None

    @property
    def html(self) -> str | None:
        value = self.data.get("text/html")
        return value if isinstance(value, str) else None

    @property
    def png(self) -> bytes | None:
        """The ``image/png`` output decoded to bytes (a matplotlib chart), or None."""
        value = self.data.get("image/png")
        return base64.b64decode(value) if isinstance(value, str) else None

    @property
    def formats(self) -> list[str]:
        return sorted(self.data)


@dataclass
class ExecutionError:
    """An exception raised by the cell: its class name, its message and the traceback's lines."""

    name: str
    value: str
    traceback: list[str] = field(default_factory=list)

    @property
    def traceback_text(self) -> str:
        return "\n".join(self.traceback)


@dataclass
class Execution:
    """What one ``run_code`` produced. ``timed_out``: the cell ran past ``timeout_s`` and the kernel
    was interrupted (its state is kept unless ``kernel_restarted``; ``error`` is then a TimeoutError)."""

    stdout: str = ""
    stderr: str = ""
    results: list[Result] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int | None = None
    timed_out: bool = False
    #: The context's kernel was started by this call: variables from earlier calls are gone (first use,
    #: a fork, whose child copies the disk but not the processes, or a kernel that died). A pause
    #: freezes processes, so a resumed sandbox keeps its kernels.
    kernel_started: bool = False
    #: The kernel ignored the interrupt and was killed, or died under the cell (``error`` is then a
    #: ``DeadKernelError``); the next call starts a fresh one.
    kernel_restarted: bool = False

    @property
    def text(self) -> str | None:
        """The last expression's ``text/plain``, as a REPL shows it."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None

    @property
    def ok(self) -> bool:
        return self.error is None


ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_arguments(
    language: str, context: str, timeout_s: float, envs: Mapping[str, str] | None = None
) -> None:
    for key, value in (envs or {}).items():
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            raise ValueError(f"envs: {key!r} must be a name as [A-Za-z_][A-Za-z0-9_]*")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"envs: the value of {key} must be a string without NUL")
    if language not in LANGUAGES:
        raise ValueError(f"language {language!r} is not supported; run_code runs {', '.join(LANGUAGES)}")
    if not CONTEXT_RE.match(context):
        raise ValueError(f"context {context!r} must be 1-64 of A-Z a-z 0-9 _ . -")
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")


#: The client's flag for a stdin that starts with the cell's own variables (``_code_client.py``).
ENVS_FLAG = "--envs"


def driver_args(context: str, timeout_s: float, envs: Mapping[str, str] | None = None) -> list[str]:
    """``python3`` arguments for one call; ``-S`` skips site, which the client does not need."""
    args = ["-S", CLIENT_PATH, context, str(timeout_s)]
    return [*args, ENVS_FLAG] if envs else args


def driver_stdin(code: str, envs: Mapping[str, str] | None = None) -> str:
    """The call's stdin: the cell, after ``envs`` (environment variables for this cell alone, set in its
    kernel while it runs and put back after) as one JSON line. On stdin: the audit trail records a
    command's arguments, never its stdin."""
    return f"{json.dumps(dict(envs))}\n{code}" if envs else code


#: ``sh -c`` arguments that move the uploaded files into place, the server first: a client in place
#: means its server is too.
INSTALL_SCRIPT = 'mv -f "$1" "$2" && mv -f "$3" "$4"'


def install_args(partial_server: str, partial_client: str) -> list[str]:
    return ["-c", INSTALL_SCRIPT, "sh", partial_server, SERVER_PATH, partial_client, CLIENT_PATH]


class CellReader:
    """Feeds on the exec's frames; ``finish`` returns the Execution or raises CodeInterpreterError."""

    def __init__(self, on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None):
        self.execution = Execution()
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._pending = ""
        self._exec_stderr: list[str] = []
        self._exit_code: int | None = None
        self._exec_error: str | None = None
        self._ended = False
        self._driver_error: str | None = None
        self._lines = 0

    def feed(self, frame: dict[str, Any]) -> None:
        if frame.get("stdout"):
            self._pending += frame["stdout"]
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                if line.strip():
                    self._line(line)
        if frame.get("stderr"):
            self._exec_stderr.append(frame["stderr"])  # the driver's own (Python's) stderr
        if frame.get("error"):
            self._exec_error = str(frame["error"])
        if "exit_code" in frame:
            self._exit_code = int(frame["exit_code"])

    @property
    def driver_missing(self) -> bool:
        """python3 could not open the driver file: the sandbox has not got it yet (exit 2, no output)."""
        return self._lines == 0 and self._exit_code == 2 and "can't open file" in "".join(self._exec_stderr)

    def _line(self, line: str) -> None:
        self._lines += 1
        try:
            message = json.loads(line)
        except ValueError:
            self._exec_stderr.append(line + "\n")
            return
        kind = message.get("type")
        execution = self.execution
        if kind == "stdout":
            execution.stdout += message["text"]
            if self._on_stdout is not None:
                self._on_stdout(message["text"])
        elif kind == "stderr":
            execution.stderr += message["text"]
            if self._on_stderr is not None:
                self._on_stderr(message["text"])
        elif kind == "result":
            execution.results.append(Result(message["data"], bool(message.get("is_main_result"))))
        elif kind == "error":
            execution.error = ExecutionError(message["name"], message["value"], list(message["traceback"]))
        elif kind == "end":
            self._ended = True
            execution.execution_count = message.get("execution_count")
            execution.timed_out = bool(message.get("timed_out"))
            execution.kernel_started = bool(message.get("kernel_started"))
            execution.kernel_restarted = bool(message.get("kernel_restarted"))
        elif kind == "driver_error":
            self._driver_error = str(message["message"])

    def finish(self, timeout_s: float) -> Execution:
        if self._pending.strip():
            self._line(self._pending)
            self._pending = ""
        if self._driver_error is not None:
            raise CodeInterpreterError(self._driver_error)
        if not self._ended:
            detail = self._exec_error or "".join(self._exec_stderr)[-2000:] or f"exit code {self._exit_code}"
            raise CodeInterpreterError(
                f"the code interpreter stopped before the cell finished: {detail.strip()} (run_code needs"
                " python3 with ipykernel in the sandbox: create it with rootfs='code-interpreter:1')"
            )
        execution = self.execution
        if execution.timed_out:
            note = (
                "the kernel ignored the interrupt and was restarted; its state is lost"
                if execution.kernel_restarted
                else "the kernel was interrupted; its state is kept"
            )
            interrupted = execution.error.traceback if execution.error else []
            execution.error = ExecutionError(
                "TimeoutError", f"the cell ran longer than {timeout_s}s; {note}", interrupted
            )
        return execution


def plain(execution: Execution) -> dict[str, Any]:
    """The Execution as JSON-ready data (for the CLI's --json and the MCP tool)."""
    return dataclasses.asdict(execution)
