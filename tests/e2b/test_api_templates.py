"""E2B's build system v2 through the unmodified SDK (``Template.build``): a template with a COPY step
(its files uploaded to the URL the API hands out, which authorises itself), an ENV and a RUN is built
on Paddock's template builds, its logs arrive, and ``Sandbox.create(<name>)`` boots it with the file and
the variable in place (read through Paddock's own exec). Fails on the old code: nothing listened."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import httpx
import pytest

from e2b import Sandbox, SandboxException, Template
from tests.e2b.conftest import E2bPlatform

pytestmark = [pytest.mark.root, pytest.mark.slow]


def run(env: E2bPlatform, sandbox_id: str, script: str) -> dict[str, object]:
    with env.platform.http(env.api_key) as http:
        answer = http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "sh", "args": ["-c", script]})
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["data"]["result"])


def test_a_template_with_a_copy_step_builds_and_boots(e2b_env: E2bPlatform, tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "hello.txt").write_text("copied by the E2B SDK\n")
    name = f"e2b-copy-{secrets.token_hex(3)}"
    template = (
        Template(file_context_path=str(tmp_path))
        .from_base_image()
        .copy("app/hello.txt", "/srv/hello.txt")
        .set_envs({"GREETING": "hi from e2b"})
        .run_cmd("cp /srv/hello.txt /srv/again.txt")
    )
    logs: list[str] = []
    Template.build(template, name, on_build_logs=lambda entry: logs.append(entry.message))
    assert any("RUN" in line or "again.txt" in line or "COPY" in line for line in logs), logs

    sandbox = Sandbox.create(name)
    try:
        assert sandbox.get_info().template_id == name
        out = run(e2b_env, sandbox.sandbox_id, 'cat /srv/hello.txt /srv/again.txt; echo "$GREETING"')
        assert out["exit_code"] == 0, out
        assert out["stdout"] == "copied by the E2B SDK\ncopied by the E2B SDK\nhi from e2b\n"
    finally:
        sandbox.kill()
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
        assert http.delete(f"/templates/{name}").status_code == 204
        assert http.get(f"/templates/aliases/{name}").status_code == 404


def test_the_sdks_debian_image_builds_on_debian_13(e2b_env: E2bPlatform) -> None:
    """``from_debian_image()`` (``debian:stable``, Debian 13 today) builds over the catalog's debian:13."""
    name = f"e2b-debian-{secrets.token_hex(3)}"
    Template.build(Template().from_debian_image().run_cmd("echo built > /srv/built.txt"), name)
    sandbox = Sandbox.create(name)
    try:
        out = run(e2b_env, sandbox.sandbox_id, "cat /srv/built.txt /etc/debian_version")
        assert out["exit_code"] == 0, out
        built, version = str(out["stdout"]).split()
        assert built == "built" and version.split(".")[0] == "13", out
    finally:
        sandbox.kill()


def test_the_upload_url_authorises_only_itself(e2b_env: E2bPlatform) -> None:
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
        files_hash = "ab" * 32
        link = http.get(f"/templates/anything/files/{files_hash}").json()
        assert link["present"] is False
        url = link["url"]
        forged = url.replace(files_hash, "cd" * 32)
        assert httpx.put(forged, content=b"x").status_code == 403
        assert httpx.put(url + "0", content=b"x").status_code == 403
        assert httpx.put(url, content=b"not even a tar").status_code == 201  # no key sent: the URL is it
        assert httpx.put(url.partition("?")[0], content=b"x").status_code == 403
        mac = url.rpartition(".")[2]
        assert (
            len(mac) == 64 and mac not in e2b_env.platform.controlplane.log_path.read_text()
        )  # a credential
        assert http.get(f"/templates/anything/files/{files_hash}").json()["present"] is True
        other_key = e2b_env.platform.api_key()
        other = http.get(f"/templates/anything/files/{files_hash}", headers={"X-API-Key": other_key}).json()
        assert other["present"] is False  # another account's uploads are its own
        bad = http.get("/templates/anything/files/not-a-hash")
        assert bad.status_code == 400 and "hash" in bad.json()["message"]
    # The URL is a credential: the request log (written after each answer, so checked last) leaves it out.
    mac = url.rpartition(".")[2]
    log = e2b_env.platform.controlplane.log_path.read_text()
    assert len(mac) == 64 and "/e2b-uploads" in log and mac not in log


