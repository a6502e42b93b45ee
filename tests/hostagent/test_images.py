"""The image cache: what is offered, atomic builds under a lock, reuse, and failures that leave nothing."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from paddock_core.rootfs import ROOT_IMAGES_BY_NAME
from paddock_hostagent import images
from paddock_hostagent.client import HostAgentClient
from paddock_hostagent.images import ImageBuildError, ImageStore, UnknownImageError
from tests.hostagent.conftest import Sandboxes, image_cache, sh


def make_tarball(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "os-release").write_text("ID=alpine\n")
    (tree / "bin").mkdir()
    archive = tmp_path / "rootfs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=".")
    return archive


def test_without_mirrors_only_the_debian_images_are_offered(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    assert store.offered() == ["debian:13", "devbox:1", "code-interpreter:1", "desktop:1"]
    assert store.cached() == []
    with pytest.raises(UnknownImageError):
        store.build("alpine:3.20")
    with pytest.raises(UnknownImageError):
        store.build("windows:11")


def test_a_mirror_makes_an_image_buildable_and_the_build_is_cached(tmp_path: Path) -> None:
    archive = make_tarball(tmp_path)
    store = ImageStore(tmp_path / "cache", {"alpine:3.20": f"file://{archive}"})
    assert "alpine:3.20" in store.offered()
    rootfs = store.build("alpine:3.20")
    assert rootfs == tmp_path / "cache" / "alpine_3.20" / "rootfs"
    assert (rootfs / "etc" / "os-release").read_text() == "ID=alpine\n"
    assert (rootfs / "root").is_dir() and (rootfs / "tmp").stat().st_mode & 0o1777 == 0o1777
    assert store.cached() == ["alpine:3.20"]
    built_at = (rootfs.parent / "image.json").stat().st_mtime
    assert store.build("alpine:3.20") == rootfs
    assert (rootfs.parent / "image.json").stat().st_mtime == built_at  # reused, not rebuilt


def test_concurrent_builders_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_tarball(tmp_path)
    calls: list[float] = []
    original = images._extract_tarball

    def slow_extract(url: str, target: Path, log_path: Path) -> None:
        calls.append(time.monotonic())
        time.sleep(0.3)
        original(url, target, log_path)

    monkeypatch.setattr(images, "_extract_tarball", slow_extract)
    results: list[Path] = []

    def build() -> None:
        store = ImageStore(tmp_path / "cache", {"alpine:3.20": f"file://{archive}"})
        results.append(store.build("alpine:3.20"))

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and results[0].is_dir()


def test_an_image_is_rebuilt_when_its_recipe_changes(tmp_path: Path) -> None:
    """``make images`` and the tests reuse a host's cache: a build keyed only by the name never brought a
    package added to ``desktop:1`` to a host that had the image (the e2b-desktop SDK found no XFCE)."""
    first, second = make_tarball(tmp_path / "a"), make_tarball(tmp_path / "b")
    (tmp_path / "b" / "tree" / "etc" / "os-release").write_text("ID=alpine\nVERSION_ID=2\n")
    with tarfile.open(second, "w:gz") as tar:
        tar.add(tmp_path / "b" / "tree", arcname=".")
    rootfs = ImageStore(tmp_path / "cache", {"alpine:3.20": f"file://{first}"}).build("alpine:3.20")
    assert (rootfs / "etc" / "os-release").read_text() == "ID=alpine\n"
    store = ImageStore(tmp_path / "cache", {"alpine:3.20": f"file://{second}"})  # another recipe
    assert store.is_cached("alpine:3.20") and not store.is_current("alpine:3.20")
    assert store.build("alpine:3.20") == rootfs
    assert (rootfs / "etc" / "os-release").read_text() == "ID=alpine\nVERSION_ID=2\n"
    assert store.is_current("alpine:3.20")


def test_an_image_built_before_recipes_were_recorded_is_kept_only_if_it_has_every_package(
    tmp_path: Path,
) -> None:
    archive = make_tarball(tmp_path)
    store = ImageStore(tmp_path / "cache", {"debian:13": f"file://{archive}"})
    rootfs = store.build("debian:13")
    meta = rootfs.parent / "image.json"
    meta.write_text('{"name": "debian:13", "source": "old"}\n')  # as older builds wrote it
    assert not store.is_current("debian:13")  # no dpkg database: none of the recipe's packages
    status = rootfs / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    packages = ROOT_IMAGES_BY_NAME["debian:13"].packages
    stanzas = [f"Package: {pkg}\nStatus: install ok installed\nVersion: 1\n" for pkg in packages]
    status.write_text("\n".join(stanzas[1:]))
    assert not store.is_current("debian:13")  # one package missing
    status.write_text("\n".join(stanzas))
    assert store.is_current("debian:13")
    assert store.build("debian:13") == rootfs and meta.read_text().count("recipe") == 0  # kept as it is


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "cache", {"alpine:3.20": f"file://{tmp_path}/missing.tar.gz"})
    with pytest.raises(ImageBuildError):
        store.build("alpine:3.20")
    image_root = tmp_path / "cache" / "alpine_3.20"
    assert not (image_root / "rootfs").exists()
    assert [p.name for p in image_root.iterdir() if p.name.startswith("rootfs")] == []
    assert store.cached() == []


@pytest.mark.root
def test_debian_image_is_a_trixie_minbase_with_the_tools(debian_image: Path) -> None:
    assert "VERSION_CODENAME=trixie" in (debian_image / "etc" / "os-release").read_text()
    for tool in ("bash", "ps", "ip", "curl", "ping"):
        assert any((debian_image / d / tool).exists() for d in ("usr/bin", "bin", "usr/sbin", "sbin")), tool
    assert not (debian_image / "etc" / "resolv.conf").exists()  # written per sandbox
    assert "debian:13" in ImageStore(image_cache()).cached()


def test_cli_lists_images(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "paddock_hostagent.images", "list"],
        env={"PADDOCK_HOST_IMAGE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.splitlines() == [
        "debian:13\tbuildable",
        "devbox:1\tbuildable",
        "code-interpreter:1\tbuildable",
        "desktop:1\tbuildable",
    ]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("name", ["debian:13", "devbox:1"])
async def test_an_image_holds_everything_its_description_names(
    name: str, host: HostAgentClient, sandboxes: Sandboxes
) -> None:
    """``GET /v1/rootfs`` describes an image by these contents: each one's probe must pass in a sandbox."""
    image = ROOT_IMAGES_BY_NAME[name]
    created = await sandboxes.create(rootfs=name, mem_mib=1024)  # built on first use (minutes)
    missing = {}
    for content in image.contents:
        assert content.label in image.description
        result = await sh(host, created["id"], content.probe)
        if result["exit_code"] != 0:
            missing[content.label] = (result["stdout"] + result["stderr"])[-300:]
    assert not missing, missing
    # Neither image offers a container engine or an SSH server (devbox:1 once claimed both).
    absent = await sh(host, created["id"], "command -v docker podman containerd sshd; ls /usr/sbin/sshd")
    assert absent["stdout"] == "", absent


