"""``sandbox.run_code`` against the real platform: a Jupyter kernel in a ``code-interpreter:1`` sandbox.

Each test asserts what an agent relies on: state kept between calls, a matplotlib chart as a real PNG,
an exception's name and traceback, a timeout that interrupts the cell but keeps the kernel and the
sandbox, independent contexts, output delivered while the cell still runs. The sync client's
``run_code`` is generated from the async one; both are exercised here.
"""

from __future__ import annotations

import asyncio
import os
import re
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import paddock
from paddock_core.rootfs import ROOT_IMAGES_BY_NAME
from paddock_hostagent.images import ImageStore
from tests.hostagent.conftest import image_cache
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOTFS = "code-interpreter:1"
SHAPE = "s-1vcpu-1gb"  # a kernel with numpy, pandas and matplotlib loaded takes ~150 MB


@pytest.fixture(scope="session")
def code_interpreter_image() -> Path:
    return ImageStore(image_cache()).build(ROOTFS)  # cached after the first build (~75 s)


@pytest.fixture(scope="module")
def api_key(code_interpreter_image: Path, live: LivePlatform) -> str:
    return live.api_key()


@pytest.fixture(scope="module")
def sandbox(live: LivePlatform, api_key: str) -> Iterator[paddock.Sandbox]:
    with paddock.Client(live.url, api_key) as client, client.sandboxes.create(SHAPE, rootfs=ROOTFS) as sb:
        yield sb


def test_the_image_holds_everything_its_description_names(sandbox: paddock.Sandbox) -> None:
    """``GET /v1/rootfs`` describes code-interpreter:1 by these contents: each one's probe must pass."""
    image = ROOT_IMAGES_BY_NAME[ROOTFS]
    missing = {}
    for content in image.contents:
        assert content.label in image.description
        probe = sandbox.run("sh", ["-c", content.probe])
        if probe.exit_code != 0:
            missing[content.label] = (probe.stdout + probe.stderr)[-300:]
    assert not missing, missing


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.endswith(b"IEND\xaeB`\x82")
    return width, height


def test_a_variable_set_in_one_call_is_read_in_the_next(sandbox: paddock.Sandbox) -> None:
    first = sandbox.run_code("x = 41\nprint('set')", context="state")
    assert first.ok and first.stdout == "set\n" and first.kernel_started
    second = sandbox.run_code("x + 1", context="state")
    assert second.ok and second.text == "42" and not second.kernel_started
    assert second.execution_count == first.execution_count + 1  # type: ignore[operator]


def test_a_matplotlib_plot_returns_a_decodable_png(sandbox: paddock.Sandbox) -> None:
    execution = sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.title('squares')\nplt.show()",
        context="charts",
    )
    assert execution.ok, execution.error
    images = [result.png for result in execution.results if result.png is not None]
    assert len(images) == 1
    width, height = png_size(images[0])
    assert width > 100 and height > 100


def test_a_dataframe_returns_html_and_text(sandbox: paddock.Sandbox) -> None:
    execution = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})", context="charts")
    assert execution.ok, execution.error
    [main] = [result for result in execution.results if result.is_main_result]
    assert "<table" in (main.html or "") and "a" in (main.text or "")
    assert {"text/plain", "text/html"} <= set(main.formats)


def test_an_exception_returns_its_name_value_and_traceback(sandbox: paddock.Sandbox) -> None:
    execution = sandbox.run_code("def f():\n    return 1 / 0\nf()", context="errors")
    assert execution.error is not None and not execution.ok
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "return 1 / 0" in execution.error.traceback_text
    assert "\x1b[" not in execution.error.traceback_text  # no terminal colours for a model to read
    assert sandbox.run_code("print('still here')", context="errors").stdout == "still here\n"


def test_a_timeout_interrupts_the_cell_and_the_next_call_still_works(sandbox: paddock.Sandbox) -> None:
    sandbox.run_code("kept = 'yes'", context="loop")
    started = time.monotonic()
    execution = sandbox.run_code("while True:\n    pass", context="loop", timeout_s=2)
    elapsed_s = time.monotonic() - started
    assert execution.timed_out and not execution.kernel_restarted
    assert execution.error is not None and execution.error.name == "TimeoutError"
    assert "KeyboardInterrupt" in execution.error.traceback_text
    assert 2 <= elapsed_s < 10, elapsed_s
    after = sandbox.run_code("kept", context="loop")
    assert after.ok and after.text == "'yes'" and not after.kernel_started
    assert sandbox.refresh().status == "running"


