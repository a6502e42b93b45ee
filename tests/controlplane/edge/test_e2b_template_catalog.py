"""The E2B template catalog's parts without a platform (``edge/e2b/template_catalog.py``): its query
parameters and cursors refuse what they cannot read, naming the field; E2B's own templates are one
entry per image; and, on SQLite and PostgreSQL, the tag groups and the template list page through every
row once, in each order, past rows of the same instant, without another account's."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from paddock_controlplane.edge.e2b import template_catalog as catalog
from paddock_controlplane.edge.e2b.templates import E2bTemplateBuild, E2bTemplateTag, derived_build_id
from paddock_controlplane.records.models import Template
from paddock_controlplane.resources import accounts
from paddock_core import errors
from paddock_core.db import make_engine, make_sessionmaker, transaction

Sessions = async_sessionmaker[AsyncSession]
RESOURCES = catalog.Resources.of("s-2vcpu-2gb")
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _field_of(call: Callable[[], object]) -> str:
    with pytest.raises(errors.ValidationFailed) as refused:
        call()
    (field,) = refused.value.fields
    return str(field)


def test_integer_parameters_are_checked_and_capped() -> None:
    assert catalog.int_param({}, "limit", 1, 100) is None
    assert catalog.int_param({"limit": "7"}, "limit", 1, 100) == 7
    assert catalog.int_param({"limit": "5000"}, "limit", 1, 100) == 100
    for raw in ("0", "-3", "x", "--5", "1.5", "9" * 40, "٣"):
        assert _field_of(lambda raw=raw: catalog.int_param({"limit": raw}, "limit", 1, 100)) == "limit"
    assert catalog.choice_param({"sort": "name_asc"}, "sort", catalog.TAG_SORTS) == "name_asc"
    assert _field_of(lambda: catalog.choice_param({"sort": "random"}, "sort", catalog.TAG_SORTS)) == "sort"


def test_a_cursor_reads_back_and_nothing_else_does() -> None:
    token = catalog.encode_cursor("latest_desc", T0.isoformat(), "v1")
    assert catalog.decode_cursor(token, "tagsCursor", 3) == ["latest_desc", T0.isoformat(), "v1"]
    for bad in ("x", "%%%", catalog.encode_cursor("a", "b"), "a" * 600, "W3sieCI6MX1d"):
        assert _field_of(lambda bad=bad: catalog.decode_cursor(bad, "tagsCursor", 3)) == "tagsCursor"
    assert _field_of(lambda: catalog.cursor_time("yesterday", "nextToken")) == "nextToken"


def test_e2b_s_own_templates_are_one_entry_per_image() -> None:
    views = catalog.default_templates(RESOURCES)
    assert [view["templateID"] for view in views] == ["base", "code-interpreter-v1", "desktop"]
    assert views[1]["names"] == ["code-interpreter-v1", "code-interpreter"]
    assert all(view["isDefault"] and view["public"] and view["spawnCount"] == 0 for view in views)
    assert views[0]["buildID"] == derived_build_id("devbox:1") == str(uuid.UUID(str(views[0]["buildID"])))


@pytest.fixture
async def sessions(cp_database_url: str) -> AsyncIterator[Sessions]:
    engine = make_engine(cp_database_url)
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()


def _template(user_id: str, name: str, number: int, *, status: str = "ready") -> Template:
    return Template(
        id=f"tpl_01J{number:023d}",
        user_id=user_id,
        name=name,
        base="debian:13",
        from_image="debian:13",
        dockerfile="FROM debian:13\n",
        status=status,
        created_at=T0 + dt.timedelta(minutes=number),
        built_at=T0 + dt.timedelta(minutes=number, seconds=30) if status == "ready" else None,
    )


async def test_tag_groups_page_through_every_ready_tag_in_each_order(sessions: Sessions) -> None:
    async with transaction(sessions) as session:
        user = await accounts.create_user(session, plan_id="pro", signup_credits=0)
        other = await accounts.create_user(session, plan_id="pro", signup_credits=0)
        session.add_all([_template(user.id, "web", 1), _template(user.id, "gone", 2, status="building")])
        session.add_all(
            [
                E2bTemplateBuild(
                    build_id="b-web",
                    user_id=user.id,
                    name="web",
                    template_id="tpl_01J" + "1".zfill(23),
                    created_at=T0,
                ),
                E2bTemplateBuild(
                    build_id="b-old", user_id=user.id, name="web", template_id=None, created_at=T0
                ),
            ]
        )
        # alpha and beta share an instant: the cursor must not skip one of them
        pointed = {
            "alpha": T0,
            "beta": T0,
            "gamma": T0 + dt.timedelta(seconds=1),
            "delta": T0 - dt.timedelta(seconds=1),
        }
        session.add_all(
            E2bTemplateTag(user_id=user.id, name="web", tag=tag, build_id="b-web", created_at=at)
            for tag, at in pointed.items()
        )
        session.add(
            E2bTemplateTag(user_id=user.id, name="web", tag="unbuilt", build_id="b-old", created_at=T0)
        )
    expected = {
        "name_asc": ["alpha", "beta", "delta", "gamma"],
        "name_desc": ["gamma", "delta", "beta", "alpha"],
        "latest_asc": ["delta", "alpha", "beta", "gamma"],
        "latest_desc": ["gamma", "beta", "alpha", "delta"],
    }
    for sort, order in expected.items():
        seen: list[str] = []
        after = None
        for _ in range(10):
            async with sessions() as session:
                query = catalog.TagQuery(sort, "", after)
                groups, token = await catalog.tag_group_page(session, user.id, "web", query, 1)
            seen += [group["tag"] for group in groups]
            assert all(len(group["assignments"]) == 1 and not group["hasMore"] for group in groups)
            if token is None:
                break
            after = catalog.parse_tags_cursor(token, sort)
        assert seen == order, sort
    async with sessions() as session:
        found, _ = await catalog.tag_group_page(session, user.id, "web", catalog.TagQuery(search="et"), 10)
        assert [group["tag"] for group in found] == ["beta"]
        assert await catalog.count_ready_tags(session, user.id, "web") == 4  # not "unbuilt"
        with pytest.raises(errors.NotFound):
            await catalog.count_ready_tags(session, other.id, "web")


async def test_the_template_list_pages_newest_first(sessions: Sessions) -> None:
    async with transaction(sessions) as session:
        user = await accounts.create_user(session, plan_id="pro", signup_credits=0)
        other = await accounts.create_user(session, plan_id="pro", signup_credits=0)
        session.add_all(_template(user.id, f"t{number}", number) for number in range(1, 6))
        session.add(_template(user.id, "~tpl_replaced", 6))  # a rebuild's old template: not listed
        session.add(_template(other.id, "theirs", 7))
    names: list[str] = []
    after = None
    for _ in range(5):
        async with sessions() as session:
            page, after = await catalog.template_page(session, user.id, after, 2, RESOURCES)
        names += [view["templateID"] for view in page]
        if after is None:
            break
    assert names == ["t5", "t4", "t3", "t2", "t1"]
    async with sessions() as session:
        (view,) = await catalog.annotate(
            session, user.id, [await catalog.live_template(session, user.id, "t1")], RESOURCES
        )
    assert view["buildID"] == derived_build_id("tpl_01J" + "1".zfill(23)) and view["buildCount"] == 1
