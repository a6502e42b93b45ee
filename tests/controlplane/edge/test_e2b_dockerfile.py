"""The Dockerfile an E2B build's steps become (templates.dockerfile_for): E2B's account made where a step
names it, a ``RUN`` as another user switching back to the user the steps set, and the last ``WORKDIR``
made, as Docker makes it. The live suites (tests/e2b/test_api_templates.py, test_api_start_command.py)
build such templates with the unmodified SDK."""

from __future__ import annotations

from typing import Any

from paddock_controlplane.edge.e2b.templates import ENSURE_E2B_USER, BuildStart, dockerfile_for


def _lines(*steps: dict[str, Any], **fields: Any) -> list[str]:
    body = BuildStart.model_validate({"fromImage": "debian:13", "steps": list(steps), **fields})
    return dockerfile_for(body)[0].splitlines()


def test_steps_that_name_no_user_or_directory_are_written_as_they_are() -> None:
    assert _lines({"type": "RUN", "args": ["echo hi"]}, {"type": "ENV", "args": ["A", "b c"]}) == [
        "FROM debian:13",
        "RUN echo hi",
        'ENV A="b c"',
    ]


def test_e2bs_account_is_made_first_where_a_step_names_it() -> None:
    lines = _lines({"type": "RUN", "args": ["touch /x", "user"]}, {"type": "USER", "args": ["user"]})
    assert lines[:3] == ["FROM debian:13", "USER root", f"RUN {ENSURE_E2B_USER}"]
    assert lines[3:] == ["USER user", "RUN touch /x", "USER root", "USER user"]


def test_a_run_as_another_user_switches_back_to_the_user_the_steps_set() -> None:
    lines = _lines({"type": "USER", "args": ["app"]}, {"type": "RUN", "args": ["id", "root"]})
    assert lines == ["FROM debian:13", "USER app", "USER root", "RUN id", "USER app"]  # not left as root


def test_the_last_workdir_is_made_relative_ones_resolved_as_docker_does() -> None:
    lines = _lines(
        {"type": "WORKDIR", "args": ["/srv"]},
        {"type": "WORKDIR", "args": ["app"]},
        {"type": "USER", "args": ["nobody"]},
    )
    assert lines[-3:] == ["USER root", 'RUN ["mkdir", "-p", "--", "/srv/app"]', "USER nobody"]


def test_over_a_template_steps_switch_back_to_its_user_not_to_root() -> None:
    # A child of a template that runs as `user` (every from_dockerfile's): its own steps that need root
    # (E2B's account, the last WORKDIR, a RUN as root) switch back to `user`. Before, it ended as root.
    body = BuildStart.model_validate(
        {
            "fromTemplate": "web",
            "steps": [
                {"type": "RUN", "args": ["touch /x", "user"]},
                {"type": "RUN", "args": ["apt-get update", "root"]},
                {"type": "WORKDIR", "args": ["/srv"]},
            ],
        }
    )
    lines = dockerfile_for(body, base_user="user")[0].splitlines()
    assert lines[1:4] == ["USER root", f"RUN {ENSURE_E2B_USER}", "USER user"]
    assert lines[4:7] == ["RUN touch /x", "USER root", "RUN apt-get update"]
    assert lines[7:] == [
        "USER user",
        "WORKDIR /srv",
        "USER root",
        'RUN ["mkdir", "-p", "--", "/srv"]',
        "USER user",
    ]
    assert lines[-1] == "USER user"
