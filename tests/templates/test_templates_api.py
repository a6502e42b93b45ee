"""The template rules of the control plane (§11.13, §14) over real HTTP on both engines.

The host is the unit-test seam (``FakeHostLink``: an attempt ends ``ready`` at once, or ``failed`` when
its Dockerfile says FAIL); tests/templates/test_live_templates.py builds with buildah for real.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import io
import json
import tarfile
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, update

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Template, TemplateLogLine
from paddock_controlplane.resources import templates
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_controlplane.workers import template_builds
from paddock_core.db import make_engine, make_sessionmaker, transaction
from paddock_core.timeutil import utcnow
from paddock_hostagent.schemas import BuildBody, BuildLine, BuildView
from tests.controlplane.conftest import ControlPlane
from tests.controlplane.fakehost import FakeHostLink

pytestmark = pytest.mark.db

DOCKERFILE = "FROM debian:13\nENV A=1\nRUN echo hi\n"


@pytest.fixture
def cp_settings(cp_settings: ControlPlaneSettings) -> ControlPlaneSettings:
    # The webhook endpoint of test_template_actions_are_announced is on loopback (nothing listens).
    return cp_settings.model_copy(update={"webhook_allow_private_targets": True})


@pytest.fixture
async def api(controlplane: ControlPlane, fake_host: FakeHostLink) -> httpx.AsyncClient:
    _, key = await controlplane.new_user("pro")
    controlplane.http.headers["X-Api-Key"] = key
    return controlplane.http


def fail_data(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert body["status"] == "fail", body
    return dict(body["data"])


async def wait_done(api: httpx.AsyncClient, template_id: str) -> dict[str, Any]:
    for _ in range(200):
        data = (await api.get(f"/v1/templates/{template_id}")).json()["data"]
        if data["status"] in ("ready", "failed"):
            return dict(data)
        await asyncio.sleep(0.05)
    raise AssertionError(f"template {template_id} never finished: {data}")


async def test_submit_builds_to_ready_and_reads_back(api: httpx.AsyncClient, fake_host: FakeHostLink) -> None:
    resp = await api.post("/v1/templates", json={"name": "py-env", "dockerfile": DOCKERFILE})
    assert resp.status_code == 200, resp.text
    created = resp.json()["data"]
    assert created["status"] == "pending" and created["id"].startswith("tpl_")
    assert created["base"] == "debian:13" and created["ext4_size_bytes"] == 0 and "built_at" not in created
    done = await wait_done(api, created["id"])
    assert done["status"] == "ready" and done["ext4_size_bytes"] == 4096 and done["built_at"]
    assert "dockerfile" not in done
    by_name = (await api.get("/v1/templates/py-env?include=dockerfile")).json()["data"]
    assert by_name["id"] == created["id"] and by_name["dockerfile"] == DOCKERFILE
    listed = (await api.get("/v1/templates")).json()["data"]
    assert [item["id"] for item in listed["data"]] == [created["id"]] and listed["pagination"]["total"] == 1
    assert "dockerfile" not in listed["data"][0]
    text = (await api.get(f"/v1/templates/{created['id']}/logs")).text
    frames = [json.loads(line) for line in text.splitlines()]
    assert frames[-1]["final"] is True and frames[-1]["status"] == "ready" and frames[-1]["attempt"] == 1
    assert any(frame.get("line") == "STEP 1/1: attempt 1" for frame in frames)
    assert all(isinstance(frame["ts"], str) for frame in frames)


async def test_a_sandbox_boots_from_a_ready_template_by_name_or_id(api: httpx.AsyncClient) -> None:
    created = (await api.post("/v1/templates", json={"name": "tools", "dockerfile": DOCKERFILE})).json()[
        "data"
    ]
    await wait_done(api, created["id"])
    by_name = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "tools"})
    assert by_name.status_code == 200, by_name.text
    assert by_name.json()["data"]["rootfs"] == created["id"]
    by_id = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": created["id"]})
    assert by_id.status_code == 200 and by_id.json()["data"]["rootfs"] == created["id"]


async def test_a_failing_build_is_retried_then_failed_with_both_attempts_logged(
    api: httpx.AsyncClient,
) -> None:
    created = (
        await api.post("/v1/templates", json={"name": "broken", "dockerfile": "FROM debian:13\nRUN FAIL\n"})
    ).json()["data"]
    assert (await wait_done(api, created["id"]))["status"] == "failed"
    frames = [
        json.loads(line) for line in (await api.get(f"/v1/templates/{created['id']}/logs")).text.splitlines()
    ]
    assert {frame["attempt"] for frame in frames} == {1, 2}
    assert frames[-1] == {**frames[-1], "final": True, "status": "failed", "attempt": 2}
    assert any("RUN FAIL" in frame.get("line", "") for frame in frames)
    only_first = (await api.get(f"/v1/templates/{created['id']}/logs?attempt=1")).text.splitlines()
    assert {json.loads(line)["attempt"] for line in only_first} == {1}
    assert (await api.get(f"/v1/templates/{created['id']}/logs?attempt=3")).status_code == 404
    assert "attempt" in fail_data(await api.get(f"/v1/templates/{created['id']}/logs?attempt=0"))
    refused = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "broken"})
    assert refused.status_code == 409, refused.text


async def test_follow_streams_until_the_final_frame(api: httpx.AsyncClient) -> None:
    created = (await api.post("/v1/templates", json={"name": "follow", "dockerfile": DOCKERFILE})).json()[
        "data"
    ]
    async with api.stream("GET", f"/v1/templates/{created['id']}/logs?follow=true") as resp:
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        frames = [json.loads(line) async for line in resp.aiter_lines() if line.strip()]
    assert frames[-1]["final"] is True and frames[-1]["status"] == "ready"
    assert len(frames) >= 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"dockerfile": DOCKERFILE}, "name"),
        ({"name": "a:b", "dockerfile": DOCKERFILE}, "name"),
        ({"name": "x"}, "dockerfile"),
        ({"name": "x", "dockerfile": "RUN echo no from\n"}, "dockerfile"),
        ({"name": "x", "dockerfile": "FROM debian:13\nFROM debian:13\n"}, "dockerfile"),
        ({"name": "x", "dockerfile": "FROM debian:13\nCOPY . /app\n"}, "dockerfile"),
        ({"name": "x", "dockerfile": DOCKERFILE, "context": 7}, "context"),
        ({"name": "x", "dockerfile": "FROM debian:13\nFROBNICATE yes\n"}, "dockerfile"),
        ({"name": "x", "dockerfile": 'FROM debian:13\nCMD ["unterminated\n'}, "dockerfile"),
        ({"name": "x", "dockerfile": "FROM ubuntu:22.04\nRUN true\n"}, "dockerfile"),
        ({"name": "x", "dockerfile": "FROM someone-elses\nRUN true\n"}, "dockerfile"),
        ({"name": "x", "dockerfile": "FROM debian:13\n" + "RUN true\n" * 10000}, "dockerfile"),
        ({"name": "x", "dockerfile": DOCKERFILE, "base": "nope:1"}, "base"),
    ],
)
async def test_bad_input_is_400_naming_the_field_and_records_nothing(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    resp = await api.post("/v1/templates", json=body)
    assert resp.status_code == 400, resp.text
    data = fail_data(resp)
    assert data["code"] == "VALIDATION_FAILED" and field in data, data
    assert (await api.get("/v1/templates")).json()["data"]["pagination"]["total"] == 0


async def test_duplicate_name_is_409_and_a_deleted_name_is_free_again(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    first = (await api.post("/v1/templates", json={"name": "dup", "dockerfile": DOCKERFILE})).json()["data"]
    again = await api.post("/v1/templates", json={"name": "dup", "dockerfile": DOCKERFILE})
    assert again.status_code == 409 and "name" in fail_data(again)["message"]
    await wait_done(api, first["id"])
    assert (await api.delete(f"/v1/templates/{first['id']}")).json()["data"] == {"ok": True}
    assert ("delete_build", first["id"]) in fake_host.calls
    assert (await api.get(f"/v1/templates/{first['id']}")).status_code == 404
    assert (
        await api.post("/v1/templates", json={"name": "dup", "dockerfile": DOCKERFILE})
    ).status_code == 200


async def test_a_template_is_rebuilt_under_its_name_and_the_old_image_boots_until_the_new_is_ready(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    async def boots(ref: str) -> str:
        resp = await api.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": ref})
        assert resp.status_code == 200, resp.text
        return str(resp.json()["data"]["rootfs"])

    async def rebuild(dockerfile: str) -> httpx.Response:
        return await api.post(
            "/v1/templates", json={"name": "app", "dockerfile": dockerfile, "rebuild": True}
        )

    async def wait_building(template_id: str) -> None:
        for _ in range(200):
            if fake_host.builds.get(template_id) is not None:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{template_id} never started building")

    first = (await api.post("/v1/templates", json={"name": "app", "dockerfile": DOCKERFILE})).json()["data"]
    await wait_done(api, first["id"])
    plain = await api.post("/v1/templates", json={"name": "app", "dockerfile": DOCKERFILE})
    assert plain.status_code == 409 and "rebuild: true" in fail_data(plain)["message"]

    resp = await rebuild("FROM debian:13\nRUN HOLD\n")
    assert resp.status_code == 200, resp.text
    second = resp.json()["data"]
    assert second["id"] != first["id"] and second["name"] == "app" and second["status"] == "pending"
    await wait_building(second["id"])
    # the name shows the rebuild; it still boots (and builds FROM) the old image
    assert (await api.get("/v1/templates/app")).json()["data"]["id"] == second["id"]
    assert await boots("app") == first["id"]
    old_view = (await api.get(f"/v1/templates/{first['id']}")).json()["data"]
    assert old_view["status"] == "ready" and old_view["replaced_by"] == second["id"]
    listed = (await api.get("/v1/templates")).json()["data"]
    assert [item["id"] for item in listed["data"]] == [second["id"]]
    child = await api.post("/v1/templates", json={"name": "child", "dockerfile": "FROM app\nRUN true\n"})
    assert child.status_code == 200, child.text
    busy = await rebuild(DOCKERFILE)
    assert busy.status_code == 409 and second["id"] in fail_data(busy)["message"]

    fake_host.release_build(second["id"])
    assert (await wait_done(api, second["id"]))["status"] == "ready"
    assert await boots("app") == second["id"]
    for _ in range(100):
        if ("delete_build", first["id"]) in fake_host.calls:
            break
        await asyncio.sleep(0.05)
    assert ("delete_build", first["id"]) in fake_host.calls  # dropped once no sandbox boots from it
    assert (await api.get(f"/v1/templates/{first['id']}")).status_code == 404

    # a failed rebuild leaves the name booting the last good image; the next rebuild replaces it
    failed = (await rebuild("FROM debian:13\nRUN FAIL\n")).json()["data"]
    shown = await wait_done(api, failed["id"])
    assert shown["status"] == "failed" and shown["error"]
    assert (await api.get("/v1/templates/app")).json()["data"]["id"] == failed["id"]
    assert await boots("app") == second["id"]
    third = (await rebuild(DOCKERFILE)).json()["data"]
    assert (await api.get(f"/v1/templates/{failed['id']}")).status_code == 404
    assert (await wait_done(api, third["id"]))["status"] == "ready"
    assert await boots("app") == third["id"]
    assert (await api.get(f"/v1/templates/{second['id']}")).status_code == 404

    # deleting a rebuild in flight deletes the template it was replacing: the name is free
    fourth = (await rebuild("FROM debian:13\nRUN HOLD\n")).json()["data"]
    assert (await api.delete("/v1/templates/app")).status_code == 200
    assert (await api.get(f"/v1/templates/{fourth['id']}")).status_code == 404
    assert (await api.get(f"/v1/templates/{third['id']}")).status_code == 404
    again = await api.post("/v1/templates", json={"name": "app", "dockerfile": DOCKERFILE})
    assert again.status_code == 200, again.text


async def test_another_users_template_is_a_404_everywhere(
    api: httpx.AsyncClient, controlplane: ControlPlane
) -> None:
    mine = (await api.post("/v1/templates", json={"name": "private", "dockerfile": DOCKERFILE})).json()[
        "data"
    ]
    await wait_done(api, mine["id"])
    _, other_key = await controlplane.new_user("pro")
    headers = {"X-Api-Key": other_key}
    for path in (f"/v1/templates/{mine['id']}", "/v1/templates/private", f"/v1/templates/{mine['id']}/logs"):
        assert (await api.get(path, headers=headers)).status_code == 404, path
    assert (await api.delete(f"/v1/templates/{mine['id']}", headers=headers)).status_code == 404
    boot = await api.post(
        "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": mine["id"]}, headers=headers
    )
    assert boot.status_code == 400 and "rootfs" in fail_data(boot)
    built_on = await api.post(
        "/v1/templates", json={"name": "x", "dockerfile": f"FROM {mine['id']}\n"}, headers=headers
    )
    assert built_on.status_code == 400


async def test_plan_caps(controlplane: ControlPlane, fake_host: FakeHostLink) -> None:
    _, free_key = await controlplane.new_user("free")
    refused = await controlplane.http.post(
        "/v1/templates", json={"name": "x", "dockerfile": DOCKERFILE}, headers={"X-Api-Key": free_key}
    )
    assert refused.status_code == 403 and fail_data(refused)["code"] == "PLAN_LIMIT"
    _, key = await controlplane.new_user("beginner")  # 5 concurrent
    headers = {"X-Api-Key": key}
    results = await asyncio.gather(
        *(
            controlplane.http.post(
                "/v1/templates", json={"name": f"t{n}", "dockerfile": DOCKERFILE}, headers=headers
            )
            for n in range(7)
        )
    )
    codes = sorted(resp.status_code for resp in results)
    assert codes == [200] * 5 + [403] * 2, [resp.text for resp in results]
    assert all(fail_data(r)["code"] == "QUOTA_EXCEEDED" for r in results if r.status_code == 403)
    # at the cap, a rebuild takes its template's place; a new name is still refused
    made = next(resp.json()["data"] for resp in results if resp.status_code == 200)
    controlplane.http.headers["X-Api-Key"] = key
    await wait_done(controlplane.http, made["id"])
    body = {"name": made["name"], "dockerfile": DOCKERFILE, "rebuild": True}
    rebuilt = await controlplane.http.post("/v1/templates", json=body, headers=headers)
    assert rebuilt.status_code == 200, rebuilt.text
    more = await controlplane.http.post(
        "/v1/templates", json={"name": "t9", "dockerfile": DOCKERFILE}, headers=headers
    )
    assert more.status_code == 403 and fail_data(more)["code"] == "QUOTA_EXCEEDED"


async def test_a_template_built_from_another_ready_template(
    api: httpx.AsyncClient, fake_host: FakeHostLink
) -> None:
    base = (await api.post("/v1/templates", json={"name": "layer1", "dockerfile": DOCKERFILE})).json()["data"]
    pending_base = await api.post("/v1/templates", json={"name": "layer2", "dockerfile": "FROM layer1\n"})
    if (await wait_done(api, base["id"]))["status"] != "ready":
        raise AssertionError("base failed")
    if pending_base.status_code == 200:  # raced the base's build: allowed only once it is ready
        await wait_done(api, pending_base.json()["data"]["id"])
    child = await api.post("/v1/templates", json={"name": "layer3", "dockerfile": "FROM layer1\nRUN true\n"})
    assert child.status_code == 200, child.text
    assert (await wait_done(api, child.json()["data"]["id"]))["status"] == "ready"


async def test_template_actions_are_announced(api: httpx.AsyncClient) -> None:
    endpoint = await api.post(
        "/v1/webhook-endpoints",
        json={
            "url": "http://127.0.0.1:9/hook",
            "events": [
                "template.submit",
                "template.build.start",
                "template.build.complete",
                "template.delete",
            ],
        },
    )
    assert endpoint.status_code == 200, endpoint.text
    endpoint_id = endpoint.json()["data"]["id"]
    created = (await api.post("/v1/templates", json={"name": "hooked", "dockerfile": DOCKERFILE})).json()[
        "data"
    ]
    await wait_done(api, created["id"])
    assert (await api.delete(f"/v1/templates/{created['id']}")).status_code == 200
    failing = (
        await api.post("/v1/templates", json={"name": "hooked-2", "dockerfile": "FROM debian:13\nRUN FAIL\n"})
    ).json()["data"]
    await wait_done(api, failing["id"])
    deliveries = (await api.get(f"/v1/webhook-endpoints/{endpoint_id}")).json()["data"]["deliveries"]
    first = ["template.submit", "template.build.start", "template.build.complete", "template.delete"]
    retried = ["template.submit", "template.build.start", "template.build.start", "template.build.complete"]
    assert sorted(d["eventAction"] for d in deliveries) == sorted([*first, *retried])
    assert created["id"] in str(deliveries) and failing["id"] in str(deliveries)


async def test_a_build_whose_worker_died_is_claimed_again_as_a_new_attempt(
    api: httpx.AsyncClient, controlplane: ControlPlane, fake_host: FakeHostLink
) -> None:
    """A worker that died mid-build leaves ``building`` under a lease; once the lease lapses another
    worker (here: this process's) claims it and runs attempt 2."""
    created = (await api.post("/v1/templates", json={"name": "orphan", "dockerfile": DOCKERFILE})).json()[
        "data"
    ]
    await wait_done(api, created["id"])
    engine = make_engine(controlplane.settings.database_url)
    try:
        async with transaction(make_sessionmaker(engine)) as session:
            await session.execute(
                update(Template)
                .where(Template.id == created["id"])
                .values(status="building", built_at=None, lease_until=utcnow() - dt.timedelta(seconds=1))
            )
    finally:
        await engine.dispose()
    for _ in range(100):  # the idle worker looks again within a second
        data = (await api.get(f"/v1/templates/{created['id']}")).json()["data"]
        if data["status"] == "ready":
            break
        await asyncio.sleep(0.1)
    assert data["status"] == "ready", data
    frames = [
        json.loads(line) for line in (await api.get(f"/v1/templates/{created['id']}/logs")).text.splitlines()
    ]
    assert frames[-1]["attempt"] == 2 and {frame["attempt"] for frame in frames} == {1, 2}


def tar_b64(entries: dict[str, bytes], *, gzip: bool = True, kind: bytes = tarfile.REGTYPE) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as archive:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/shadow"
            archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return base64.b64encode(buffer.getvalue()).decode()


COPYING = 'FROM debian:13\nCOPY --chown=1000:1000 app/ /srv/app/\nADD ["notes.txt", "/srv/"]\n'


async def test_copy_and_add_build_from_the_context_sent_with_the_dockerfile(
    api: httpx.AsyncClient, fake_host: FakeHostLink, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[BuildBody] = []
    start_build = fake_host.start_build

    async def recording(body: BuildBody) -> BuildView:
        seen.append(body)
        return await start_build(body)

    monkeypatch.setattr(fake_host, "start_build", recording)
    context = tar_b64({"app/server.py": b"print('hi')\n", "notes.txt": b"n\n"})
    resp = await api.post("/v1/templates", json={"name": "copier", "dockerfile": COPYING, "context": context})
    assert resp.status_code == 200, resp.text
    assert (await wait_done(api, resp.json()["data"]["id"]))["status"] == "ready"
    assert [body.context_b64 for body in seen] == [context]
    # Without a context the same Dockerfile is refused, as before (existing clients send none).
    refused = await api.post("/v1/templates", json={"name": "copier2", "dockerfile": COPYING})
    assert refused.status_code == 400 and "needs a build context" in fail_data(refused)["dockerfile"]


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"context": "not base64!"}, "context", "base64"),
        ({"context": base64.b64encode(b"plain text, not a tar").decode()}, "context", "tar archive"),
        ({"context": ""}, "context", "empty"),
        ({"context": tar_b64({"../escape": b"x"})}, "context", "relative"),
        ({"context": tar_b64({"/etc/passwd": b"x"}, gzip=False)}, "context", "relative"),
        ({"context": tar_b64({"link": b""}, kind=tarfile.SYMTYPE)}, "context", "regular files"),
        # Past the context's own limit, under the body's (a bigger body is refused unread: 413).
        ({"context": "A" * ((templates.MAX_CONTEXT_BYTES + 2) // 3 * 4 + 4)}, "context", "at most"),
        ({"dockerfile": "FROM debian:13\nCOPY --from=debian:13 /etc /etc\n"}, "dockerfile", "--from"),
        ({"dockerfile": "FROM debian:13\nADD http://127.0.0.1:1/x /x\n"}, "dockerfile", "URL"),
        ({"dockerfile": "FROM debian:13\nADD git@github.com:a/b /b\n"}, "dockerfile", "URL"),
        ({"dockerfile": "FROM debian:13\nCOPY onlyone\n"}, "dockerfile", "destination"),
    ],
)
async def test_a_bad_context_or_copy_is_400_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], field: str, says: str
) -> None:
    full = {"name": "ctx", "dockerfile": COPYING, "context": tar_b64({"notes.txt": b"n"}), **body}
    resp = await api.post("/v1/templates", json=full)
    assert resp.status_code == 400, resp.text
    data = fail_data(resp)
    assert data["code"] == "VALIDATION_FAILED" and says in data[field], data
    assert (await api.get("/v1/templates")).json()["data"]["pagination"]["total"] == 0


