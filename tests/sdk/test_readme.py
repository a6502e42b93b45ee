"""The README's SDK quickstart, run as written against the real platform (env supplies URL and key)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import paddock
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_the_readme_sdk_quickstart_runs(live: LivePlatform, tmp_path: Path) -> None:
    """Both Python blocks: the fifteen-line quickstart (lifetime and labels, run_shell, files, get by
    name, a background command's callback, the ingress URL) and the longer tour (stream, pause, fork)."""
    blocks = [block for block in code_blocks("python") if "paddock.Client(" in block]
    assert len(blocks) == 2, "the README's SDK examples moved"
    quickstart, tour = blocks
    assert len(quickstart.splitlines()) <= 15
    key = live.api_key()
    env = {**os.environ, "PADDOCK_BASE_URL": live.url, "PADDOCK_API_KEY": key}

    def run(block: str) -> str:
        ran = subprocess.run(
            [sys.executable, "-c", block], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert ran.returncode == 0, ran.stderr
        return ran.stdout

    lines = run(quickstart).splitlines()
    assert lines[:7] == [
        "42",
        "",
        "['app.py', 'index.html']",
        "True {'team': 'docs'}",
        "tick",
        "tock",
        "exit 0",
    ], lines
    assert len(lines) == 8 and lines[7].startswith(("http://8000-", "https://8000-")), lines

    out = run(tour)
    assert "Linux" in out and "{'exit_code': 0}" in out and "b'hi'" in out
    assert [line for line in out.splitlines() if line.startswith("{'stdout'")] == [
        "{'stdout': '1\\n'}",
        "{'stdout': '2\\n'}",
        "{'stdout': '3\\n'}",
    ]
    with paddock.Client(live.url, key) as client:  # the context managers cleaned up
        assert {s.status for s in client.sandboxes.list()} <= {"destroying", "destroyed"}


def test_the_readme_cli_quickstart_runs(live: LivePlatform, tmp_path: Path) -> None:
    """The ``sh`` block of the CLI section under ``bash -e``; its ``export`` of a placeholder key is
    replaced by a real key in the environment."""
    blocks = [block for block in code_blocks("sh") if "paddock sandbox" in block]
    assert len(blocks) == 1, "the README's CLI example moved"
    script = "\n".join(line for line in blocks[0].splitlines() if not line.startswith("export "))
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    key = live.api_key()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_BASE_URL": live.url,
            "PADDOCK_API_KEY": key,
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        }
    )
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    assert "demo on demo\n" in ran.stdout  # the sandbox's hostname is its name
    assert (tmp_path / "copy.txt").read_text() == "remember the milk\n"
    with paddock.Client(live.url, key) as client:
        left = [s for s in client.sandboxes.list() if s.status not in ("destroying", "destroyed")]
        assert len(left) == 1 and left[0].forked_from  # only the fork is left
        for info in left:
            client.sandboxes.get(info.id).destroy()
