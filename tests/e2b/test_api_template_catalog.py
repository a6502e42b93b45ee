"""E2B's template catalog through the unmodified SDK's own generated client (its parser proves each
answer's shape): one template built with ``Template.build`` (tags ``v1``, then ``stable``) and booted
once, and one made through ``/v1``, are listed with their build ids, which the status route answers; a
second account sees neither; E2B's own templates are listed as defaults; a template answers with its
builds; ``PATCH`` keeps it private (``public: true`` is a 501); its build log pages; the four tag
queries answer; bad input is a 400 naming its field. Before, every one of these routes was a 501."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from e2b.api import ApiClient
from e2b.api.client.api.tags import (
    get_templates_template_id_tags_count,
    get_templates_template_id_tags_exists,
    get_templates_template_id_tags_groups,
    get_templates_template_id_tags_tag_assignments,
)
from e2b.api.client.api.templates import (
    get_default_templates,
    get_templates,
    get_templates_template_id,
    get_templates_template_id_builds_build_id_logs,
    get_templates_template_id_builds_build_id_status,
    get_v2_templates,
    patch_templates_template_id,
    patch_v_2_templates_template_id,
)
from e2b.api.client.models import (
    GetTemplatesTemplateIDTagsGroupsSort,
    LogLevel,
    LogsDirection,
    TemplateBuildLogsResponse,
    TemplateBuildStatus,
    TemplateTagAssignmentsResponse,
    TemplateTagExistsResponse,
    TemplateTagGroupsResponse,
    TemplateTagsCountResponse,
    TemplateUpdateRequest,
    TemplateUpdateResponse,
    TemplateWithBuilds,
)
from e2b.api.client.models import Template as ListedTemplate
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig

from e2b import Sandbox, Template
from tests.e2b.conftest import E2bPlatform, wait_template_ready

pytestmark = [pytest.mark.root, pytest.mark.slow]


@dataclass(frozen=True)
class Catalog:
    name: str  # built through E2B, tags v1 and stable, booted once
    build_id: str
    v1_name: str  # made through /v1: no E2B build
    api: ApiClient
    http: httpx.Client  # raw, for what the generated client does not parse (400, 404, 501)


@pytest.fixture(scope="module")
def catalog(e2b_env: E2bPlatform) -> Iterator[Catalog]:
    suffix = secrets.token_hex(3)
    name, v1_name = f"e2b-cat-{suffix}", f"v1-cat-{suffix}"
    native = e2b_env.platform.http(e2b_env.api_key)
    made = native.post("/v1/templates", json={"name": v1_name, "dockerfile": "FROM debian:13\nENV MADE=v1\n"})
    assert made.status_code == 200, made.text
    v1_id = made.json()["data"]["id"]
    http = httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": e2b_env.api_key}, timeout=60)
    api = get_api_client(ConnectionConfig())
    try:
        built = Template.build(
            Template().from_debian_image().run_cmd("echo catalog > /srv/c.txt"), name, tags=["v1"]
        )
        Template.assign_tags(f"{name}:v1", "stable")
        Sandbox.create(name, timeout=60).kill()  # booted once: spawnCount
        wait_template_ready(native, v1_id)
        yield Catalog(name, built.build_id, v1_name, api, http)
    finally:
        http.delete(f"/templates/{name}")
        native.delete(f"/v1/templates/{v1_id}")
        http.close()
        native.close()


def _mine(listed: Any, name: str) -> ListedTemplate:
    assert isinstance(listed, list), listed
    found = [template for template in listed if template.template_id == name]
    assert len(found) == 1, [template.template_id for template in listed]
    return found[0]


def _refused(answer: httpx.Response, status: int, field: str) -> None:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["code"] == status and field in body["message"], body


def test_the_list_holds_each_template_with_a_build_id_the_status_route_answers(catalog: Catalog) -> None:
    listed = get_templates.sync_detailed(client=catalog.api, team_id="ignored")
    assert listed.status_code == 200
    built = _mine(listed.parsed, catalog.name)
    assert built.build_id == catalog.build_id
    assert (built.cpu_count, built.memory_mb, built.disk_size_mb) == (2, 2048, 10240)
    assert built.public is False and built.names == [catalog.name] and built.aliases == [catalog.name]
    assert built.build_status == TemplateBuildStatus.READY and built.build_count == 1
    assert built.spawn_count == 1 and built.last_spawned_at is not None and built.created_by is None
    assert built.envd_version and built.updated_at >= built.created_at

    v1 = _mine(listed.parsed, catalog.v1_name)
    uuid.UUID(v1.build_id)  # a UUID of its own, though no E2B build made it
    assert v1.build_status == TemplateBuildStatus.READY and v1.spawn_count == 0 and v1.last_spawned_at is None
    for name, build_id in ((catalog.name, catalog.build_id), (catalog.v1_name, v1.build_id)):
        status = get_templates_template_id_builds_build_id_status.sync_detailed(
            name, build_id, client=catalog.api
        )
        assert status.status_code == 200, status.content
        assert status.parsed is not None and status.parsed.status == TemplateBuildStatus.READY
    again = get_templates.sync_detailed(client=catalog.api).parsed
    assert _mine(again, catalog.v1_name).build_id == v1.build_id  # the same id on every call

    first = get_v2_templates.sync_detailed(client=catalog.api, limit=1)
    assert first.status_code == 200 and isinstance(first.parsed, list) and len(first.parsed) == 1
    token = first.headers["x-next-token"]
    second = get_v2_templates.sync_detailed(client=catalog.api, limit=1, next_token=token)
    assert isinstance(second.parsed, list)
    assert {first.parsed[0].template_id, second.parsed[0].template_id} == {catalog.name, catalog.v1_name}
    # SDK 2.64's own paginator over the same route, a page at a time.
    paginator = Template.list(limit=1)
    pages = []
    while paginator.has_next:
        pages.append(paginator.next_items())
    assert [len(page) for page in pages] == [1, 1]
    infos = {page[0].template_id: page[0] for page in pages}
    assert set(infos) == {catalog.name, catalog.v1_name}
    assert infos[catalog.name].build_id == catalog.build_id and infos[catalog.name].spawn_count == 1
    assert infos[catalog.name].max_cpu_count is None  # a fixed-size template
    _refused(catalog.http.get("/v2/templates", params={"nextToken": "nope"}), 400, "nextToken")
    _refused(catalog.http.get("/v2/templates", params={"limit": "0"}), 400, "limit")


def test_another_account_sees_none_of_it(catalog: Catalog, e2b_env: E2bPlatform) -> None:
    other_key = e2b_env.platform.api_key()
    other = get_api_client(ConnectionConfig(api_key=other_key))
    listed = get_templates.sync_detailed(client=other)
    assert listed.status_code == 200 and listed.parsed == []
    paged = get_v2_templates.sync_detailed(client=other)
    assert paged.status_code == 200 and paged.parsed == []
    with httpx.Client(base_url=e2b_env.api_url, headers={"X-API-Key": other_key}) as http:
        name = catalog.name
        for path in (
            f"/templates/{name}",
            f"/templates/{name}/builds/{catalog.build_id}/status",
            f"/templates/{name}/builds/{catalog.build_id}/logs",
            f"/templates/{name}/tags/count",
            f"/templates/{name}/tags/groups",
            f"/templates/{name}/tags/v1/assignments",
        ):
            _refused(http.get(path), 404, name)
        _refused(http.patch(f"/v2/templates/{name}", json={"public": False}), 404, name)


def test_e2b_s_own_templates_are_the_defaults(catalog: Catalog) -> None:
    answer = get_default_templates.sync_detailed(client=catalog.api)
    assert answer.status_code == 200 and isinstance(answer.parsed, list)
    by_id = {template.template_id: template for template in answer.parsed}
    assert list(by_id) == sorted(by_id) and {"base", "code-interpreter-v1", "desktop"} <= set(by_id)
    assert "code-interpreter" in by_id["code-interpreter-v1"].names
    for template in answer.parsed:
        assert template.is_default is True and template.public is True
        assert (template.spawn_count, template.build_count, template.last_spawned_at) == (0, 0, None)
    base = get_templates_template_id.sync_detailed("base", client=catalog.api)
    assert isinstance(base.parsed, TemplateWithBuilds) and base.parsed.is_default is True
    assert base.parsed.builds == []


def test_a_template_answers_with_its_builds(catalog: Catalog) -> None:
    answer = get_templates_template_id.sync_detailed(catalog.name, client=catalog.api, limit=1)
    assert answer.status_code == 200
    template = answer.parsed
    assert isinstance(template, TemplateWithBuilds)
    assert template.template_id == catalog.name and template.build_id == catalog.build_id
    assert [str(build.build_id) for build in template.builds] == [catalog.build_id]
    (build,) = template.builds
    assert build.status == TemplateBuildStatus.READY and build.finished_at
    assert "x-next-token" not in answer.headers  # a rebuild replaces the template: one live build

    v1 = get_templates_template_id.sync_detailed(catalog.v1_name, client=catalog.api).parsed
    assert isinstance(v1, TemplateWithBuilds) and [str(b.build_id) for b in v1.builds] == [v1.build_id]

    _refused(catalog.http.get("/templates/e2b-cat-nothing"), 404, "e2b-cat-nothing")
    _refused(catalog.http.get(f"/templates/{catalog.name}", params={"nextToken": "%%%"}), 400, "nextToken")
    _refused(catalog.http.get(f"/templates/{catalog.name}", params={"limit": "x"}), 400, "limit")


def test_patch_keeps_a_template_private(catalog: Catalog) -> None:
    private = TemplateUpdateRequest(public=False)
    old = patch_templates_template_id.sync_detailed(catalog.name, client=catalog.api, body=private)
    assert old.status_code == 200
    new = patch_v_2_templates_template_id.sync_detailed(catalog.name, client=catalog.api, body=private)
    assert isinstance(new.parsed, TemplateUpdateResponse) and new.parsed.names == [catalog.name]
    empty = patch_v_2_templates_template_id.sync_detailed(
        catalog.name, client=catalog.api, body=TemplateUpdateRequest()
    )
    assert empty.status_code == 200

    for path in (f"/templates/{catalog.name}", f"/v2/templates/{catalog.name}"):
        _refused(catalog.http.patch(path, json={"public": True}), 501, "public")
        _refused(catalog.http.patch(path, json={"public": "yes"}), 400, "public")
        _refused(catalog.http.patch(path, json=["public"]), 400, "body")
    _refused(
        catalog.http.patch("/v2/templates/e2b-cat-nothing", json={"public": False}), 404, "e2b-cat-nothing"
    )
    listed = _mine(get_templates.sync_detailed(client=catalog.api).parsed, catalog.name)
    assert listed.public is False


def test_a_build_log_pages(catalog: Catalog) -> None:
    def logs(**options: Any) -> TemplateBuildLogsResponse:
        answer = get_templates_template_id_builds_build_id_logs.sync_detailed(
            catalog.name, catalog.build_id, client=catalog.api, **options
        )
        assert isinstance(answer.parsed, TemplateBuildLogsResponse), answer.content
        return answer.parsed

    whole = logs().logs
    assert len(whole) >= 2 and all(entry.message for entry in whole)
    assert [entry.message for entry in logs(limit=2).logs] == [entry.message for entry in whole[:2]]
    newest = logs(limit=1, direction=LogsDirection.BACKWARD).logs
    assert [entry.message for entry in newest] == [whole[-1].message]
    since = int(whole[-1].timestamp.timestamp() * 1000)
    assert whole[-1].message in [entry.message for entry in logs(cursor=since).logs]
    assert all(entry.level == LogLevel.ERROR for entry in logs(level=LogLevel.ERROR).logs)

    path = f"/templates/{catalog.name}/builds/{catalog.build_id}/logs"
    assert len(catalog.http.get(path, params={"limit": "1000"}).json()["logs"]) <= 100
    for field, value in (
        ("direction", "sideways"),
        ("level", "loud"),
        ("source", "elsewhere"),
        ("limit", "-1"),
        ("cursor", "yesterday"),
    ):
        _refused(catalog.http.get(path, params={field: value}), 400, field)
    _refused(catalog.http.get(f"/templates/{catalog.name}/builds/{uuid.uuid4()}/logs"), 404, "not found")


def test_the_tag_queries(catalog: Catalog) -> None:
    name, api = catalog.name, catalog.api
    count = get_templates_template_id_tags_count.sync_detailed(name, client=api).parsed
    assert isinstance(count, TemplateTagsCountResponse) and count.total == 2

    exists = get_templates_template_id_tags_exists.sync_detailed(name, client=api, tag=" stable ").parsed
    assert isinstance(exists, TemplateTagExistsResponse)
    assert exists.exists is True and exists.normalized_tag == "stable"
    absent = get_templates_template_id_tags_exists.sync_detailed(name, client=api, tag="v9").parsed
    assert isinstance(absent, TemplateTagExistsResponse) and absent.exists is False

    groups = get_templates_template_id_tags_groups.sync_detailed(
        name, client=api, sort=GetTemplatesTemplateIDTagsGroupsSort.NAME_ASC, tags_limit=1
    ).parsed
    assert isinstance(groups, TemplateTagGroupsResponse)
    assert [group.tag for group in groups.tags] == ["stable"] and groups.next_cursor
    (group,) = groups.tags
    assert group.has_more is False and [str(a.build_id) for a in group.assignments] == [catalog.build_id]
    rest = get_templates_template_id_tags_groups.sync_detailed(
        name, client=api, sort=GetTemplatesTemplateIDTagsGroupsSort.NAME_ASC, tags_cursor=groups.next_cursor
    ).parsed
    assert isinstance(rest, TemplateTagGroupsResponse)
    assert [group.tag for group in rest.tags] == ["v1"] and rest.next_cursor is None
    latest = get_templates_template_id_tags_groups.sync_detailed(name, client=api).parsed
    assert isinstance(latest, TemplateTagGroupsResponse)
    assert [group.tag for group in latest.tags] == ["stable", "v1"]  # stable was pointed last
    found = get_templates_template_id_tags_groups.sync_detailed(name, client=api, search="tab").parsed
    assert isinstance(found, TemplateTagGroupsResponse) and [g.tag for g in found.tags] == ["stable"]

    assigned = get_templates_template_id_tags_tag_assignments.sync_detailed(name, "v1", client=api).parsed
    assert isinstance(assigned, TemplateTagAssignmentsResponse) and assigned.next_cursor is None
    (assignment,) = assigned.data
    assert str(assignment.build_id) == catalog.build_id and assignment.build_finished_at is not None
    again = get_templates_template_id_tags_tag_assignments.sync_detailed(name, "v1", client=api).parsed
    assert isinstance(again, TemplateTagAssignmentsResponse)
    assert again.data[0].assignment_id == assignment.assignment_id  # the same id on every call

    http = catalog.http
    _refused(http.get(f"/templates/{name}/tags/exists", params={"tag": "not a tag"}), 400, "tag")
    _refused(http.get(f"/templates/{name}/tags/exists"), 400, "tag")
    _refused(http.get(f"/templates/{name}/tags/groups", params={"sort": "random"}), 400, "sort")
    _refused(http.get(f"/templates/{name}/tags/groups", params={"tagsLimit": "0"}), 400, "tagsLimit")
    _refused(http.get(f"/templates/{name}/tags/groups", params={"tagsCursor": "x"}), 400, "tagsCursor")
    _refused(http.get(f"/templates/{name}/tags/v1/assignments", params={"cursor": "x"}), 400, "cursor")
    _refused(http.get(f"/templates/{name}/tags/v1/assignments", params={"limit": "0"}), 400, "limit")
    _refused(http.get("/templates/e2b-cat-nothing/tags/count"), 404, "e2b-cat-nothing")
    # The routes beside these still answer as before.
    assert http.get(f"/templates/aliases/{name}").json() == {"templateID": name, "public": False}
    assert {tag["tag"] for tag in http.get(f"/templates/{name}/tags").json()} == {"v1", "stable"}