async def test_a_build_the_worker_gives_up_on_is_cancelled_on_its_host_before_it_is_failed(
    api: httpx.AsyncClient,
    controlplane: ControlPlane,
    fake_host: FakeHostLink,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's polls of a busy host time out past the attempt's limit: it cancels the attempt on the
    host before recording it failed, and while the host does not confirm the cancel the template stays
    ``building`` (the host still runs it) instead of ``failed``."""
    monkeypatch.setattr(template_builds, "GRACE_S", 0.0)
    monkeypatch.setattr(template_builds, "CANCEL_RETRY_S", 0.05, raising=False)
    monkeypatch.setattr(template_builds, "CANCEL_RETRY_MAX_S", 0.1, raising=False)
    monkeypatch.setattr(controlplane.settings, "template_build_timeout_s", 0.5)
    running: set[str] = set()
    cancels_answered = False

    async def start_build(body: BuildBody) -> BuildView:
        running.add(body.id)
        return BuildView(id=body.id, attempt=body.attempt, status="building")

    async def get_build(build_id: str, *, after: int) -> BuildView:
        raise hostlink.HostError("timed out")

    async def delete_build(build_id: str) -> None:
        if not cancels_answered:
            raise hostlink.HostError("timed out")
        running.discard(build_id)

    monkeypatch.setattr(fake_host, "start_build", start_build)
    monkeypatch.setattr(fake_host, "get_build", get_build)
    monkeypatch.setattr(fake_host, "delete_build", delete_build)
    created = (await api.post("/v1/templates", json={"name": "stuck", "dockerfile": DOCKERFILE})).json()[
        "data"
    ]
    for _ in range(30):  # 3 s: well past the attempt's limit, the host still has it
        data = (await api.get(f"/v1/templates/{created['id']}")).json()["data"]
        assert data["status"] in ("pending", "building"), data
        await asyncio.sleep(0.1)
    assert data["status"] == "building" and running == {created["id"]}
    cancels_answered = True
    assert (await wait_done(api, created["id"]))["status"] == "failed"
    assert running == set(), "recorded failed while the host still builds it"


async def test_a_build_log_keeps_its_head_and_tail_and_says_how_much_was_cut(
    api: httpx.AsyncClient, fake_host: FakeHostLink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that prints 30,000 lines (3 MB) is recorded as its first and last lines and one line
    saying how many were cut between them."""
    total = 30000

    async def start_build(body: BuildBody) -> BuildView:
        lines = [BuildLine(ts=1.0, level="info", line=f"line {n} " + "x" * 90) for n in range(total)]
        fake_host.builds[body.id] = BuildView(
            id=body.id, attempt=body.attempt, status="ready", lines=lines, next=total, ext4_size_bytes=4096
        )
        return fake_host.builds[body.id]

    monkeypatch.setattr(fake_host, "start_build", start_build)
    created = (await api.post("/v1/templates", json={"name": "chatty", "dockerfile": DOCKERFILE})).json()[
        "data"
    ]
    assert (await wait_done(api, created["id"]))["status"] == "ready"
    text = (await api.get(f"/v1/templates/{created['id']}/logs")).text
    lines = [frame.get("line", "") for frame in map(json.loads, text.splitlines())]
    head, tail = 2000, 1000  # per attempt, as docs/templates.md says
    assert len(lines) <= head + tail + 2, len(lines)
    assert len(text) < 2 * 1024 * 1024
    assert lines[0].startswith("line 0 ") and lines[head - 1].startswith(f"line {head - 1} ")
    assert f"[log cut: {total - head - tail} lines" in lines[head], lines[head]
    assert lines[head + 1].startswith(f"line {total - tail} ") and lines[-2].startswith(f"line {total - 1} ")


async def test_a_deleted_templates_log_is_gone_from_the_database(
    api: httpx.AsyncClient, controlplane: ControlPlane
) -> None:
    created = (await api.post("/v1/templates", json={"name": "logged", "dockerfile": DOCKERFILE})).json()[
        "data"
    ]
    await wait_done(api, created["id"])
    engine = make_engine(controlplane.settings.database_url)
    try:
        count = select(func.count()).where(TemplateLogLine.template_id == created["id"])
        async with make_sessionmaker(engine)() as session:
            assert await session.scalar(count)
        assert (await api.delete(f"/v1/templates/{created['id']}")).status_code == 200
        async with make_sessionmaker(engine)() as session:
            assert await session.scalar(count) == 0
    finally:
        await engine.dispose()
