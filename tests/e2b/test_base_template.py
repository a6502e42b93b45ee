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


# A wheel made in the sandbox (no index is reachable from a test): one module, its metadata and RECORD.
MAKE_WHEEL = """
import base64, hashlib, zipfile
files = {
    "paddock_probe.py": b"VALUE = 42\\n",
    "paddock_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: paddock-probe\\nVersion: 1.0\\n",
    "paddock_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: hand\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
}
def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
record = "".join(f"{name},{digest(data)},{len(data)}\\n" for name, data in files.items())
record += "paddock_probe-1.0.dist-info/RECORD,,\\n"
with zipfile.ZipFile("/tmp/paddock_probe-1.0-py3-none-any.whl", "w") as wheel:
    for name, data in files.items():
        wheel.writestr(name, data)
    wheel.writestr("paddock_probe-1.0.dist-info/RECORD", record)
"""


def test_pip_installs_system_wide_as_on_e2b(sandbox: Sandbox) -> None:
    """Debian marks its Python externally managed, so a bare ``pip install`` refused there; E2B's base
    installs, and so does Paddock's (``/etc/pip.conf``), into ``/usr/local`` beside Debian's packages."""
    sandbox.files.write("/tmp/make_wheel.py", MAKE_WHEEL)
    sandbox.commands.run("python3 /tmp/make_wheel.py")
    installed = sandbox.commands.run("pip install --no-index /tmp/paddock_probe-1.0-py3-none-any.whl")
    assert "Successfully installed paddock-probe-1.0" in installed.stdout, installed
    imported = sandbox.commands.run(
        "cd / && python3 -c 'import paddock_probe; print(paddock_probe.VALUE, paddock_probe.__file__)'"
    )
    value, where = imported.stdout.split()
    assert value == "42" and where.startswith("/usr/local/lib/python3"), imported.stdout


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
