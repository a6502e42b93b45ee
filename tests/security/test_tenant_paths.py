"""Root on the host never follows a tenant's symlinks (issue #29, rule 3).

The host agent is root, and it works inside trees a tenant controls: it finishes images a tenant built
(templates), writes /etc/hostname, hosts and resolv.conf into a sandbox's disk at every boot (a fork's
disk is whatever its source made of it), and unpacks a template fetched from another host. Each probe
points a tenant's symlink at a directory the probe owns on the host and checks that the directory is
untouched afterwards: its mode, its files and their contents."""

from __future__ import annotations

import io
import os
import secrets
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.drivers import safepaths
from paddock_hostagent.drivers.ocispec import write_identity_files
from paddock_hostagent.drivers.safepaths import TenantPathError, Tree
from paddock_hostagent.images import ImageStore

PROBE_FILES = {"hostname": "the-host\n", "resolv.conf": "nameserver 192.0.2.53\n", "passwd": "root:x:0:0\n"}


def probe_dir(path: Path) -> Path:
    """A host directory a tenant's symlink will aim at: mode 0755, three files."""
    path.mkdir(parents=True)
    path.chmod(0o755)
    for name, content in PROBE_FILES.items():
        (path / name).write_text(content)
    return path


def assert_untouched(path: Path) -> None:
    assert stat.S_IMODE(path.stat().st_mode) == 0o755, f"{path} had its mode changed"
    assert sorted(entry.name for entry in path.iterdir()) == sorted(PROBE_FILES), (
        f"{path} gained or lost files"
    )
    for name, content in PROBE_FILES.items():
        assert (path / name).read_text() == content, f"{path / name} was rewritten"


@pytest.fixture(params=["openat2", "component-walk"])
def resolution(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each probe runs with the kernel's openat2 and with the walk used where the kernel lacks it."""
    before = safepaths._openat2_works
    safepaths._openat2_works = None if request.param == "openat2" else False
    try:
        yield str(request.param)
    finally:
        safepaths._openat2_works = before


def tenant_tarball(tmp_path: Path, links: dict[str, str]) -> Path:
    """A root filesystem tarball with ``links`` (name -> target) among a few ordinary entries."""
    archive = tmp_path / f"tenant-{secrets.token_hex(3)}.tar"
    with tarfile.open(archive, "w") as tar:
        for name in ("bin", "usr", "var", "var/tmp"):
            tar.addfile(_dir(name))
        data = b"ID=probe\n"
        info = tarfile.TarInfo("usr/os-release")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            link = tarfile.TarInfo(name)
            link.type = tarfile.SYMTYPE
            link.linkname = target
            tar.addfile(link)
    return archive


def _dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info


# -- finishing an image: /tmp made 1777, /etc/hostname and /etc/resolv.conf removed ----------------


def test_finishing_an_image_whose_tmp_and_etc_point_at_host_dirs_leaves_them_alone(
    tmp_path: Path, resolution: str
) -> None:
    host_tmp = probe_dir(tmp_path / "host-tmp")
    host_etc = probe_dir(tmp_path / "host-etc")
    archive = tenant_tarball(tmp_path, {"tmp": str(host_tmp), "etc": str(host_etc)})
    store = ImageStore(tmp_path / "images", {"alpine:3.20": f"file://{archive}"})

    rootfs = store.build("alpine:3.20")

    assert_untouched(host_tmp)
    assert_untouched(host_etc)
    # The image got the directories a sandbox needs, in place of symlinks that led nowhere inside it.
    for name in ("tmp", "etc", "run", "root"):
        assert (rootfs / name).is_dir() and not (rootfs / name).is_symlink()
    assert stat.S_IMODE((rootfs / "tmp").lstat().st_mode) == 0o1777


def test_a_symlink_inside_the_image_is_followed_inside_it(tmp_path: Path, resolution: str) -> None:
    """/tmp -> /var/tmp (absolute) is the image's own /var/tmp, as a sandbox sees it."""
    archive = tenant_tarball(tmp_path, {"tmp": "/var/tmp", "etc": "../../../usr"})
    store = ImageStore(tmp_path / "images", {"alpine:3.20": f"file://{archive}"})
    rootfs = store.build("alpine:3.20")
    assert (rootfs / "tmp").is_symlink()
    assert stat.S_IMODE((rootfs / "var" / "tmp").stat().st_mode) == 0o1777
    assert (rootfs / "etc").is_symlink() and (rootfs / "usr" / "os-release").is_file()  # /etc is /usr


# -- identity files: written at every boot into the sandbox's disk, and through a claimed one's overlay --


def test_identity_files_never_reach_the_host_through_a_symlinked_etc(tmp_path: Path, resolution: str) -> None:
    host_etc = probe_dir(tmp_path / "host-etc")
    upper = tmp_path / "upper"
    upper.mkdir()
    (upper / "etc").symlink_to(host_etc)  # what `rm -rf /etc; ln -s <dir> /etc` leaves on a sandbox's disk

    with pytest.raises(TenantPathError, match="/etc"):
        write_identity_files(upper, hostname="box", ip="10.0.0.2", resolv_conf="nameserver 10.0.0.1\n")

    assert_untouched(host_etc)


def test_identity_files_replace_symlinks_in_their_place_instead_of_writing_through_them(
    tmp_path: Path, resolution: str
) -> None:
    host_etc = probe_dir(tmp_path / "host-etc")
    root = tmp_path / "merged"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").symlink_to(host_etc / "hostname")
    (root / "etc" / "hosts").symlink_to("../../../../../" + str(host_etc / "passwd"))
    (root / "etc" / ".resolv.conf.paddock").symlink_to(host_etc / "resolv.conf")  # the temporary's name

    write_identity_files(root, hostname="box", ip="10.0.0.2", resolv_conf="nameserver 10.0.0.1\n")

    assert_untouched(host_etc)
    assert (root / "etc" / "hostname").read_text() == "box\n" and not (root / "etc" / "hostname").is_symlink()
    assert "10.0.0.2\tbox\n" in (root / "etc" / "hosts").read_text()
    assert (root / "etc" / "resolv.conf").read_text() == "nameserver 10.0.0.1\n"
    assert stat.S_IMODE((root / "etc" / "hosts").stat().st_mode) == 0o644


def test_dot_dot_and_absolute_symlinks_stay_inside_the_tree(tmp_path: Path, resolution: str) -> None:
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "a" / "up").symlink_to("../../../../..")
    (root / "a" / "abs").symlink_to("/")
    with Tree.open(root) as tree:
        for path in ("a/up", "a/abs", "../../..", "a/up/a/abs/.."):
            with tree.directory(path) as fd:
                assert os.fstat(fd).st_ino == root.stat().st_ino, path


def test_without_following_a_symlink_on_the_way_is_refused(tmp_path: Path, resolution: str) -> None:
    root = tmp_path / "tree"
    (root / "real").mkdir(parents=True)
    (root / "link").symlink_to("real")
    with Tree.open(root, follow_symlinks=False) as tree:
        with tree.directory("real"):
            pass
        with pytest.raises(TenantPathError), tree.directory("link"):
            pass
