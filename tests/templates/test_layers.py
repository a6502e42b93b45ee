"""A template's tree made from its base's tree, hard-linked, plus the build's layers
(``drivers/build/layers.py``), on a real filesystem: the layers here are made as containers/storage
unpacks them (whiteouts are 0/0 character devices, an opaque directory has ``trusted.overlay.opaque``),
which needs root. The live module (``test_live_templates.py``) builds one with buildah and boots it."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from paddock_hostagent.drivers.build.layers import (
    OPAQUE,
    REDIRECT,
    LayerFormatError,
    apply_layers,
    layers_above,
    link_tree,
)

pytestmark = pytest.mark.root


def whiteout(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))


def listing(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's mode, owner and text, a symlink's target, a directory's mode."""
    seen: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        rel = str(path.relative_to(root))
        if path.is_symlink():
            seen[rel] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            seen[rel] = f"dir {info.st_mode & 0o7777:o}"
        else:
            seen[rel] = f"{info.st_mode & 0o7777:o} {info.st_uid}:{info.st_gid} {path.read_text()}"
    return seen


@pytest.fixture
def base(tmp_path: Path) -> Path:
    root = tmp_path / "base"
    (root / "etc" / "apt").mkdir(parents=True)
    (root / "etc" / "apt" / "sources.list").write_text("deb\n")
    (root / "etc" / "apt" / "keep").write_text("keep\n")
    (root / "bin").mkdir()
    (root / "bin" / "env").write_text("env\n")
    (root / "bin" / "env").chmod(0o755)
    (root / "gone").mkdir()
    (root / "gone" / "x").write_text("x\n")
    (root / "lib").symlink_to("/etc")  # absolute: leads to the host's /etc if ever followed there
    (root / "licenses").mkdir()
    (root / "version").write_text("13\n")
    return root


def test_layers_apply_as_overlayfs_stacks_them_and_the_base_stays_as_it_was(
    base: Path, tmp_path: Path
) -> None:
    before = listing(base)
    one = tmp_path / "one"
    (one / "bin").mkdir(parents=True)
    (one / "bin" / "env").write_text("env\n")  # a chmod's copy-up: the whole file, new mode and owner
    os.chown(one / "bin" / "env", 12, 34)
    (one / "bin" / "env").chmod(0o4711)  # after the chown, which would clear set-user-id
    (one / "srv").mkdir()
    (one / "srv" / "a").write_text("a\n")
    os.link(one / "srv" / "a", one / "srv" / "b")
    (one / "srv" / "c").symlink_to("a")
    whiteout(one / "gone")  # a directory deleted
    (one / "lib").mkdir()  # the base's symlink replaced by a directory
    (one / "lib" / "new").write_text("in a real directory\n")
    two = tmp_path / "two"
    (two / "etc" / "apt").mkdir(parents=True)  # deleted and made again: opaque
    os.setxattr(two / "etc" / "apt", OPAQUE, b"y")
    (two / "etc" / "apt" / "only").write_text("only\n")
    whiteout(two / "srv" / "b")  # a file of the layer below deleted
    (two / "licenses").write_text("a file now\n")  # a directory replaced by a file
    (two / "version").mkdir()  # a file replaced by a directory
    (two / "version" / "now").write_text("14\n")

    tree = tmp_path / "tree"
    asyncio.run(link_tree(base, tree))
    asyncio.run(apply_layers([one, two], tree))

    assert listing(tree) == {
        "bin": "dir 755",
        "bin/env": "4711 12:34 env\n",
        "etc": "dir 755",
        "etc/apt": "dir 755",
        "etc/apt/only": "644 0:0 only\n",
        "lib": "dir 755",
        "lib/new": "644 0:0 in a real directory\n",
        "licenses": "644 0:0 a file now\n",
        "srv": "dir 755",
        "srv/a": "644 0:0 a\n",
        "srv/c": "-> a",
        "version": "dir 755",
        "version/now": "644 0:0 14\n",
    }
    assert OPAQUE not in os.listxattr(tree / "etc" / "apt")  # no overlay mark left in the tree
    # The base's files were linked, never written through: the base reads as before.
    assert listing(base) == before
    assert (tree / "etc" / "apt").stat().st_ino != (base / "etc" / "apt").stat().st_ino


