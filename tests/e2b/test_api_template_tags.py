"""E2B's template tags through the unmodified ``e2b`` SDK configured only by the three variables: a
template built with ``tags=["v1"]`` gets that tag, ``Template.assign_tags("n:v1", "stable")`` points
``stable`` at the same build, ``Template.get_tags`` lists both with that build's id,
``Sandbox.create("n:stable")`` boots the build (its COPY and RUN files are there), and after
``Template.remove_tags("n", "stable")`` that create is a missing template. A target that names no build,
a bad tag and a ``team/`` namespace are refused naming their field; a ``/v1`` template (no tags) boots
as ``name:default``. Before, ``tags`` were a 501 and ``name:default`` of a template a 404."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from e2b import Sandbox, SandboxException, Template, TemplateException
from tests.e2b.conftest import E2bPlatform, wait_template_ready

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def test_tags_name_a_build_and_boot_it(e2b_env: E2bPlatform, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("tagged build\n")
    name = f"e2b-ttag-{secrets.token_hex(3)}"
    template = (
        Template(file_context_path=str(tmp_path))
        .from_base_image()
        .copy("hello.txt", "/srv/hello.txt")
        .run_cmd("cp /srv/hello.txt /srv/again.txt")
    )
    try:
        built = Template.build(template, name, tags=["v1"])
        assert built.tags == ["v1"]

        assigned = Template.assign_tags(f"{name}:v1", "stable")
        assert assigned.tags == ["stable"] and assigned.build_id == built.build_id
        listed = {tag.tag: tag.build_id for tag in Template.get_tags(name)}
        assert listed == {"v1": built.build_id, "stable": built.build_id}

        booted = Sandbox.create(f"{name}:stable", timeout=120)
        try:
            assert booted.get_info().template_id == f"{name}:stable"
            assert booted.files.read("/srv/again.txt") == "tagged build\n"
        finally:
            booted.kill()

        Template.remove_tags(name, "stable")
        assert [tag.tag for tag in Template.get_tags(name)] == ["v1"]
        with pytest.raises(SandboxException, match=f"{name}:stable") as missing:
            Sandbox.create(f"{name}:stable", timeout=60)
        assert _status(missing.value) == 404

        with pytest.raises(TemplateException, match="target") as no_build:
            Template.assign_tags(f"{name}:stable", "again")
        assert "404" in str(no_build.value)
        for target, tags, field in (
            (f"{name}:v1", ["not a tag"], "tags"),
            (f"team/{name}:v1", ["x"], "target"),
            (f"{name}:", ["x"], "target"),
        ):
            with pytest.raises(TemplateException, match=field) as refused:
                Template.assign_tags(target, tags)
            assert "400" in str(refused.value), (target, refused.value)
        with pytest.raises(TemplateException, match="tags") as gone:
            Template.remove_tags(name, "stable")
        assert "404" in str(gone.value)
    finally:
        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
            http.delete(f"/templates/{name}")
            assert http.get(f"/templates/{name}/tags").status_code == 404  # its tags went with it


def test_a_v1_template_boots_as_its_default_tag(e2b_env: E2bPlatform) -> None:
    """A template made through ``/v1`` has no tags; ``name:default`` is ``name``, as on E2B."""
    name = f"v1-ttag-{secrets.token_hex(3)}"
    dockerfile = "FROM debian:13\nRUN echo made-through-v1 > /srv/v1.txt\n"
    with e2b_env.platform.http(e2b_env.api_key) as http:
        created = http.post("/v1/templates", json={"name": name, "dockerfile": dockerfile})
        assert created.status_code == 200, created.text
        template_id = created.json()["data"]["id"]
        try:
            wait_template_ready(http, template_id)
            assert Template.get_tags(name) == []
            booted = Sandbox.create(f"{name}:default", timeout=120)
            try:
                assert booted.files.read("/srv/v1.txt") == "made-through-v1\n"
            finally:
                booted.kill()
        finally:
            http.delete(f"/v1/templates/{template_id}")