def test_a_kernel_that_dies_under_a_cell_ends_the_call_and_the_next_starts_afresh(
    sandbox: paddock.Sandbox,
) -> None:
    """A kernel killed under its cell (here by the cell itself, as the out-of-memory killer would) answers
    nothing: the call waited out its timeout, an hour by default."""
    sandbox.run_code("kept = 'yes'", context="doomed")
    started = time.monotonic()
    execution = sandbox.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", context="doomed")
    elapsed_s = time.monotonic() - started
    assert elapsed_s < 15, elapsed_s
    assert execution.error is not None and execution.error.name == "DeadKernelError", execution
    assert "status -9" in execution.error.value and execution.kernel_restarted and not execution.timed_out
    after = sandbox.run_code("'kept' in globals()", context="doomed")
    assert after.ok and after.text == "False" and after.kernel_started


def test_two_contexts_do_not_share_state(sandbox: paddock.Sandbox) -> None:
    sandbox.run_code("secret = 1", context="ctx-a")
    other = sandbox.run_code("secret", context="ctx-b")
    assert other.error is not None and other.error.name == "NameError"
    assert sandbox.run_code("secret", context="ctx-a").text == "1"


def test_output_arrives_while_the_cell_runs(sandbox: paddock.Sandbox) -> None:
    arrivals: list[tuple[str, str, float]] = []
    started = time.monotonic()
    execution = sandbox.run_code(
        "import sys, time\nprint('first', flush=True)\nprint('warn', file=sys.stderr, flush=True)\n"
        "time.sleep(1.5)\nprint('last')",
        context="stream",
        on_stdout=lambda text: arrivals.append(("out", text, time.monotonic() - started)),
        on_stderr=lambda text: arrivals.append(("err", text, time.monotonic() - started)),
    )
    finished_s = time.monotonic() - started
    assert (execution.stdout, execution.stderr) == ("first\nlast\n", "warn\n")
    assert [(kind, text) for kind, text, _ in arrivals] == [
        ("out", "first\n"),
        ("err", "warn\n"),
        ("out", "last\n"),
    ]
    assert finished_s - arrivals[0][2] >= 1.0  # 'first' came a whole sleep before the call returned


def test_envs_hold_for_their_cell_alone(sandbox: paddock.Sandbox, live: LivePlatform, api_key: str) -> None:
    """``envs`` are the cell's: its ``os.environ`` and the processes it starts see them, whatever the cell
    does (an error too), and the next cell finds the kernel's own values again. They are secrets: the
    audit trail, which records each command's arguments, has the driver's call and not them."""
    sandbox.run_code("import os, subprocess\nos.environ['KEPT'] = 'kernel'", context="envs")
    cell = "print(os.environ['GREETING'], os.environ['KEPT'], subprocess.run(['printenv', 'GREETING'],"
    cell += " capture_output=True, text=True).stdout.strip())"
    seen = sandbox.run_code(cell, context="envs", envs={"GREETING": "hi 'there'\nline two", "KEPT": "cell"})
    assert seen.ok and seen.stdout == "hi 'there'\nline two cell hi 'there'\nline two\n", seen
    after = sandbox.run_code("os.environ.get('GREETING'), os.environ['KEPT']", context="envs")
    assert after.text == "(None, 'kernel')", after
    failed = sandbox.run_code("1 / 0", context="envs", envs={"GREETING": "again"})
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    after_error = sandbox.run_code(
        "os.environ.get('GREETING'), '_paddock_saved_env' in globals()", context="envs"
    )
    assert after_error.text == "(None, False)", "put back after a cell that raised, and nothing left behind"
    assert after_error.execution_count == after.execution_count + 2, "the silent cells count no execution"
    with live.http(api_key) as http:
        trail = http.get(f"/v1/sandboxes/{sandbox.id}/audit", params={"kind": "command", "format": "jsonl"})
    assert trail.status_code == 200 and "paddock-code-" in trail.text, trail.text[-2000:]
    assert "there" not in trail.text and "again" not in trail.text, "an env value in the audit trail"


def test_bad_arguments_are_refused_before_any_request(sandbox: paddock.Sandbox) -> None:
    with pytest.raises(ValueError, match="language 'r'"):
        sandbox.run_code("1", language="r")
    with pytest.raises(ValueError, match="context"):
        sandbox.run_code("1", context="../etc")
    with pytest.raises(ValueError, match="envs"):
        sandbox.run_code("1", envs={"NOT-A-NAME": "x"})
    with pytest.raises(ValueError, match="envs"):
        sandbox.run_code("1", envs={"NUL": "a\0b"})


def test_an_image_without_a_kernel_is_a_clear_error(live: LivePlatform, api_key: str) -> None:
    with (
        paddock.Client(live.url, api_key) as client,
        client.sandboxes.create("s-1vcpu-256mb") as sb,
        pytest.raises(paddock.CodeInterpreterError, match="code-interpreter:1"),
    ):
        sb.run_code("1 + 1")  # debian:13 has no python3


