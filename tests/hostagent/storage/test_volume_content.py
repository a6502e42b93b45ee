"""A volume's files worked on by the root host agent (``sandboxes/volume_content.py``, E2B's volume content
API) on a real directory tree: what the tenant put in the volume, a symlink to a directory outside it
above all, is listed and removed as itself and never followed, and every answer is bounded. The same
calls through the unmodified E2B SDK against a live platform: tests/e2b/test_api_volumes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from paddock_hostagent import errors
from paddock_hostagent.drivers.storage.safepaths import Tree
from paddock_hostagent.sandboxes import volume_content


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory the tenant's symlinks point at, with a file the agent must never touch."""
    directory = tmp_path / "host"
    directory.mkdir()
    (directory / "secret.txt").write_text("the host's\n")
    return directory


@pytest.fixture
def tree(tmp_path: Path, outside: Path) -> Tree:
    root = tmp_path / "volume"
    (root / "docs" / "deep").mkdir(parents=True)
    (root / "docs" / "a.txt").write_text("a\n")
    (root / "docs" / "deep" / "b.txt").write_text("b\n")
    (root / "docs" / "to-host").symlink_to(outside)
    opened = Tree.open(root, follow_symlinks=False)
    yield opened
    opened.close()


def test_a_listing_shows_a_symlink_and_never_enters_it(tree: Tree, outside: Path) -> None:
    listed = {entry.path: entry for entry in volume_content.list_dir(tree, "/", 3)}
    assert set(listed) == {"/docs", "/docs/a.txt", "/docs/deep", "/docs/deep/b.txt", "/docs/to-host"}
    link = listed["/docs/to-host"]
    assert (link.type, link.target) == ("symlink", str(outside))
    assert [e.path for e in volume_content.list_dir(tree, "docs", 1)] == [
        "/docs/a.txt",
        "/docs/deep",
        "/docs/to-host",
    ]
    with pytest.raises(errors.BadPath, match="symlink"):
        volume_content.list_dir(tree, "/docs/to-host", 1)


def test_nothing_is_read_or_written_through_a_symlink(tree: Tree, outside: Path) -> None:
    with pytest.raises(errors.BadPath, match="symlink"):
        volume_content.read_file(tree, "/docs/to-host/secret.txt")
    with pytest.raises(errors.BadPath, match="symlink"):
        volume_content.write_file(tree, "/docs/to-host/planted.txt", b"x", None, None, None)
    with pytest.raises(errors.BadPath, match="symlink"):
        volume_content.make_dir(tree, "/docs/to-host/made", None, None, None, True)
    with pytest.raises(errors.BadPath, match=r"'\.\.'"):
        volume_content.stat_path(tree, "/docs/../../host/secret.txt")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_removing_a_directory_takes_a_symlink_in_it_and_not_what_it_names(tree: Tree, outside: Path) -> None:
    volume_content.remove(tree, "/docs")
    assert volume_content.list_dir(tree, "/", 1) == []
    assert (outside / "secret.txt").read_text() == "the host's\n"


def test_a_write_replaces_the_file_whole_and_sets_what_was_asked(tree: Tree) -> None:
    entry = volume_content.write_file(tree, "/new/dir/c.txt", b"c" * 10, 1000, 1001, 0o600)
    assert (entry.type, entry.size, entry.uid, entry.gid, entry.mode) == ("file", 10, 1000, 1001, 0o600)
    entry = volume_content.write_file(tree, "/new/dir/c.txt", b"shorter", None, None, None)
    assert volume_content.read_file(tree, "/new/dir/c.txt") == b"shorter" and entry.size == 7
    with pytest.raises(errors.BadPath, match="not a directory"):
        volume_content.make_dir(tree, "/new/dir/c.txt", None, None, None, False)
    kept = volume_content.make_dir(tree, "/new/dir", None, None, 0o700, False)  # there already: kept
    assert kept.type == "directory" and kept.mode == 0o700
    with pytest.raises(errors.FileNotFound):
        volume_content.make_dir(tree, "/missing/parent/d", None, None, None, False)


def test_a_read_and_a_listing_are_bounded(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume_content, "MAX_FILE_BYTES", 2)
    assert volume_content.read_file(tree, "/docs/a.txt") == b"a\n"  # at the limit: read
    monkeypatch.setattr(volume_content, "MAX_FILE_BYTES", 1)
    with pytest.raises(errors.PayloadTooLarge, match="2 bytes"):
        volume_content.read_file(tree, "/docs/a.txt")
    monkeypatch.setattr(volume_content, "MAX_ENTRIES", 3)
    with pytest.raises(errors.PayloadTooLarge, match="more than 3 entries"):
        volume_content.list_dir(tree, "/", 3)
    with pytest.raises(errors.BadRequest, match="depth"):
        volume_content.list_dir(tree, "/", volume_content.MAX_DEPTH + 1)
