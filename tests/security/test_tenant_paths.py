"""Root on the host never follows a tenant's symlinks (issue #29, rule 3).

The host agent is root, and it works inside trees a tenant controls: it finishes images a tenant built
(templates), writes /etc/hostname, hosts and resolv.conf into a sandbox's disk at every boot (a fork's
disk is whatever its source made of it), and unpacks a template fetched from another host. Each probe
points a tenant's symlink at a directory the probe owns on the host and checks that the directory is
untouched afterwards: its mode, its files and their contents."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import io
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import tarfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent import errors
from paddock_hostagent.client import HostAgentError
from paddock_hostagent.drivers.runtime.oci import GVISOR_SOCKET_DIR
from paddock_hostagent.drivers.runtime.ocispec import (
    GUEST_SOCKET_DIR,
    GUEST_SOCKET_NAME,
    write_identity_files,
)
from paddock_hostagent.drivers.storage import safepaths
from paddock_hostagent.drivers.storage.safepaths import TenantPathError, Tree
from paddock_hostagent.image_transfer import ImageFetcher
from paddock_hostagent.images import ImageStore
from paddock_hostagent.schemas import ForkBody, fetch_limit
from tests.hostagent.conftest import (
    AgentProcess,
    Sandboxes,
    debian_image,
    guest_binary_dir,
    image_cache,
    make_agent,
    sh,
    teardown_agent,
)

__all__ = ["debian_image", "guest_binary_dir", "make_agent"]  # session fixtures, shared with tests/hostagent

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


# -- a template fetched from another host (image_transfer.py): the tar is a tenant's tree ----------


class ImageSource:
    """A stand-in for the host that holds the template: answers ``GET /internal/v1/images/{id}`` with
    the tar it is given, on 127.0.0.1."""

    def __init__(self, tar_bytes: bytes, *, declare_length: bool = True) -> None:
        body = tar_bytes

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # without a length the body ends with the connection

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-tar")
                if declare_length:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(ConnectionError):
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def image_tar(name: str, members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    """An image directory's tar as a host agent streams it: ``image.json`` and ``rootfs/…``."""
    meta = json.dumps({"name": name, "source": "template"}).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("image.json")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
        for member, data in members:
            member.size = len(data) if member.isreg() else 0
            tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return buffer.getvalue()