def test_hard_links_within_a_layer_stay_links_and_unchanged_files_stay_the_bases(
    base: Path, tmp_path: Path
) -> None:
    layer = tmp_path / "layer"
    (layer / "srv").mkdir(parents=True)
    (layer / "srv" / "run.sh").write_text("run\n")
    os.link(layer / "srv" / "run.sh", layer / "srv" / "hard.sh")
    tree = tmp_path / "tree"
    asyncio.run(link_tree(base, tree))
    asyncio.run(apply_layers([layer], tree))
    assert (tree / "srv" / "run.sh").stat().st_ino == (tree / "srv" / "hard.sh").stat().st_ino
    assert (tree / "srv" / "run.sh").stat().st_nlink == 2
    assert (tree / "etc" / "apt" / "keep").stat().st_ino == (base / "etc" / "apt" / "keep").stat().st_ino


def test_a_redirected_directory_is_refused(base: Path, tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    (layer / "moved").mkdir(parents=True)
    os.setxattr(layer / "moved", REDIRECT, b"/gone")
    tree = tmp_path / "tree"
    asyncio.run(link_tree(base, tree))
    with pytest.raises(LayerFormatError, match="redirected"):
        asyncio.run(apply_layers([layer], tree))


def test_the_layers_above_the_base_come_bottom_first_and_only_when_the_image_stands_on_it(
    tmp_path: Path,
) -> None:
    storage = tmp_path / "storage"
    (storage / "overlay-images").mkdir(parents=True)
    (storage / "overlay-layers").mkdir()
    base, one, two, other = ("a" * 64), ("b" * 64), ("c" * 64), ("d" * 64)
    images = [
        {"id": "1", "names": ["localhost/base:latest"], "layer": base},
        {"id": "2", "names": ["localhost/tpl:latest"], "layer": two},
        {"id": "3", "names": ["localhost/other:latest"], "layer": other},
    ]
    layers = [{"id": base}, {"id": one, "parent": base}, {"id": two, "parent": one}, {"id": other}]
    (storage / "overlay-images" / "images.json").write_text(json.dumps(images))
    (storage / "overlay-layers" / "layers.json").write_text(json.dumps(layers))
    assert layers_above(storage, "localhost/tpl:latest", "localhost/base:latest") == [
        storage / "overlay" / one / "diff",
        storage / "overlay" / two / "diff",
    ]
    assert layers_above(storage, "localhost/other:latest", "localhost/base:latest") is None
    assert layers_above(storage, "localhost/missing:latest", "localhost/base:latest") is None


def test_the_base_may_be_in_another_store(tmp_path: Path) -> None:
    """A catalog base is in the host's catalog store (``basestore.py``), the build's layers in the
    account's: the chain ends at the base's top layer, named in the other store's images."""
    account, catalog = tmp_path / "account", tmp_path / "catalog"
    for store in (account, catalog):
        (store / "overlay-images").mkdir(parents=True)
        (store / "overlay-layers").mkdir()
    base, one, stranger = ("a" * 64), ("b" * 64), ("e" * 64)
    (catalog / "overlay-images" / "images.json").write_text(
        json.dumps([{"id": "1", "names": ["localhost/paddock-base/debian_13:0123"], "layer": base}])
    )
    (catalog / "overlay-layers" / "layers.json").write_text(json.dumps([{"id": base}]))
    (account / "overlay-images" / "images.json").write_text(
        json.dumps(
            [
                {"id": "2", "names": ["localhost/tpl:latest"], "layer": one},
                # the account's own image of the same name is not the base the build read
                {"id": "3", "names": ["localhost/paddock-base/debian_13:0123"], "layer": stranger},
            ]
        )
    )
    (account / "overlay-layers" / "layers.json").write_text(
        json.dumps([{"id": one, "parent": base}, {"id": stranger}])
    )
    tag, base_tag = "localhost/tpl:latest", "localhost/paddock-base/debian_13:0123"
    assert layers_above(account, tag, base_tag, catalog) == [account / "overlay" / one / "diff"]
    assert layers_above(account, tag, base_tag) is None  # looked up in the account's store
    assert layers_above(account, tag, base_tag, tmp_path / "nowhere") is None
