"""A recipe's symbolic links (``desktop:1``'s ``/opt/noVNC`` for the e2b-desktop SDK's stream): made inside
the new tree after its packages, part of the recipe's digest, and never followed out of the tree."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from paddock_core.rootfs import ROOT_IMAGES_BY_NAME
from paddock_hostagent import images
from paddock_hostagent.drivers.storage.safepaths import TenantPathError


def test_the_desktop_recipe_links_novnc_where_the_sdk_runs_it() -> None:
    recipe = images.CATALOG["desktop:1"]
    assert ("opt/noVNC", "/usr/share/novnc") in recipe.links
    assert recipe.links == ROOT_IMAGES_BY_NAME["desktop:1"].links
    unlinked = dataclasses.replace(recipe, links=())
    assert images.recipe_digest(recipe, images.DEBIAN_MIRROR) != images.recipe_digest(
        unlinked, images.DEBIAN_MIRROR
    )
    assert images.CATALOG["debian:13"].links == () and images.CATALOG["debian:13"].files == ()
    assert {file[0] for file in recipe.files} == {"etc/chromium.d/paddock", "usr/local/bin/xdg-open"}


def test_links_are_made_inside_the_tree_replacing_what_is_in_their_place(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "usr/share/novnc/utils").mkdir(parents=True)
    (root / "usr/share/novnc/vnc.html").write_text("<title>noVNC</title>")
    (root / "srv").mkdir()
    (root / "srv/old").write_text("in the way")
    images._add_to_tree(root, (("opt/noVNC", "/usr/share/novnc"), ("srv/old", "/usr/share/novnc/vnc.html")))
    assert os.readlink(root / "opt/noVNC") == "/usr/share/novnc"
    assert os.readlink(root / "srv/old") == "/usr/share/novnc/vnc.html"
    images._add_to_tree(
        root, (), (("etc/chromium.d/paddock", "export X=1\n", 0o644), ("usr/local/bin/x", "", 0o755))
    )
    assert (root / "etc/chromium.d/paddock").read_text() == "export X=1\n"
    assert (root / "usr/local/bin/x").stat().st_mode & 0o777 == 0o755


def test_a_link_under_a_symlink_out_of_the_tree_never_lands_outside_it(tmp_path: Path) -> None:
    root, outside = tmp_path / "rootfs", tmp_path / "host"
    root.mkdir()
    outside.mkdir()
    (root / "opt").symlink_to(outside)  # absolute: inside the tree it names <root>/<tmp_path>/host, not there
    with pytest.raises(TenantPathError):
        images._add_to_tree(root, (("opt/noVNC", "/usr/share/novnc"),))
    assert list(outside.iterdir()) == []
    (root / str(outside).lstrip("/")).mkdir(parents=True)  # now the link resolves inside the tree
    images._add_to_tree(root, (("opt/noVNC", "/usr/share/novnc"),))
    assert list(outside.iterdir()) == []
    assert os.readlink(root / str(outside).lstrip("/") / "noVNC") == "/usr/share/novnc"
