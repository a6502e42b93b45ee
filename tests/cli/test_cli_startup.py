"""``paddock`` starts without importing what the command run does not need: ``--help`` lists every
command with its help while importing none of the command modules, the SDK, httpx or SQLAlchemy, and an
admin command migrates without importing the control plane's web app. Each of those imports is time a
user waits on every command (the SDK and httpx alone were about half of ``paddock --help``)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from paddock_cli import main

#: What ``paddock --help`` listed before its commands were loaded lazily, in its order.
LISTED_BEFORE = [
    "whoami",
    "shapes",
    "rootfs",
    "hosts",  # added with it
    "metrics",  # added with it
    "mcp",
    "serve",
    "controlplane",
    "hostagent",
    "gateway",
    "sandbox",
    "network",  # added with it, lazy as the others
    "webhook",
    "disk",
    "template",
    "volume",  # added with it
    "deploy",
    "wallet-sandbox",  # added with it
    "admin",
]

#: Modules a command that does not talk to the server (or the database) must not import.
SDK_AND_SERVER = ("paddock", "httpx", "sqlalchemy", "alembic", "fastapi", "paddock_controlplane")


def paddock(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paddock_cli.main", *args],
        env={**os.environ, "COLUMNS": "1000", **(env or {})},  # one line per row: no wrapped help
        capture_output=True,
        text=True,
        timeout=120,
    )


def registered() -> dict[str, Any]:
    """Every command of ``paddock`` as it runs: the lazy ones loaded from their modules."""
    root = typer.main.get_command(main.app)
    assert isinstance(root, main.PaddockGroup)
    return {
        name: main.load(name) if isinstance(command, main.Listed) else command
        for name, command in root.commands.items()
    }


def first_paragraph(command: Any) -> str:
    """The help a command list shows for ``command``: its first paragraph, on one line."""
    text = inspect.cleandoc(command.short_help or command.help or "")
    return " ".join(text.split("\n\n")[0].split())


def rows(help_text: str) -> dict[str, str]:
    """The Commands panel of a ``--help``: name → help (a help on several lines joined into one)."""
    panel = help_text.split("─ Commands ─", 1)[1].split("╰", 1)[0]
    out: dict[str, str] = {}
    name = ""
    for line in panel.splitlines()[1:]:
        content = line.strip().strip("│")
        if content[1:2].strip():  # a name in the first column: a new row
            name, _, help_part = content.strip().partition(" ")
            out[name] = help_part
        elif content.strip():
            out[name] += " " + content
    return {name: " ".join(help_part.split()) for name, help_part in out.items()}


def test_help_lists_every_command_with_its_own_help() -> None:
    commands = registered()
    assert list(commands) == LISTED_BEFORE
    ran = paddock("--help")
    assert ran.returncode == 0, ran.stderr
    listed = rows(ran.stdout)
    assert list(listed) == LISTED_BEFORE
    for name, command in commands.items():
        assert listed[name] == first_paragraph(command), name


@pytest.mark.parametrize("group", list(main.LAZY_GROUPS))
def test_a_groups_help_lists_all_its_commands(group: str) -> None:
    """Loaded lazily, a group still has every command (``sandbox`` the ones more.py adds to it too)."""
    real = registered()[group]
    ran = paddock(group, "--help")
    assert ran.returncode == 0, ran.stderr
    listed = rows(ran.stdout)
    shown = {name: command for name, command in real.commands.items() if not command.hidden}
    assert list(listed) == list(shown)
    for name, command in shown.items():
        assert listed[name] == first_paragraph(command), name
    if group == "sandbox":
        assert {"egress", "resize", "set", "ps", "kill"} <= set(listed)


def modules_after(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    """Run ``paddock ARGV`` in a fresh interpreter; its exit code and the top-level packages it imported
    (``paddock_controlplane.app`` is reported as itself: it is the web app)."""
    script = (
        "import json, sys\n"
        "from paddock_cli.main import main\n"
        "sys.argv = ['paddock', *json.loads(sys.argv[1])]\n"
        "code = 0\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    code = exc.code or 0\n"
        "names = {m.split('.')[0] for m in sys.modules} | {m for m in sys.modules if m.endswith('.app')}\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps([code, sorted(names)]))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script, json.dumps(argv)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    code, names = json.loads(ran.stderr.rsplit("\nMODULES ", 1)[1])
    return code, set(names)


def test_importing_the_cli_imports_no_sdk_http_client_or_database() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", "import json, sys, paddock_cli.main; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    loaded = set(json.loads(ran.stdout))
    assert {m.split(".")[0] for m in loaded} & set(SDK_AND_SERVER) == set()
    # nor any command's module: each is imported when its command runs (listing is the lazy table's data)
    assert sorted(m for m in loaded if m.startswith("paddock_cli.")) == [
        "paddock_cli.listing",
        "paddock_cli.main",
        "paddock_cli.output",
    ]


@pytest.mark.parametrize("argv", [["--help"], ["admin", "--help"], ["sandbox", "ls", "--help"]])
def test_help_imports_no_sdk_http_client_or_database(argv: list[str]) -> None:
    code, names = modules_after(argv)
    assert code == 0
    assert names & set(SDK_AND_SERVER) == set()


def test_an_admin_command_loads_the_database_but_not_the_web_app(tmp_path: Path) -> None:
    """``paddock admin key list`` on a fresh database migrates it and answers, importing SQLAlchemy and
    the control plane's accounts, but not its web app (FastAPI and every route: over a second)."""
    code, names = modules_after(
        ["admin", "key", "list", "--json"],
        env={"PADDOCK_CP_DATA_DIR": str(tmp_path), "PADDOCK_CP_DATABASE_URL": ""},
    )
    assert code == 0
    assert (tmp_path / "controlplane.db").is_file()  # migrated
    assert {"sqlalchemy", "paddock_controlplane"} <= names
    assert names & {"fastapi", "paddock_controlplane.app", "httpx", "paddock"} == set()
