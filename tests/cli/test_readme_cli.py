"""The README's command-line block, run as written by bash against the real platform (only the
``export PADDOCK_API_KEY=…`` line is left out: the test's environment sets the key)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_sandbox_cli import Cli
from tests.live import LivePlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"


def cli_block() -> str:
    blocks = re.findall(r"^```sh\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    [block] = [b for b in blocks if "paddock sandbox create --name demo" in b]
    return "".join(line for line in block.splitlines(keepends=True) if not line.startswith("export "))


def test_the_readme_command_line_block_runs(live: LivePlatform, tmp_path: Path) -> None:
    key = live.api_key()
    script = cli_block()
    assert "paddock network attach lab demo" in script and "paddock sandbox logs demo $job -f" in script
    (tmp_path / "notes.txt").write_text("from the README\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDOCK_")}
    env.update(
        {
            "PADDOCK_BASE_URL": live.url,
            "PADDOCK_API_KEY": key,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # the venv's paddock
        }
    )
    try:
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        out = ran.stdout
        assert "demo on " in out  # exec with the create's env
        assert (tmp_path / "copy.txt").read_text() == "from the README\n"  # cp out again
        assert "built\n" in out  # logs -f followed the background job to its end
        assert re.search(r"^net_\w+$", out, flags=re.M)  # network create printed the id
        assert re.search(r"^sb-\S+\s+demo\s+active\s+10\.\d+\.\d+\.\d+$", out, flags=re.M), out  # attach
        assert '"members": [' in out  # network get --json
    finally:
        cleanup = Cli(live.url, key)
        leftovers = cleanup.json("sandbox", "ls")
        assert isinstance(leftovers, list)
        if leftovers:
            cleanup("sandbox", "rm", "--wait", *[s["id"] for s in leftovers])  # the fork's child
        networks = cleanup.json("network", "ls")
        assert isinstance(networks, list)
        for network in networks:
            cleanup("network", "rm", network["id"])
