"""S3 disks: an s3fs FUSE mount per attachment, made on the host and moved into the sandbox.

s3fs (Debian's ``s3fs`` package) runs as a host process in its own session, outside every sandbox
cgroup and mount namespace: the credentials stay in a 0600 file in the agent's state directory, a
sandbox pause freezes none of it, and an agent restart leaves it running. But it runs in the
sandbox's *network* namespace (``drivers/storage/nsmount.py``'s ``s3fs`` command): the endpoint is the
tenant's to choose, so s3fs's connections, and its DNS queries (to the sandbox's resolver), leave
through the sandbox's veth under its egress rules, as the sandbox's own would; the host's loopback and
services are out of its reach. The mount is cloned into the sandbox's mount namespace at the requested
path (``drivers/storage/nsmount.py``).

Every s3fs option is built here from parsed fields (``paddock_core.s3config``), never from text a
user wrote: s3fs reads ``-o a=b,c=d``, so a comma in an endpoint would be another option.

Layout, per attachment: ``<state>/disks/<sandbox id>/<key>/mnt`` (the host mount point, a shared bind
of itself while mounted, so that s3fs's mount, made in its own mount namespace, lands there),
``<key>.passwd`` (``access:secret``, 0600) and ``<key>.log`` (s3fs's own stderr); ``<state>/disks/
resolv.conf`` and ``hosts`` are what s3fs resolves with (the sandboxes' resolver).

A mount is ``pending`` until s3fs has answered a directory listing of the bucket (or sub-folder),
``mounted`` then, or ``error`` with the reason s3fs gave: s3fs checks the bucket in its FUSE init, so a
wrong endpoint, bucket or key ends in its exit, which is awaited for at most ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from paddock_core import s3config, statefiles
from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import CommandFailedError
from paddock_hostagent.drivers.net.network import NETNS_DIR
from paddock_hostagent.drivers.storage import mounts, rootdisks

log = get_logger(__name__)

PENDING, MOUNTED, ERROR = "pending", "mounted", "error"
_S3_ERROR = re.compile(r"<Code>([^<]*)</Code>\s*<Message>([^<]*)</Message>")
_S3FS_REASON = re.compile(r"\[CRT\] s3fs\.cpp:s3fs_check_service\(\d+\): (.*)$", re.MULTILINE)
_CURL_FAILURE = re.compile(r"### (CURLE_[A-Z_]+)")


@dataclass
class S3Mount:
    """One attachment as the sandbox record keeps it (no credentials)."""

    disk_id: str
    mount_path: str
    sub_path: str | None
    bucket: str
    endpoint: str
    region: str | None
    use_path_style: bool
    status: str = PENDING
    error: str | None = None
    # Bound into the container at its start (gVisor: ``mount_at_boot``), not moved into a running one.
    at_boot: bool = False

    @property
    def key(self) -> str:
        """The attachment's directory name: one mount path holds one disk at a time."""
        return "m" + hashlib.sha256(self.mount_path.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> S3Mount:
        known = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in data.items() if key in known})


