"""The unmodified ``e2b-code-interpreter`` SDK (sync and async) on Paddock's interpreter through the
edge's port 49999, configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY: state kept between
cells, streamed stdout, an error, a PNG chart, contexts (create, list, restart, remove), a cell's envs. Every test fails
on the code before the edge (nothing listened on E2B_SANDBOX_URL)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b_code_interpreter import AsyncSandbox, Sandbox

from paddock_hostagent.images import ImageStore
from tests.e2b.conftest import E2bPlatform
from tests.hostagent.conftest import image_cache

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def code_interpreter_image() -> Path:
    return ImageStore(image_cache()).build("code-interpreter:1")  # cached after the first build


@pytest.fixture(scope="module")
def sandbox(code_interpreter_image: Path, e2b_env: E2bPlatform) -> Iterator[Sandbox]:
    made = Sandbox.create(timeout=600)  # the SDK's default template: code-interpreter-v1
    try:
        yield made
    finally:
        made.kill()


def test_state_output_error_and_chart(sandbox: Sandbox) -> None:
    printed: list[str] = []
    first = sandbox.run_code(
        "import math\nx = 6 * 7\nprint('hello', x)", on_stdout=lambda m: printed.append(m.line)
    )
    assert first.error is None
    assert first.logs.stdout == ["hello 42\n"]
    assert printed == ["hello 42\n"]
    assert sandbox.run_code("x + 1").text == "43"  # x is still there
    assert sandbox.run_code("x").execution_count is not None

    failed = sandbox.run_code("1 / 0")
    assert failed.error is not None
    assert failed.error.name == "ZeroDivisionError"
    assert "division by zero" in failed.error.value
    assert "ZeroDivisionError" in failed.error.traceback
    assert sandbox.run_code("x").text == "42"  # the kernel lives on

    chart = sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()"
    )
    assert chart.error is None
    pngs = [r.png for r in chart.results if r.png]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")

    html = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert html.results[0].is_main_result and "<table" in (html.results[0].html or "")


def test_contexts(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context(cwd="/tmp")
    sandbox.run_code("y = 'mine'", context=ctx)
    assert sandbox.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
    assert sandbox.run_code("y", context=ctx).text == "'mine'"
    assert sandbox.run_code("'y' in globals()").text == "False"  # contexts are separate kernels
    assert ctx.id in {c.id for c in sandbox.list_code_contexts()}

    sandbox.restart_code_context(ctx)
    assert sandbox.run_code("'y' in globals()", context=ctx).text == "False"  # a fresh kernel
    assert sandbox.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"  # its cwd kept
    sandbox.remove_code_context(ctx)
    assert ctx.id not in {c.id for c in sandbox.list_code_contexts()}


def test_envs_hold_for_their_cell_alone(sandbox: Sandbox, e2b_env: E2bPlatform) -> None:
    """``run_code(..., envs=)`` (the wire's ``env_vars``): the cell and what it starts see them, the next
    cell does not, and the audit trail does not hold them. Before, a 400."""
    shown = sandbox.run_code(
        "import os, subprocess\nprint(os.environ['TOKEN'], subprocess.check_output(['printenv', 'TOKEN']).decode())",
        envs={"TOKEN": "s3cret"},
    )
    assert shown.error is None and shown.logs.stdout == ["s3cret s3cret\n\n"], shown
    assert sandbox.run_code("'TOKEN' in os.environ").text == "False"
    with pytest.raises(Exception, match="env_vars"):
        sandbox.run_code("1", envs={"1BAD": "x"})
    with e2b_env.platform.http(e2b_env.api_key) as native:
        trail = native.get(f"/v1/sandboxes/{sandbox.sandbox_id}/audit", params={"format": "jsonl"})
    assert trail.status_code == 200 and "s3cret" not in trail.text, trail.text[-2000:]
    # The cells are in it, each under the sandbox's access token (the refused one a 400).
    cells = [event for line in trail.text.splitlines() if (event := json.loads(line))["kind"] == "api"]
    cells = [event for event in cells if event["route"] == "/execute"]
    assert {(event["status"], event["actor"]) for event in cells} == {(200, "envd"), (400, "envd")}, cells


def test_async_sdk(code_interpreter_image: Path, e2b_env: E2bPlatform) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(timeout=300)
        try:
            await sandbox.run_code("z = [1, 2, 3]")
            assert (await sandbox.run_code("sum(z)")).text == "6"
            out = await sandbox.commands.run("echo from-envd")
            assert out.stdout == "from-envd\n"
            await sandbox.files.write("/tmp/data.csv", "a,b\n1,2\n")
            frame = await sandbox.run_code("import pandas as pd\nint(pd.read_csv('/tmp/data.csv').b[0])")
            assert frame.text == "2"
        finally:
            await sandbox.kill()

    asyncio.run(main())