def member(
    name: str, kind: bytes = tarfile.REGTYPE, *, link: str = "", mode: int = 0o644, **attrs: int
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = mode
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


async def fetch(tmp_path: Path, name: str, tar_bytes: bytes) -> tuple[ImageStore, Exception | None]:
    store = ImageStore(tmp_path / "images")
    source = ImageSource(tar_bytes)
    try:
        await ImageFetcher(store, HOST_FETCH_MAX_BYTES).fetch(name, source.url, "Bearer probe")
    except errors.BadRequest as exc:
        return store, exc
    finally:
        source.close()
    return store, None


#: The fetching host's own bound in these probes (``image_fetch_max_mib``).
HOST_FETCH_MAX_BYTES = 24 << 20


@pytest.mark.parametrize("by", ["template's recorded size", "host's setting", "declared length"])
async def test_a_fetched_image_past_its_bound_is_refused_and_leaves_nothing(tmp_path: Path, by: str) -> None:
    """A fetch is bounded by the template's recorded size with a margin (what the control plane sends)
    and by the host's setting; past it, a 413 naming the limit, and nothing unpacked stays (the old
    code took whatever the source sent, up to the host's disk)."""
    name = template_name()
    big = b"z" * (40 << 20)
    tar_bytes = image_tar(
        name, [(member("rootfs", tarfile.DIRTYPE, mode=0o755), b""), (member("rootfs/big"), big)]
    )
    limit = {"template's recorded size": fetch_limit(1 << 20), "host's setting": None}.get(by)
    store = ImageStore(tmp_path / "images")
    source = ImageSource(tar_bytes, declare_length=by == "declared length")
    try:
        with pytest.raises(errors.PayloadTooLarge, match="over the fetch's limit") as refused:
            await ImageFetcher(store, HOST_FETCH_MAX_BYTES).fetch(name, source.url, "Bearer probe", limit)
    finally:
        source.close()
    assert str(limit or HOST_FETCH_MAX_BYTES) in refused.value.message
    assert not store.is_cached(name) and not (store.image_dir / name).exists()
    assert limit is None or limit < HOST_FETCH_MAX_BYTES  # the recorded size's bound is the tighter one
    # Within its bound the same image is fetched (40 MiB of tar against a template of 40 MiB of ext4).
    source = ImageSource(tar_bytes)
    try:
        await ImageFetcher(store, 128 << 20).fetch(name, source.url, "Bearer probe", fetch_limit(40 << 20))
    finally:
        source.close()
    assert (store.rootfs_path(name) / "big").stat().st_size == len(big)


def template_name() -> str:
    return f"tpl_probe{secrets.token_hex(6)}"


async def test_a_fetched_image_whose_rootfs_is_a_symlink_to_a_host_dir_is_refused(tmp_path: Path) -> None:
    """The old ``tar -x`` made the symlink, the agent finished the host directory it pointed at as an
    image (tmp/ 1777, root/, run/, etc/ inside it) and installed the symlink as the image's rootfs:
    sandboxes of that template would have booted on the host's directory."""
    host_dir = probe_dir(tmp_path / "host-dir")
    name = template_name()
    tar_bytes = image_tar(name, [(member("rootfs", tarfile.SYMTYPE, link=str(host_dir)), b"")])

    store, refused = await fetch(tmp_path, name, tar_bytes)

    assert isinstance(refused, errors.BadRequest) and "rootfs" in refused.message
    assert not store.is_cached(name) and not (store.image_dir / name).exists()
    assert_untouched(host_dir)


async def test_a_fetched_image_brings_no_device_node_onto_the_host(tmp_path: Path) -> None:
    """A block device node for a host disk, 0666, in the image directory would open that disk to any
    user of the host who can reach the directory."""
    name = template_name()
    tar_bytes = image_tar(
        name,
        [
            (member("rootfs", tarfile.DIRTYPE, mode=0o755), b""),
            (member("rootfs/dev", tarfile.DIRTYPE, mode=0o755), b""),
            (member("rootfs/dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3), b""),
            (member("rootfs/root", tarfile.DIRTYPE, mode=0o700), b""),
            (member("rootfs/root/disk", tarfile.BLKTYPE, mode=0o666, devmajor=7, devminor=0), b""),
            (member("rootfs/etc", tarfile.DIRTYPE, mode=0o755), b""),
            (member("rootfs/etc/os-release"), b"ID=probe\n"),
        ],
    )

    store, refused = await fetch(tmp_path, name, tar_bytes)

    assert refused is None and store.is_cached(name)
    rootfs = store.rootfs_path(name)
    nodes = [
        path
        for path in rootfs.rglob("*")
        if stat.S_ISCHR(path.lstat().st_mode) or stat.S_ISBLK(path.lstat().st_mode)
    ]
    assert nodes == []
    assert (rootfs / "etc" / "os-release").read_bytes() == b"ID=probe\n"


async def test_a_fetched_image_keeps_owners_modes_and_links(tmp_path: Path) -> None:
    """What a root filesystem needs survives the unpack: set-id bits, owners, symlinks (absolute ones
    too: they lead inside the sandbox), hard links, times."""
    name = template_name()
    tool = b"#!/bin/sh\necho tool\n"
    tar_bytes = image_tar(
        name,
        [
            (member("rootfs", tarfile.DIRTYPE, mode=0o755), b""),
            (member("rootfs/usr", tarfile.DIRTYPE, mode=0o755, mtime=1_600_000_000), b""),
            (member("rootfs/usr/bin", tarfile.DIRTYPE, mode=0o755), b""),
            (member("rootfs/usr/bin/su", mode=0o4755), tool),
            (member("rootfs/usr/bin/su-again", tarfile.LNKTYPE, link="rootfs/usr/bin/su"), b""),
            (member("rootfs/home", tarfile.DIRTYPE, mode=0o755), b""),
            (member("rootfs/home/user", tarfile.DIRTYPE, mode=0o750, uid=1000, gid=1000), b""),
            (
                member("rootfs/home/user/notes", mode=0o600, uid=1000, gid=1000, mtime=1_500_000_000),
                b"mine\n",
            ),
            (member("rootfs/bin", tarfile.SYMTYPE, link="/usr/bin"), b""),
        ],
    )

    store, refused = await fetch(tmp_path, name, tar_bytes)

    assert refused is None, refused
    rootfs = store.rootfs_path(name)
    su = (rootfs / "usr" / "bin" / "su").stat()
    assert stat.S_IMODE(su.st_mode) == 0o4755 and su.st_nlink == 2
    assert (rootfs / "usr" / "bin" / "su-again").read_bytes() == tool
    notes = (rootfs / "home" / "user" / "notes").stat()
    assert (notes.st_uid, notes.st_gid, stat.S_IMODE(notes.st_mode), notes.st_mtime) == (
        1000,
        1000,
        0o600,
        1.5e9,
    )
    home = (rootfs / "home" / "user").stat()
    assert (home.st_uid, stat.S_IMODE(home.st_mode)) == (1000, 0o750)
    assert (rootfs / "usr").stat().st_mtime == 1.6e9
    assert os.readlink(rootfs / "bin") == "/usr/bin"
    assert stat.S_IMODE((rootfs / "tmp").stat().st_mode) == 0o1777  # finished like any template


@pytest.mark.parametrize(
    "hostile",
    [
        [(member("/rootfs/x"), b"x")],
        [(member("rootfs/../../escaped"), b"x")],
        [(member("elsewhere/x"), b"x")],
        [
            (member("rootfs", tarfile.DIRTYPE), b""),
            (member("rootfs/l", tarfile.LNKTYPE, link="../outside"), b""),
        ],
        [
            (member("rootfs", tarfile.DIRTYPE), b""),
            (member("rootfs/etc", tarfile.SYMTYPE, link="/tmp"), b""),
            (member("rootfs/etc/written-through"), b"x"),
        ],
    ],
    ids=["absolute", "dot-dot", "outside-rootfs", "hard-link-out", "beneath-a-symlink"],
)
async def test_members_outside_the_image_are_refused(
    tmp_path: Path, hostile: list[tuple[tarfile.TarInfo, bytes]]
) -> None:
    name = template_name()
    store, refused = await fetch(tmp_path, name, image_tar(name, hostile))
    assert isinstance(refused, errors.BadRequest), refused
    assert not store.is_cached(name) and not (store.image_dir / name).exists()
    assert not Path("/tmp/written-through").exists() and not (tmp_path / "escaped").exists()


# -- live: a sandbox booted from such an image, and a fork of a sandbox that made /etc a symlink ------


@pytest.fixture(scope="module")
def tenant_agent(debian_image: Path, guest_binary_dir: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(
        state_dir=Path(f"/tmp/pdkt-{secrets.token_hex(3)}"), guest_dir=guest_binary_dir, pool_size=1
    )
    agent.start()
    try:
        yield agent
    finally:
        teardown_agent(agent)


@pytest.fixture
async def boxes(tenant_agent: AgentProcess) -> AsyncIterator[Sandboxes]:
    async with tenant_agent.client() as host:
        tracker = Sandboxes(host, tenant_agent)
        try:
            yield tracker
        finally:
            await tracker.destroy_all()


@pytest.fixture
def host_dirs(tmp_path: Path) -> tuple[Path, Path]:
    return probe_dir(tmp_path / "host-tmp"), probe_dir(tmp_path / "host-etc")


@pytest.fixture
def tenant_template(debian_image: Path, host_dirs: tuple[Path, Path]) -> Iterator[str]:
    """A template (as a tenant's build leaves it) of debian:13 whose /tmp and /etc are symlinks to the
    probe's host directories, installed as the builder installs one."""
    host_tmp, host_etc = host_dirs
    store = ImageStore(image_cache())
    name = template_name()
    tree = store.image_dir / name / "rootfs.incoming"
    tree.parent.mkdir()
    try:
        subprocess.run(["cp", "-al", str(debian_image), str(tree)], check=True)  # hard links: instant
        shutil.rmtree(tree / "tmp")
        (tree / "tmp").symlink_to(host_tmp)
        os.rename(tree / "etc", tree.parent / "etc.moved")  # the links stay apart, removed below
        (tree / "etc").symlink_to(host_etc)
        store.install_template(name, tree, {"name": name, "source": "probe"})
        yield name
    finally:
        shutil.rmtree(store.image_dir / name, ignore_errors=True)


@pytest.mark.root
async def test_a_sandbox_of_an_image_with_symlinked_tmp_and_etc_leaves_the_host_dirs_alone(
    tenant_template: str, host_dirs: tuple[Path, Path], boxes: Sandboxes
) -> None:
    # (the template's fixture first: its image is removed after the sandboxes that boot from it)
    created = await boxes.create(rootfs=tenant_template, name="probe-box")
    out = await sh(
        boxes.host, created["id"], "cat /etc/hostname; stat -c %a /tmp; echo x > /tmp/t && echo ok"
    )
    assert out["stdout"] == "probe-box\n1777\nok\n", out
    for directory in host_dirs:
        assert_untouched(directory)


@pytest.mark.root
async def test_a_fork_of_a_sandbox_whose_etc_is_a_symlink_to_a_host_dir_writes_nothing_there(
    boxes: Sandboxes, host_dirs: tuple[Path, Path]
) -> None:
    """The tenant replaces its /etc with a symlink to an absolute path; its disk's upper layer then
    holds that symlink, and the fork's boot writes /etc/hostname, hosts and resolv.conf into that layer."""
    _, host_etc = host_dirs
    source = await boxes.create(name="source-box")
    out = await sh(boxes.host, source["id"], f"rm -rf /etc && ln -s {host_etc} /etc && sync && echo done")
    assert out["stdout"] == "done\n", out
    fork_id = f"{source['id']}-fork"
    boxes.track(fork_id)
    with pytest.raises(HostAgentError, match="/etc"):
        await boxes.host.fork_sandbox(source["id"], ForkBody(new_id=fork_id, name="fork-box"))
    assert_untouched(host_etc)
    assert (await sh(boxes.host, source["id"], "echo alive"))["stdout"] == "alive\n"  # the source runs on


@pytest.fixture
def searchable_image_dir() -> Iterator[Path]:
    """An image directory every user of the host may search, as /var/lib/paddock/images is (pytest's
    own temporary directories are root's alone)."""
    directory = Path(f"/tmp/pdk-images-{secrets.token_hex(4)}")
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_templates_set_user_id_programs_are_out_of_reach_of_the_hosts_users(
    searchable_image_dir: Path,
) -> None:
    """A template may hold a set-user-id root program of the tenant's making (a RUN step's chmod u+s):
    under an image directory others may search, any local user of the host could run it as root."""
    store = ImageStore(searchable_image_dir)
    name = template_name()
    tree = store.image_dir / name / "rootfs.incoming"
    (tree / "usr" / "bin").mkdir(parents=True)
    program = tree / "usr" / "bin" / "rootshell"
    program.write_text("#!/bin/sh\nid -u\n")
    program.chmod(0o4755)
    store.install_template(name, tree, {"name": name})
    installed = store.rootfs_path(name) / "usr" / "bin" / "rootshell"
    assert stat.S_IMODE(installed.stat().st_mode) == 0o4755  # root in the sandbox still has it
    as_nobody = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "stat", str(installed)],
        capture_output=True,
        text=True,
    )
    assert as_nobody.returncode != 0 and "Permission denied" in as_nobody.stderr


# -- live, gVisor: the guest's socket is in a directory the sandbox shares read-write with the host ----


@pytest.fixture
def host_listener() -> Iterator[tuple[Path, list[int]]]:
    """A probe-owned unix listener on the host, standing for any host service on a unix socket (the
    agent's own API, a container runtime's): it counts the connections it accepts."""
    directory = Path(f"/tmp/pdk-probe-{secrets.token_hex(4)}")
    directory.mkdir(mode=0o755)
    path = directory / "host.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    listener.settimeout(0.2)
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path, accepted
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.root
@pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc is not installed")
async def test_a_gvisor_guest_socket_replaced_by_a_symlink_to_a_host_socket_is_not_followed(
    make_agent: Any, host_listener: tuple[Path, list[int]]
) -> None:
    """On gVisor the guest agent binds its socket in a host directory bound read-write into the
    sandbox (ocispec.GUEST_SOCKET_DIR), and the root agent connects to it by name. A tenant's symlink
    in that directory lands in the host's directory as a symlink. runsc 2022 refuses the sandbox an
    unlink or a rename over the bound socket (EPERM), so where it does, the test moves the tenant's own
    symlink over the socket's name on the host, the one step that runsc keeps from the tenant. The
    agent's next connects must refuse the symlink, not reach the listener (on the old code they
    connected there)."""
    probe_socket, accepted = host_listener
    agent = make_agent(runtime="runsc", pool_size=0)
    agent.start()
    async with agent.client() as host:
        boxes = Sandboxes(host, agent)
        try:
            box = await boxes.create()
            swap = (
                f"cd {GUEST_SOCKET_DIR} && ln -s {probe_socket} planted && "
                f"(perl -e 'rename(q(planted), q({GUEST_SOCKET_NAME})) or die qq(refused: $!)' 2>&1; true)"
            )
            out = await sh(host, box["id"], swap)
            assert out["exit_code"] == 0, out
            shared = next(agent.state_dir.glob(f"slots/*/{GVISOR_SOCKET_DIR}"))
            socket_path = shared / GUEST_SOCKET_NAME
            if not socket_path.is_symlink():  # the sandbox's rename was refused (runsc 2022)
                assert "refused" in out["stdout"], out
                planted = shared / "planted"
                assert planted.is_symlink() and os.readlink(planted) == str(probe_socket), (
                    "the tenant's symlink did not land in the host's directory"
                )
                os.rename(planted, socket_path)
            assert os.readlink(socket_path) == str(probe_socket)
            # Several at once: one may take the kept connection, the rest must connect anew.
            results = await asyncio.gather(
                *(host.exec(box["id"], cmd="true", args=[], env={}) for _ in range(4)), return_exceptions=True
            )
            assert accepted == [], (
                f"the root agent connected to a host socket through a tenant's symlink: {results}"
            )
            refused = [r for r in results if isinstance(r, HostAgentError)]
            assert refused and all("not a socket" in str(r) for r in refused), results
        finally:
            await boxes.destroy_all()
