"""``scripts/unasync.py``: the substitutions that turn the async SDK into the sync one, and its check."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
assert _spec is not None and _spec.loader is not None
unasync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(unasync)


def test_tokens_become_their_sync_twins_and_only_whole_names_change() -> None:
    source = (
        "async def f(c: AsyncClient) -> AsyncIterator[bytes]:\n"
        "    data = (await c.get(x)).info\n"
        "    async with c: await _blocking.asleep(1)\n"
        "    async for b in resp.aiter_bytes(): yield b\n"
        "    await resp.aclose(); already_aread = str(await g(h(1)))\n"
        "from paddock._async_sandbox import AsyncSandbox\n"
    )
    assert unasync.unasync_text(source) == (
        "def f(c: Client) -> Iterator[bytes]:\n"
        "    data = c.get(x).info\n"
        "    with c: _blocking.sleep(1)\n"
        "    for b in resp.iter_bytes(): yield b\n"
        "    resp.close(); already_aread = str(g(h(1)))\n"
        "from paddock._sandbox import Sandbox\n"
    )


def test_check_fails_on_a_generated_file_edited_by_hand(tmp_path: Path) -> None:
    """--check compares against the committed files; run it on a copy of the tree with one edit."""
    copy = tmp_path / "tree"
    # what the generator and ruff read: ruff sorts imports by which first-party modules exist, and a
    # generated test may import any package of src/ or tests/
    for directory in ("src", "tests"):
        ignore = shutil.ignore_patterns("__pycache__", "node_modules")
        shutil.copytree(ROOT / directory, copy / directory, ignore=ignore)
    for relative in ("scripts/unasync.py", "pyproject.toml"):
        (copy / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, copy / relative)
    script = [sys.executable, str(copy / "scripts" / "unasync.py"), "--check"]
    assert subprocess.run(script, capture_output=True, check=False).returncode == 0

    sandbox = copy / "src" / "paddock" / "_sandbox.py"
    sandbox.write_text(sandbox.read_text().replace("def resize(", "def grow("))
    stale = subprocess.run(script, capture_output=True, text=True, check=False)
    assert stale.returncode == 1 and "src/paddock/_sandbox.py" in stale.stderr
    assert "-    def grow(" in stale.stdout and "+    def resize(" in stale.stdout
