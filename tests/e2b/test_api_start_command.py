"""E2B's template start and ready commands through the unmodified SDK (``set_start_cmd``,
``set_ready_cmd``, a Dockerfile's ``CMD`` under ``from_dockerfile``): a sandbox of such a template
answers its create with the start command running and ready, under the template's ENV and WORKDIR; a
child template inherits its parent's; a Dockerfile's ``CMD`` runs as E2B's account, which the build
makes; a start command that fails refuses the create with its output and leaves no sandbox. Before, each of these builds was a 501 (``startCmd``)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from e2b import Sandbox, SandboxException, Template, wait_for_file, wait_for_port
from tests.e2b.conftest import E2bPlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]


@dataclass(frozen=True)
class Built:
    web: str  # serves /srv/www on port 8000 from its start command
    child: str  # from_template(web), with a page of its own and no commands
    broken: str  # a start command that exits 3


@pytest.fixture(scope="module")
def built(e2b_env: E2bPlatform) -> Iterator[Built]:
    suffix = secrets.token_hex(3)
    names = Built(f"e2b-start-{suffix}", f"e2b-start-child-{suffix}", f"e2b-start-broken-{suffix}")
    try:
        Template.build(
            Template()
            .from_base_image()
            .run_cmd("mkdir -p /srv/www && echo served > /srv/www/index.html")
            .set_envs({"GREETING": "hello from the template"})
            .set_workdir("/srv/www")
            .set_start_cmd(
                'echo "$GREETING in $PWD as $(id -un)" > /tmp/started.txt && exec python3 -m http.server 8000',
                wait_for_port(8000),
            ),
            names.web,
        )
        Template.build(
            Template().from_template(names.web).run_cmd("echo child > /srv/www/child.html"), names.child
        )
        Template.build(
            Template()
            .from_debian_image()
            .set_start_cmd("echo the start went wrong >&2; exit 3", wait_for_file("/tmp/never")),
            names.broken,
        )
        yield names
    finally:
        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
            for name in (names.child, names.web, names.broken):
                http.delete(f"/templates/{name}")


def first_output(template: str, command: str) -> str:
    """What ``command`` prints as the first command in a new sandbox of ``template`` (killed after)."""
    sandbox = Sandbox.create(template, timeout=120)
    try:
        return sandbox.commands.run(command).stdout
    finally:
        sandbox.kill()


def test_the_start_command_is_running_and_ready_when_the_create_answers(built: Built) -> None:
    sandbox = Sandbox.create(built.web, timeout=120)
    try:
        # The first command after the create: the port the ready command waited for answers at once.
        page = sandbox.commands.run("curl -s http://127.0.0.1:8000/index.html")
        assert page.stdout == "served\n", page
        started = sandbox.files.read("/tmp/started.txt")
        assert started == "hello from the template in /srv/www as root\n"  # the template's ENV and WORKDIR
        servers = [p for p in sandbox.commands.list() if "http.server" in " ".join([p.cmd, *p.args])]
        assert len(servers) == 1, sandbox.commands.list()
        # The template's ENV and WORKDIR reach every command too, as E2B's do.
        here = sandbox.commands.run('echo "$GREETING"; pwd')
        assert here.stdout == "hello from the template\n/srv/www\n", here
    finally:
        sandbox.kill()


def test_a_child_template_runs_its_parents_start_command(built: Built) -> None:
    assert first_output(built.child, "curl -s http://127.0.0.1:8000/child.html") == "child\n"


def test_a_dockerfiles_cmd_is_the_start_command(e2b_env: E2bPlatform) -> None:
    """``from_dockerfile`` turns ``CMD`` into a start command (its ready command here: a file)."""
    name = f"e2b-start-cmd-{secrets.token_hex(3)}"
    child = f"{name}-child"
    # The file the ready command waits for appears whole (a rename): a redirection makes it empty
    # first, and under load the test read it between the two (run 54).
    dockerfile = (
        "FROM debian:13\nRUN echo built > /built.txt\n"
        'CMD ["bash", "-c", "echo $(cat /built.txt) $HOME > /tmp/cmd.part && mv /tmp/cmd.part /tmp/cmd-ran;'
        ' sleep infinity"]\n'
    )
    try:
        Template.build(
            Template().from_dockerfile(dockerfile).set_ready_cmd(wait_for_file("/tmp/cmd-ran")), name
        )
        sandbox = Sandbox.create(name, timeout=120)
        try:
            # As E2B's account, with its HOME (before 2026-12-07: /root, which it cannot write).
            assert sandbox.files.read("/tmp/cmd-ran") == "built /home/user\n"
            # from_dockerfile ends as E2B's account in its home, which the build made on debian:13.
            who = sandbox.commands.run("id -un; pwd")
            assert who.stdout == "user\n/home/user\n", who
            # The start command is listed as itself (it was listed as setpriv, which ran it as the user).
            assert [p.cmd for p in sandbox.commands.list()] == ["/bin/bash"], sandbox.commands.list()
        finally:
            sandbox.kill()
        # A child whose own step needs root (making its WORKDIR) still runs as its parent's user: it ran
        # as root before 2026-12-07.
        Template.build(Template().from_template(name).set_workdir("/srv/child"), child)
        assert first_output(child, 'id -un; pwd; echo "$HOME"') == "user\n/srv/child\n/home/user\n"
    finally:
        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
            http.delete(f"/templates/{child}")
            http.delete(f"/templates/{name}")


def test_a_start_command_that_fails_refuses_the_create_and_leaves_no_sandbox(
    built: Built, e2b_env: E2bPlatform
) -> None:
    before = {info.sandbox_id for info in Sandbox.list().next_items()}
    with pytest.raises(SandboxException) as refused:
        Sandbox.create(built.broken, timeout=120)
    message = str(refused.value)
    assert "exited with code 3" in message and "the start went wrong" in message, message
    after = Sandbox.list().next_items()
    assert {info.sandbox_id for info in after} - before == set()
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
        answer = http.post("/sandboxes", json={"templateID": built.broken})
    assert answer.status_code == 409 and "templateID" in answer.text, answer.text


def test_a_fork_starts_its_templates_command_too(built: Built) -> None:
    """A container's fork starts its processes afresh, so it runs the start command before it is
    answered, and serves the files it copied from its source."""
    source = Sandbox.create(built.web, timeout=120)
    try:
        source.files.write("/srv/www/forked.html", "copied\n")
        (child,) = source.fork(timeout=60)
        assert isinstance(child, Sandbox), child
        try:
            page = child.commands.run("curl -s http://127.0.0.1:8000/forked.html")
            assert page.stdout == "copied\n", page
        finally:
            child.kill()
    finally:
        source.kill()


def test_a_wake_from_hibernation_starts_its_templates_command_again(built: Built) -> None:
    """A filesystem pause keeps the disk, not the processes: the connect that wakes it runs the start
    command, and answers once it is ready (before 2026-12-07 nothing listened after the wake)."""
    sandbox = Sandbox.create(built.web, timeout=120)
    try:
        sandbox.files.write("/srv/www/kept.html", "kept\n")
        assert sandbox.pause(mode="filesystem") is True
        woken = Sandbox.connect(sandbox.sandbox_id, timeout=120)
        page = woken.commands.run("curl -s http://127.0.0.1:8000/kept.html")
        assert page.stdout == "kept\n", page
        servers = [p for p in woken.commands.list() if "http.server" in " ".join([p.cmd, *p.args])]
        assert len(servers) == 1, woken.commands.list()
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_a_sandbox_booted_from_a_snapshot_starts_its_templates_command(built: Built) -> None:
    """A container snapshot holds the disk, not the running server: a sandbox booted from it runs the
    template's start command before its create answers, as E2B's (which keeps the process) serves at
    once (before 2026-12-07 nothing listened)."""
    source = Sandbox.create(built.web, timeout=120)
    snapshot_id = None
    try:
        source.files.write("/srv/www/snapped.html", "snapped\n")
        snapshot_id = source.create_snapshot().snapshot_id
        assert first_output(snapshot_id, "curl -s http://127.0.0.1:8000/snapped.html") == "snapped\n"
    finally:
        source.kill()
        if snapshot_id is not None:
            Sandbox.delete_snapshot(snapshot_id)
