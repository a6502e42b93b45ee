"""E2B's default template (``base``) holds what E2B code leans on: Python with pip, Node.js with npm, and
git, so that ``commands.run("python3 …")`` and the SDK's ``sandbox.git`` work on a sandbox created with
no template, through the unmodified ``e2b`` SDK. Both tests fail when ``base`` boots ``debian:13`` (a shell
and curl only)."""

from __future__ import annotations

import pytest

from e2b import Sandbox

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_the_default_template_runs_python_node_pip_and_npm(sandbox: Sandbox) -> None:
    assert sandbox.get_info().template_id == "base"
    python = sandbox.commands.run("python3 -c 'import json, venv; print(json.dumps({\"sum\": 6 * 7}))'")
    assert python.stdout.strip() == '{"sum": 42}'
    assert (
        sandbox.commands.run("node -e 'console.log([1, 2, 3].map(n => n * 2).join())'").stdout.strip()
        == "2,4,6"
    )
    tools = sandbox.commands.run(
        "pip3 --version && npm --version && git --version"
    )  # raises on a non-zero exit
    assert "pip" in tools.stdout and "git version" in tools.stdout


def test_the_sdks_git_inits_commits_branches_and_clones(sandbox: Sandbox) -> None:
    origin, copy = "/srv/origin", "/srv/copy"
    sandbox.git.init(origin, initial_branch="main")
    sandbox.files.write(f"{origin}/README.md", "hello from the sandbox\n")
    untracked = sandbox.git.status(origin)
    assert [(f.name, f.status) for f in untracked.file_status] == [("README.md", "untracked")], untracked
    sandbox.git.add(origin)
    sandbox.git.commit(origin, "first", author_name="Ada", author_email="ada@example.com")
    clean = sandbox.git.status(origin)
    assert clean.current_branch == "main" and clean.file_status == [], clean
    sandbox.git.create_branch(origin, "feature")
    branches = sandbox.git.branches(origin)
    assert sorted(branches.branches) == ["feature", "main"] and branches.current_branch == "feature", branches

    sandbox.git.clone(origin, copy, branch="main")
    assert sandbox.files.read(f"{copy}/README.md") == "hello from the sandbox\n"
    log = sandbox.commands.run(f"git -C {copy} log --format='%an <%ae> %s'")
    assert log.stdout.strip() == "Ada <ada@example.com> first"