class S3Mounter:
    """Mounts S3 disks for sandboxes (the ``Mounter`` of the host agent)."""

    def __init__(
        self, state_dir: Path, *, resolv_conf: str, timeout_s: float = 20.0, binary: str = "s3fs"
    ) -> None:
        """``resolv_conf``: the sandboxes' ``/etc/resolv.conf`` (their resolver on the gateway)."""
        self.base = state_dir
        self.resolv_conf = resolv_conf
        self.timeout_s = timeout_s
        self.binary = shutil.which(binary) or binary
        self._processes: dict[Path, subprocess.Popen[bytes]] = {}

    def available(self) -> bool:
        return shutil.which(self.binary) is not None and Path("/dev/fuse").exists()

    def _dir(self, sandbox_id: str, mount: S3Mount) -> Path:
        return self.base / sandbox_id / mount.key

    def _mount_point(self, sandbox_id: str, mount: S3Mount) -> Path:
        return self._dir(sandbox_id, mount) / "mnt"

    def _passwd(self, sandbox_id: str, mount: S3Mount) -> Path:
        return self.base / sandbox_id / f"{mount.key}.passwd"

    def _log(self, sandbox_id: str, mount: S3Mount) -> Path:
        return self.base / sandbox_id / f"{mount.key}.log"

    # -- mounting -------------------------------------------------------------------------------

    async def mount(
        self, sandbox_id: str, mount: S3Mount, *, access_key: str, secret_key: str, ns_pid: int, netns: str
    ) -> None:
        """Mounts ``mount`` into the sandbox whose init is ``ns_pid``; sets its status and error.

        Never raises for a mount that fails: a disk that cannot be mounted is reported, and the
        sandbox goes on. The secret is written only to the passwd file.
        """
        self._write_passwd(sandbox_id, mount, access_key, secret_key)
        error = await self._mount(sandbox_id, mount, ns_pid, netns)
        self._settle(sandbox_id, mount, error, access_key, secret_key)

    async def mount_at_boot(
        self, sandbox_id: str, mount: S3Mount, *, access_key: str, secret_key: str, netns: str
    ) -> Path | None:
        """For a sandbox not started yet (gVisor): s3fs mounts the bucket on the host, from the sandbox's
        network namespace, and the container binds that directory at its start. Returns the directory
        when mounted (``mount`` then ``mounted``), else None with ``mount`` in ``error``."""
        mount.at_boot = True
        self._write_passwd(sandbox_id, mount, access_key, secret_key)
        error = await self._mount_on_host(sandbox_id, mount, netns)
        self._settle(sandbox_id, mount, error, access_key, secret_key)
        return self._mount_point(sandbox_id, mount) if error is None else None

    def _write_passwd(self, sandbox_id: str, mount: S3Mount, access_key: str, secret_key: str) -> None:
        statefiles.private_dir(self.base / sandbox_id)
        passwd = self._passwd(sandbox_id, mount)
        fd = os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, statefiles.FILE_MODE)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{access_key}:{secret_key}\n")
        os.chmod(passwd, statefiles.FILE_MODE)  # s3fs refuses a passwd file others can read

    def _settle(
        self, sandbox_id: str, mount: S3Mount, error: str | None, access_key: str, secret_key: str
    ) -> None:
        if error is not None:
            self._passwd(sandbox_id, mount).unlink(missing_ok=True)
            mount.status, mount.error = ERROR, _scrub(error, access_key, secret_key)
            log.warning("disk_mount_failed", sandbox_id=sandbox_id, disk_id=mount.disk_id, error=mount.error)
            return
        mount.status, mount.error = MOUNTED, None
        log.info("disk_mounted", sandbox_id=sandbox_id, disk_id=mount.disk_id, mount_path=mount.mount_path)

    async def _mount_on_host(self, sandbox_id: str, mount: S3Mount, netns: str) -> str | None:
        """s3fs's mount on the host mount point, and its probe; the reason when either fails."""
        try:
            argv = self._s3fs_argv(sandbox_id, mount)
        except ValueError as exc:  # a record from before these rules, or a caller that skipped them
            return f"disk refused: {exc}"
        point = self._mount_point(sandbox_id, mount)
        point.mkdir(parents=True, exist_ok=True)
        log_path = self._log(sandbox_id, mount)
        try:
            self._share(point)
        except (OSError, CommandFailedError) as exc:
            return f"cannot prepare the mount point: {exc}"
        error = await self._start_s3fs(mount, argv, point, log_path, NETNS_DIR / netns)
        if error is not None:
            await self._stop_host(point)
        return error

    async def _mount(self, sandbox_id: str, mount: S3Mount, ns_pid: int, netns: str) -> str | None:
        """The host mount, its probe and the move into the sandbox; the reason when any fails."""
        error = await self._mount_on_host(sandbox_id, mount, netns)
        if error is not None:
            return error
        point = self._mount_point(sandbox_id, mount)
        code, output = await _run(
            [
                sys.executable,
                "-m",
                "paddock_hostagent.drivers.storage.nsmount",
                "move",
                str(ns_pid),
                str(point),
                mount.mount_path,
            ]
        )
        if code != 0:
            await self._stop_host(point)
            return f"cannot mount at {mount.mount_path} in the sandbox: {output.strip().removeprefix('nsmount: ')}"
        return None

    def _s3fs_argv(self, sandbox_id: str, mount: S3Mount) -> list[str]:
        """s3fs's command line from the parsed fields; ValueError naming the field that fails."""
        fields: dict[str, Any] = {}
        for name, parse in (
            ("bucket", s3config.bucket),
            ("endpoint", s3config.endpoint),
            ("region", s3config.region),
            ("sub_path", s3config.sub_path),
            ("mount_path", s3config.mount_path),  # not s3fs's, but nsmount's
        ):
            value = getattr(mount, name)
            try:
                fields[name] = parse(value) if value is not None else None
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        source = fields["bucket"] + (f":/{fields['sub_path']}" if fields["sub_path"] else "")
        argv = [self.binary, source, str(self._mount_point(sandbox_id, mount)), "-f"]
        options = [
            f"url={fields['endpoint']}",
            f"passwd_file={self._passwd(sandbox_id, mount)}",
            "allow_other",
            "dbglevel=err",
            # Bounded: a wrong endpoint gives up after one retry and a few seconds, not minutes.
            "retries=2",
            "connect_timeout=5",
            "readwrite_timeout=60",
            "mp_umask=0022",
            # 128 KiB FUSE writes instead of 4 KiB: +20% sequential write measured (33 → 40 MB/s, host).
            "big_writes",
            "max_write=131072",
        ]
        if mount.use_path_style:
            options.append("use_path_request_style")
        if fields["region"]:
            options.append(f"endpoint={fields['region']}")
        for option in options:
            argv += ["-o", option]
        return argv

    def _resolver_files(self) -> tuple[Path, Path]:
        """The resolv.conf and hosts s3fs resolves with: the sandboxes' resolver, and localhost only."""
        statefiles.private_dir(self.base)
        resolv, hosts = self.base / "resolv.conf", self.base / "hosts"
        for path, text in ((resolv, self.resolv_conf), (hosts, "127.0.0.1 localhost\n")):
            if not path.exists() or path.read_text() != text:
                staged = path.with_suffix(".new")
                staged.write_text(text)
                os.chmod(staged, 0o644)  # s3fs reads them as root; nothing secret
                os.replace(staged, path)
        return resolv, hosts

    @staticmethod
    def _share(point: Path) -> None:
        """``point`` becomes a shared bind of itself: s3fs mounts in a copy of the host's mount
        namespace (its own resolver files), and a mount on a shared mount appears in its peers."""
        while mounts.top_fstype(point) is not None:  # a dead mount or bind left by an earlier agent
            mounts.unmount(point)
        mounts.mount(str(point), point, "", flags=mounts.MS_BIND)
        mounts.mount("none", point, "", flags=mounts.MS_SHARED)

    async def _start_s3fs(
        self, mount: S3Mount, s3fs_argv: list[str], point: Path, log_path: Path, netns: Path
    ) -> str | None:
        resolv, hosts = self._resolver_files()
        argv = [
            sys.executable,
            "-m",
            "paddock_hostagent.drivers.storage.nsmount",
            "s3fs",
            str(netns),
            str(resolv),
            str(hosts),
            str(point),
            "--",
            *s3fs_argv,
        ]
        with open(log_path, "wb") as log_file:
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    start_new_session=True,  # outlives the agent, which re-adopts it
                    close_fds=True,
                )
            except OSError as exc:
                return f"cannot start s3fs: {exc}"
        self._processes[point] = process
        deadline = time.monotonic() + self.timeout_s
        while not _fuse_at(point):  # ends: s3fs exits, or the deadline passes
            if process.poll() is not None:
                return _reason(mount, log_path, f"s3fs exited with {process.returncode}")
            if time.monotonic() > deadline:
                return f"s3fs did not mount bucket {mount.bucket!r} within {self.timeout_s:.0f}s"
            await asyncio.sleep(0.05)
        # s3fs checks the bucket in its FUSE init, which the first request waits for.
        try:
            await asyncio.wait_for(
                asyncio.to_thread(os.listdir, point), max(deadline - time.monotonic(), 1.0)
            )
        except TimeoutError:
            return f"{mount.endpoint} did not answer within {self.timeout_s:.0f}s"
        except OSError as exc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(process.wait, 2.0)
            return _reason(mount, log_path, f"listing the bucket failed: {exc.strerror}")
        await asyncio.sleep(0.05)
        if process.poll() is not None:
            return _reason(mount, log_path, f"s3fs exited with {process.returncode}")
        return None

    # -- unmounting and restoring ---------------------------------------------------------------

    async def unmount(self, sandbox_id: str, mount: S3Mount, *, ns_pid: int | None) -> None:
        """Removes the attachment from the sandbox (when it still runs) and from the host."""
        if ns_pid:
            code, output = await _run(
                [
                    sys.executable,
                    "-m",
                    "paddock_hostagent.drivers.storage.nsmount",
                    "umount",
                    str(ns_pid),
                    mount.mount_path,
                ]
            )
            if code != 0:
                log.warning("disk_unmount_in_sandbox_failed", sandbox_id=sandbox_id, error=output.strip())
        await self._stop_host(self._mount_point(sandbox_id, mount))
        self._passwd(sandbox_id, mount).unlink(missing_ok=True)
        self._log(sandbox_id, mount).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._dir(sandbox_id, mount).joinpath("mnt").rmdir()
            self._dir(sandbox_id, mount).rmdir()

    async def _stop_host(self, point: Path) -> None:
        """Unmounts the host mount point (s3fs's mount, then the shared bind under it); s3fs exits when
        its mount goes, and is killed if it lingers."""
        with contextlib.suppress(Exception):
            await asyncio.to_thread(_unmount_all, point)
        process = self._processes.pop(point, None)
        pids = [process.pid] if process is not None else _s3fs_pids(point)
        for pid in pids:
            if not await _wait_exit(pid, process, 5.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                await _wait_exit(pid, process, 2.0)

    async def release(self, sandbox_id: str, disks: list[S3Mount]) -> None:
        """The sandbox is gone: every host mount of it goes too, and its directory."""
        for mount in disks:
            await self.unmount(sandbox_id, mount, ns_pid=None)
        await self.prune_sandbox(sandbox_id)

    async def prune_sandbox(self, sandbox_id: str) -> None:
        directory = self.base / sandbox_id
        if not directory.is_dir():
            return
        for point in directory.glob("*/mnt"):
            await self._stop_host(point)
        shutil.rmtree(directory, ignore_errors=True)

    async def prune(self, keep: set[str]) -> None:
        """After a restart: mounts of sandboxes this agent no longer has are removed. The directory is
        the disk store's root too: its snapshots (``rootdisks.SNAPSHOTS_DIRNAME``) are no sandbox's."""
        if not self.base.is_dir():
            return
        for directory in self.base.iterdir():
            if directory.name == rootdisks.SNAPSHOTS_DIRNAME:
                continue
            if directory.is_dir() and directory.name not in keep:
                log.info("removing_orphan_disk_mounts", sandbox_id=directory.name)
                await self.prune_sandbox(directory.name)

    async def check_bound(self, sandbox_id: str, mount: S3Mount) -> None:
        """A mount bound at the container's start (gVisor), after an agent restart or on the periodic
        check: the container keeps its bind of the host directory, which only that s3fs serves. A dead
        s3fs cannot be replaced under it (the sandbox's gofer holds the dead mount), so the mount is
        reported ``error`` saying so, as a failed restore is on the other tiers."""
        if mount.status != MOUNTED:
            return
        point = self._mount_point(sandbox_id, mount)
        if _fuse_at(point) and await _answers(point):
            return
        mount.status = ERROR
        mount.error = (
            "s3fs serving this disk stopped; on the gvisor isolation tier a disk is bound at the "
            "sandbox's start only: create the sandbox again to mount it"
        )
        log.warning("disk_bound_lost", sandbox_id=sandbox_id, disk_id=mount.disk_id)

    async def restore(self, sandbox_id: str, mount: S3Mount, *, ns_pid: int, netns: str) -> None:
        """After an agent restart: a live s3fs is kept; a dead one is mounted again from the kept
        passwd file (the sandbox's stale copy is replaced)."""
        if mount.status != MOUNTED:
            return
        point = self._mount_point(sandbox_id, mount)
        if _fuse_at(point) and await _answers(point):
            if not _mounted_in(ns_pid, mount.mount_path):
                await _run(
                    [
                        sys.executable,
                        "-m",
                        "paddock_hostagent.drivers.storage.nsmount",
                        "move",
                        str(ns_pid),
                        str(point),
                        mount.mount_path,
                    ]
                )
            return
        log.info("disk_remounting", sandbox_id=sandbox_id, disk_id=mount.disk_id, mount_path=mount.mount_path)
        # The sandbox's dead copy stays until the new mount covers it: were it removed first, a write in
        # between would land in the sandbox's own directory, and vanish under the new mount. Dead, it
        # fails loudly (ENOTCONN); a detach later removes both layers.
        await self._stop_host(point)
        if not self._passwd(sandbox_id, mount).exists():
            mount.status, mount.error = ERROR, "credentials lost on the host; attach the disk again"
            return
        error = await self._mount(sandbox_id, mount, ns_pid, netns)
        if error is not None:
            mount.status, mount.error = ERROR, error
            log.warning("disk_restore_failed", sandbox_id=sandbox_id, disk_id=mount.disk_id, error=error)
        else:
            log.info("disk_restored", sandbox_id=sandbox_id, disk_id=mount.disk_id)


def _fuse_at(point: Path) -> bool:
    fstype = mounts.top_fstype(point)
    return fstype is not None and fstype.startswith("fuse")


def _unmount_all(point: Path) -> None:
    for _ in range(8):  # a dead FUSE mount, a live one, the bind: a few layers at most
        if mounts.top_fstype(point) is None:
            return
        mounts.unmount(point)


def _reason(mount: S3Mount, log_path: Path, fallback: str) -> str:
    """What s3fs said about the bucket, in one line: the S3 error code and message, and its verdict."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        text = ""
    parts: list[str] = []
    s3_error = _S3_ERROR.search(text)
    if s3_error:
        parts.append(f"{s3_error.group(1)}: {s3_error.group(2)}")
    verdict = _S3FS_REASON.search(text)
    if verdict:
        parts.append(verdict.group(1).strip())
    if not s3_error:  # no S3 answer: what curl said on s3fs's last attempt, which its verdict leaves out
        failures = _CURL_FAILURE.findall(text)
        if failures:
            parts.insert(0, _curl_failure(failures[-1], mount.endpoint))
    if not parts:  # s3fs never started: what nsmount's s3fs command said (entering the sandbox's netns)
        parts = [line.strip() for line in text.splitlines() if line.startswith("nsmount: ")][-1:]
    detail = "; ".join(parts) or fallback
    return f"mounting bucket {mount.bucket!r} from {mount.endpoint} failed: {detail}"


def _curl_failure(code: str, endpoint: str) -> str:
    """A curl error s3fs logged, in words; the name is the one the sandbox's resolver was asked for."""
    host = urlsplit(endpoint).hostname or endpoint
    if code == "CURLE_COULDNT_RESOLVE_HOST":
        return f"{host} did not resolve in the sandbox (no such name, or its egress rules leave it out)"
    if code == "CURLE_COULDNT_CONNECT":
        return "connection refused"
    if code == "CURLE_OPERATION_TIMEDOUT":
        return f"{host} did not answer in time"
    return code


def _scrub(text: str, *secrets: str) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text[:500]


async def _run(argv: list[str], timeout_s: float = 15.0) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return 1, f"{argv[3]} timed out"
    return int(process.returncode or 0), output.decode(errors="replace")


async def _answers(point: Path, timeout_s: float = 5.0) -> bool:
    try:
        await asyncio.wait_for(asyncio.to_thread(os.stat, point), timeout_s)
    except (OSError, TimeoutError):
        return False
    return True


def _mounted_in(pid: int, path: str) -> bool:
    try:
        with open(f"/proc/{pid}/mountinfo") as mountinfo:
            return any(line.split()[4] == path for line in mountinfo)
    except OSError:
        return False


def _s3fs_pids(point: Path) -> list[int]:
    """s3fs processes serving ``point`` (started by an earlier agent process, so not our children)."""
    wanted = str(point).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"s3fs") and wanted in argv:
            found.append(int(entry.name))
    return found


async def _wait_exit(pid: int, process: subprocess.Popen[bytes] | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None:
            if process.poll() is not None:
                return True
        elif not Path(f"/proc/{pid}").exists():
            return True
        await asyncio.sleep(0.05)
    return False