def test_an_image_with_python_but_no_kernel_says_so(live: LivePlatform, api_key: str) -> None:
    ImageStore(image_cache()).build("devbox:1")  # python3 without ipykernel; cached by make images
    with (
        paddock.Client(live.url, api_key) as client,
        client.sandboxes.create(SHAPE, rootfs="devbox:1") as sb,
        pytest.raises(paddock.CodeInterpreterError, match="no Jupyter kernel") as refused,
    ):
        sb.run_code("1 + 1")
    assert "code-interpreter:1" in str(refused.value)


async def test_the_async_client_runs_contexts_side_by_side(live: LivePlatform, api_key: str) -> None:
    async with (
        paddock.AsyncClient(live.url, api_key) as client,
        await client.sandboxes.create(SHAPE, rootfs=ROOTFS) as sb,
    ):
        one, two = await asyncio.gather(
            sb.run_code("import os\nvalue = 'one'\nvalue", context="one"),
            sb.run_code("value = 'two'\nvalue", context="two"),
        )
        assert (one.text, two.text) == ("'one'", "'two'")
        assert (await sb.run_code("value", context="one")).text == "'one'"


def test_the_cli_runs_a_file_as_a_cell(
    live: LivePlatform, api_key: str, sandbox: paddock.Sandbox, tmp_path: Path
) -> None:
    script = tmp_path / "plot.py"
    script.write_text(
        "import matplotlib.pyplot as plt\nprint('plotting')\nplt.plot([3, 1, 2])\nplt.show()\ntotal = 40 + 2\ntotal"
    )
    env = {**os.environ, "PADDOCK_BASE_URL": live.url, "PADDOCK_API_KEY": api_key}

    def run_code(*args: str, cell: str | None = None) -> subprocess.CompletedProcess[str]:
        """``paddock sandbox run-code <sandbox> ARGS``, the cell on stdin when given."""
        return subprocess.run(
            [sys.executable, "-m", "paddock_cli.main", "sandbox", "run-code", sandbox.id, *args],
            input=cell,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    ran = run_code(str(script), "--context", "cli", "--images", str(tmp_path / "out"))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "plotting\n42\n"
    with_env = run_code(
        "-", "--context", "cli", "-e", "GREETING=hi there", cell="import os\nos.environ['GREETING']"
    )
    assert (with_env.returncode, with_env.stdout) == (0, "'hi there'\n"), with_env.stderr
    bad_env = run_code("-", "-e", "NOT-A-NAME=x", cell="1")
    assert bad_env.returncode == 2 and "envs" in bad_env.stderr and "Traceback" not in bad_env.stderr, bad_env
    [image] = (tmp_path / "out").glob("*.png")
    assert png_size(image.read_bytes())[0] > 100
    again = run_code("-", "--context", "cli", cell="total / 0")
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.rstrip().endswith("ZeroDivisionError: division by zero"), again.stderr


def test_a_pause_keeps_the_kernel_and_a_fork_starts_its_own(sandbox: paddock.Sandbox) -> None:
    """A pause freezes the sandbox's processes, so the kernel and its variables survive it. A fork
    copies the disk, not the processes: its first cell says its kernel is new (the parent's kernel
    files copied with the disk are recognised as stale), and the parent is untouched."""
    sandbox.run_code("before_pause = 1", context="paused")
    sandbox.pause()
    sandbox.resume()
    after = sandbox.run_code("before_pause", context="paused")
    assert after.ok and after.text == "1" and not after.kernel_started
    with sandbox.fork() as child:
        forked = child.run_code("'before_pause' in dir()", context="paused")
        assert forked.ok, forked.error
        assert forked.kernel_started and forked.text == "False"
    assert sandbox.run_code("before_pause + 1", context="paused").text == "2"


def test_the_docs_example_runs_as_written(live: LivePlatform, api_key: str, tmp_path: Path) -> None:
    """docs/code-interpreter.md's example, run as written (env supplies URL and key)."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "code-interpreter.md"
    [example] = re.findall(r"^```python\n(.*?)^```", docs.read_text(), flags=re.S | re.M)
    env = {**os.environ, "PADDOCK_BASE_URL": live.url, "PADDOCK_API_KEY": api_key}
    ran = subprocess.run(
        [sys.executable, "-c", example], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert (
        lines[0] == "14"
        and lines[1].startswith("AttributeError ")
        and lines[2:] == ["True TimeoutError", "3"]
    )
    assert png_size((tmp_path / "chart.png").read_bytes())[0] > 100