# -- a deleted template's image: kept while a sandbox boots from it, then dropped, across restarts ---


def install_template(store: ImageStore, debian_image: Path) -> str:
    """A template image as a build or a fetch leaves it (a hard-linked copy of debian:13)."""
    name = f"tpl_kept{secrets.token_hex(6)}"
    tree = store.image_dir / name / "rootfs.incoming"
    tree.parent.mkdir()
    subprocess.run(["cp", "-al", str(debian_image), str(tree)], check=True)
    store.install_template(name, tree, {"name": name, "source": "fetched"})
    return name


def test_a_deleted_template_is_no_longer_offered_but_still_boots_its_sandboxes(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    image = store.image_dir / "tpl_gone" / "rootfs"
    image.mkdir(parents=True)
    (image.parent / "image.json").write_text('{"name": "tpl_gone"}')
    assert store.templates() == ["tpl_gone"]
    assert store.mark_deleted("tpl_gone", "host-a") and not store.mark_deleted("debian:13", "host-a")
    assert store.templates() == [] and "tpl_gone" not in store.cached()  # not offered any more
    assert store.is_cached("tpl_gone")  # a fork of one of its sandboxes still finds it
    assert ImageStore(tmp_path).deleted_templates("host-a") == ["tpl_gone"]  # the mark is on disk
    # Another agent sharing the image directory leaves it to the one whose sandboxes may use it.
    assert ImageStore(tmp_path).deleted_templates("host-b") == []


@pytest.mark.root
async def test_a_deleted_templates_image_goes_with_its_last_sandbox_after_a_restart(
    make_agent: Any, debian_image: Path
) -> None:
    """The delete reaches the host while a sandbox boots from the image; the agent restarts; the image
    goes when that sandbox does (it stayed for ever: the mark was only in the old agent's memory)."""
    store = ImageStore(image_cache())
    name = install_template(store, debian_image)
    agent = make_agent(pool_size=0)
    try:
        agent.start()
        async with agent.client() as host:
            created = await Sandboxes(host, agent).create(rootfs=name)
            await host.delete_build(name)
            assert store.is_cached(name) and name not in (await host.info()).rootfses
        agent.stop()
        agent.process = None
        agent.start()
        async with agent.client() as host:
            still = await sh(host, created["id"], "echo still-here")
            assert still["stdout"] == "still-here\n", still
            await host.destroy_sandbox(created["id"])
        assert not (store.image_dir / name).exists()
    finally:
        shutil.rmtree(store.image_dir / name, ignore_errors=True)


@pytest.mark.root
async def test_a_template_deleted_while_its_last_sandbox_went_with_the_agent_down_is_dropped_at_start(
    make_agent: Any, debian_image: Path
) -> None:
    store = ImageStore(image_cache())
    name = install_template(store, debian_image)
    try:
        agent = make_agent(pool_size=0)
        store.mark_deleted(name, f"test-{agent.nft_table}")  # as a delete received before a crash leaves it
        agent.start()
        assert not (store.image_dir / name).exists()
    finally:
        shutil.rmtree(store.image_dir / name, ignore_errors=True)
