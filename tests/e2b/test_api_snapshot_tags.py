"""E2B's ``name:tag`` snapshot names, through the unmodified ``e2b`` SDK configured only by the three
variables: ``create_snapshot(name="n:v1")`` and ``"n:v2"`` and ``"n"`` (``n:default``) are three
snapshots of one name; ``Sandbox.create`` boots each tag's (``n`` and ``n:default`` alike), the listing
filters on ``n`` (every tag) and on ``n:v2``, a taken ``name:tag`` is refused naming ``name``, an unknown
tag is a missing template, and ``delete_snapshot("n:v1")`` deletes that one only. Before, a ``:`` in a
snapshot's name was a 400."""

from __future__ import annotations

import secrets

import pytest

from e2b import Sandbox, SandboxException
from tests.e2b.conftest import E2bPlatform
from tests.e2b.test_api_snapshots import _snapshot_ids, container_tier

__all__ = ["container_tier"]

pytestmark = pytest.mark.root

NOTE = "/var/tmp/tag/note.txt"


def _read_from(ref: str) -> str:
    booted = Sandbox.create(ref, timeout=120)
    try:
        return booted.files.read(NOTE)
    finally:
        booted.kill()


def test_tags_name_snapshots_of_one_name(e2b_env: E2bPlatform) -> None:
    name = f"e2b-tag-{secrets.token_hex(3)}"
    made: list[str] = []
    source = Sandbox.create(timeout=300)
    try:
        source.files.write(NOTE, "one\n")
        v1 = source.create_snapshot(name=f"{name}:v1")
        made.append(v1.snapshot_id)
        source.files.write(NOTE, "two\n")
        v2 = source.create_snapshot(name=f"{name}:v2")
        made.append(v2.snapshot_id)
        source.files.write(NOTE, "plain\n")
        plain = source.create_snapshot(name=name)
        made.append(plain.snapshot_id)
        assert (v1.names, v2.names, plain.names) == ([f"{name}:v1"], [f"{name}:v2"], [name])
        for taken in (f"{name}:v1", name, f"{name}:default"):
            with pytest.raises(SandboxException, match="name"):  # E2B moves the tag instead
                source.create_snapshot(name=taken)
        for bad in (f"{name}:not a tag", f"team/{name}:v3", f"{name}:"):
            with pytest.raises(SandboxException, match="name") as refused:
                source.create_snapshot(name=bad)
            assert getattr(refused.value, "status_code", 400) == 400, (bad, refused.value)
        source.kill()

        assert _read_from(f"{name}:v1") == "one\n"
        assert _read_from(f"{name}:v2") == "two\n"
        assert _read_from(name) == "plain\n"
        assert _read_from(f"{name}:default") == "plain\n"
        with pytest.raises(Exception, match=f"{name}:v9"):
            Sandbox.create(f"{name}:v9", timeout=60)

        assert _snapshot_ids(name=name) == [v1.snapshot_id, v2.snapshot_id, plain.snapshot_id]
        assert _snapshot_ids(name=f"{name}:v2") == [v2.snapshot_id]
        assert _snapshot_ids(name=f"{name}:default") == [plain.snapshot_id]
        listed = {item.snapshot_id: item.names for item in Sandbox.list_snapshots(name=name).next_items()}
        assert listed[v1.snapshot_id] == [f"{name}:v1"] and listed[plain.snapshot_id] == [name], listed

        assert Sandbox.delete_snapshot(f"{name}:v1") is True
        made.remove(v1.snapshot_id)
        assert Sandbox.delete_snapshot(f"{name}:v1") is False
        with pytest.raises(Exception, match=f"{name}:v1"):
            Sandbox.create(f"{name}:v1", timeout=60)
        assert _snapshot_ids(name=name) == [v2.snapshot_id, plain.snapshot_id]
        again = Sandbox.create(timeout=300)  # the freed tag is taken by a new snapshot
        try:
            again.files.write(NOTE, "again\n")
            made.append(again.create_snapshot(name=f"{name}:v1").snapshot_id)
        finally:
            again.kill()
        assert _read_from(f"{name}:v1") == "again\n"
    finally:
        Sandbox.kill(source.sandbox_id)
        for snapshot_id in made:
            Sandbox.delete_snapshot(snapshot_id)


def test_a_catalog_image_with_a_colon_still_boots(e2b_env: E2bPlatform) -> None:
    sandbox = Sandbox.create("debian:13", timeout=60)
    try:
        assert sandbox.commands.run("cat /etc/debian_version").stdout.startswith("13")
    finally:
        sandbox.kill()
