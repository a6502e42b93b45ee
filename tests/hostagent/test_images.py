"""The image cache: what is offered, atomic builds under a lock, reuse, and failures that leave nothing."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

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