def test_a_templates_cpu_and_memory_are_its_sandboxes(e2b_env: E2bPlatform) -> None:
    """``Template.build(…, cpu_count=, memory_mb=)``: its sandboxes boot with the smallest shape that
    holds both, and the catalog shows it; they booted with the API's 2 CPUs and 2 GiB before."""
    name = f"e2b-sized-{secrets.token_hex(3)}"
    Template.build(Template().from_debian_image(), name, cpu_count=4, memory_mb=4096)
    try:
        sandbox = Sandbox.create(name, timeout=60)
        try:
            info = sandbox.get_info()
            assert (info.cpu_count, info.memory_mb) == (4, 4096)
            with e2b_env.platform.http(e2b_env.api_key) as native:
                shown = native.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]
            assert (shown["shape"], shown["vcpu"], shown["mem_mib"]) == ("s-4vcpu-4gb", 4, 4096)
        finally:
            sandbox.kill()
        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
            listed = [t for t in http.get("/templates").json() if t["templateID"] == name]
            assert [(t["cpuCount"], t["memoryMB"]) for t in listed] == [(4, 4096)]
            refused = http.post("/v3/templates", json={"name": name, "cpuCount": 9})
            assert refused.status_code == 400 and "cpuCount" in refused.json()["message"], refused.text
    finally:
        httpx.delete(f"{e2b_env.api_url}/templates/{name}", headers={"X-API-Key": e2b_env.api_key})


def test_a_resizable_template_boots_with_the_cpus_a_create_asks(e2b_env: E2bPlatform) -> None:
    """SDK 2.64: ``Template.build(…, max_cpu_count=4)`` makes the template resizable, and
    ``Sandbox.create(name, cpu_count=N)`` boots it with N CPUs from 1 to 4 (3 rounds up to the shape
    holding it, 4) and the template's memory; without ``cpu_count`` its own. A fixed-size template (E2B's
    ``base``) takes only its own number, and anything else is a 400 naming ``cpuCount`` with nothing
    made. ``Template.list`` shows ``max_cpu_count``, and ``Template.delete`` removes the template. Before,
    ``cpu_count`` was ignored (every create got the template's CPUs) and ``maxCpuCount`` dropped."""
    name = f"e2b-resize-{secrets.token_hex(3)}"
    Template.build(Template().from_debian_image(), name, cpu_count=1, memory_mb=1024, max_cpu_count=4)
    deleted = False
    try:
        with e2b_env.platform.http(e2b_env.api_key) as native:
            for asked, shape in (
                (None, "s-1vcpu-1gb"),
                (4, "s-4vcpu-4gb"),
                (3, "s-4vcpu-4gb"),
                (2, "s-2vcpu-2gb"),
            ):
                sandbox = Sandbox.create(name, timeout=60, cpu_count=asked)
                try:
                    shown = native.get(f"/v1/sandboxes/{sandbox.sandbox_id}").json()["data"]
                    assert shown["shape"] == shape, (asked, shown["shape"])
                    assert sandbox.get_info().cpu_count == shown["vcpu"]
                finally:
                    sandbox.kill()
            marked = {"refused": name}  # what a sandbox a refused create made would carry
            for template, asked, says in (
                (name, 5, "maxCpuCount (4)"),
                (name, 0, "between 1"),
                ("base", 4, "not resizable"),
            ):
                with pytest.raises(SandboxException, match=f"400: cpuCount: .*{re.escape(says)}"):
                    Sandbox.create(template, timeout=60, cpu_count=asked, metadata=marked)
            made = native.get("/v1/sandboxes", params={"metadata.refused": name})
            assert made.status_code == 200 and made.json()["data"]["data"] == [], made.text
        base = Sandbox.create("base", timeout=60, cpu_count=2)  # its own number is fine
        base.kill()

        listed = Template.list()
        templates = []
        while listed.has_next:
            templates.extend(listed.next_items())
        (mine,) = [template for template in templates if template.template_id == name]
        assert (mine.cpu_count, mine.memory_mb, mine.max_cpu_count) == (1, 1024, 4)

        with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}) as http:
            for body in ({"cpuCount": 4, "maxCpuCount": 2}, {"maxCpuCount": 9}, {"maxCpuCount": "4"}):
                answer = http.post("/v3/templates", json={"name": f"{name}-x", **body})
                assert answer.status_code == 400 and "maxCpuCount" in answer.json()["message"], answer.text
        assert Template.delete(name) is True
        deleted = True
        assert Template.delete(name) is False
        with pytest.raises(SandboxException, match=f"404: template '{name}' not found"):
            Sandbox.create(name, timeout=60)
    finally:
        if not deleted:
            httpx.delete(f"{e2b_env.api_url}/templates/{name}", headers={"X-API-Key": e2b_env.api_key})
