"""buildah (from Debian) as the template builder: a small interface over its command line.

Paddock does not interpret Dockerfiles: buildah does (``buildah bud``). This driver only gives it what
it cannot fetch itself, since no public registry is reachable: base images made locally from a root
filesystem (``from scratch`` + copy + ``commit``), and it exports a built image back to a plain tree
the host agent boots like a catalog image.

Each ``Buildah`` works on one storage (``--root``/``--runroot``): the host agent gives every owner a
store of its own on its own size-capped filesystem (``drivers/build/buildstore.py``), apart from any podman or
buildah the operator uses. RUN steps run under crun (``--isolation oci``: namespaces, seccomp, cgroup
limits), never chroot, and ``bud`` itself runs inside the build's network namespace (``nsenter --net``),
so what buildah fetches for a Dockerfile (``ADD <url>``) leaves from there, under the build's egress
rules, never from the host's network.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent.drivers.base import DriverError

log = get_logger(__name__)

LineSink = Callable[[str], None]


class BuildahError(DriverError):
    """buildah is missing, or a step that is not the user's (base import, export) failed."""


@dataclass(frozen=True)
class BuildLimits:
    """What one build's RUN steps may use, as buildah passes it to the OCI runtime's cgroup."""

    mem_mib: int
    vcpu: int
    nproc: int = 4096


@dataclass(frozen=True)
class ImageSettings:
    """The Dockerfile's ENV, WORKDIR, USER, ENTRYPOINT and CMD as buildah recorded them, and the image's
    content id (``sha256:…``; two builds that hit the cache for every step get the same one)."""

    image_id: str
    env: dict[str, str]
    workdir: str
    user: str
    entrypoint: list[str]
    cmd: list[str]


#: Beside a store's ``storage/``: which tree on the host each tag's content is (``record_tree``).
TREES_FILE = "paddock-trees.json"
MAX_TREES_BYTES = 1024 * 1024


class Buildah:
    def __init__(
        self,
        root: Path,
        runtime: str = "/usr/bin/crun",
        *,
        runroot: Path | None = None,
        present: set[str] | None = None,
        image_store: Path | None = None,
    ) -> None:
        """``root``: the storage directory's parent (``<root>/storage``), unless ``runroot`` is given:
        then ``root`` is the storage directory itself. ``present``: the tags known to be in this
        storage, kept by the caller across mounts of it. ``image_store``: a store whose images this one
        reads and never writes (``basestore.py``, the catalog's images)."""
        self.root = root
        self.runtime = runtime
        self.storage = root if runroot is not None else root / "storage"
        self.runroot = runroot if runroot is not None else root / "run"
        #: buildah's own temporary files (its ``TMPDIR``): a RUN step's ``config.json``, ``hosts`` and
        #: root mount point. Left to buildah's default, ``/var/tmp``, a killed build (a delete, a time
        #: limit) left its RUN step's directory there for good; here ``release`` removes what is left.
        self.tmpdir = self.runroot / "tmp"
        self._base_lock = asyncio.Lock()
        #: Tags known to be in storage: ``has_image`` spawns buildah (1-2 s on a loaded host) only for
        #: the others. ``forget`` drops one whose build failed, in case storage lost it.
        self._present: set[str] = present if present is not None else set()
        self.image_store = image_store

    @staticmethod
    def available() -> bool:
        return shutil.which("buildah") is not None

    def _env(self) -> dict[str, str]:
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "TMPDIR": str(self.tmpdir)}

    def _argv(self, *args: str, netns: Path | None = None) -> list[str]:
        enter = ["nsenter", f"--net={netns}", "--"] if netns is not None else []
        return [
            *enter,
            "buildah",
            "--root",
            str(self.storage),
            "--runroot",
            str(self.runroot),
            "--storage-driver",
            "overlay",
            *(["--storage-opt", f"overlay.imagestore={self.image_store}"] if self.image_store else []),
            *args,
        ]

    async def _run(
        self, *args: str, on_line: LineSink | None = None, netns: Path | None = None
    ) -> tuple[int, list[str]]:
        """Runs buildah in its own session (so a cancel kills RUN steps too), inside ``netns`` if given;
        returns (rc, last lines)."""
        process = await asyncio.create_subprocess_exec(
            *self._argv(*args, netns=netns),
            env=self._env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        tail: list[str] = []
        try:
            assert process.stdout is not None
            async for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip("\r\n")
                tail = [*tail[-19:], line]
                if on_line is not None:
                    on_line(line)
            return await process.wait(), tail
        except BaseException:
            # Cancelled (delete, time limit): the whole group, RUN step included, goes.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.shield(process.wait())
            raise

    async def _check(self, *args: str) -> list[str]:
        rc, tail = await self._run(*args)
        if rc != 0:
            raise BuildahError(f"buildah {args[0]} exited with {rc}: " + " | ".join(tail[-5:]))
        return tail

    async def has_image(self, tag: str) -> bool:
        if tag in self._present:
            return True
        rc, _ = await self._run("inspect", "--type", "image", tag)
        if rc == 0:
            self._present.add(tag)
        return rc == 0

    def knows(self, tag: str) -> bool:
        """Whether ``tag`` is known to be in storage, without asking buildah."""
        return tag in self._present

    def forget(self, tag: str) -> None:
        self._present.discard(tag)

    # -- which host tree a tag holds: a build's export links that tree instead of copying the base --

    def _trees(self) -> dict[str, str]:
        try:
            with open(self.storage.parent / TREES_FILE, "rb") as handle:
                data = json.loads(handle.read(MAX_TREES_BYTES))
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def recorded_tree(self, tag: str) -> str:
        """What ``record_tree`` said ``tag`` holds ('' if nothing)."""
        return self._trees().get(tag, "")

    def record_tree(self, tag: str, ident: str | None) -> None:
        """Records that ``tag``'s content is the host's tree ``ident`` (``ImageStore.tree_ident``; None
        forgets it). The file is the host agent's, outside what any build step sees."""
        trees = self._trees()
        if ident:
            trees[tag] = ident
        else:
            trees.pop(tag, None)
        target = self.storage.parent / TREES_FILE
        partial = target.with_name(TREES_FILE + ".partial")
        with contextlib.suppress(OSError):
            partial.write_text(json.dumps(trees))
            partial.replace(target)

    async def import_tree(self, tag: str, tree: Path, ident: str = "") -> None:
        """Makes ``tag`` a one-layer image holding ``tree`` (a catalog rootfs, or a template built on
        another host), unless it exists, and records that it holds the tree ``ident``. About 3-10 s for
        debian:13; done once per tag."""
        async with self._base_lock:
            if await self.has_image(tag):
                return
            container = (await self._check("from", "--pull-never", "scratch"))[-1].strip()
            try:
                mountpoint = Path((await self._check("mount", container))[-1].strip())
                await _copy_tree(tree, mountpoint)
                await self._check("umount", container)
                await self._check("commit", "--quiet", container, tag)
            finally:
                await self._run("rm", container)
            self._present.add(tag)
            self.record_tree(tag, ident or None)
            log.info("buildah_base_imported", tag=tag, tree=str(tree))

    async def build(
        self,
        dockerfile: Path,
        context: Path,
        tag: str,
        *,
        netns: Path,
        dns: str,
        limits: BuildLimits,
        cgroup_parent: str,
        on_line: LineSink,
    ) -> int:
        """``buildah bud`` with the layer cache, itself inside ``netns`` and its RUN steps under crun in
        the same namespace; ``context`` is the directory COPY/ADD read. Intermediate containers are
        removed even when the build fails. Returns its exit code."""
        rc, _ = await self._run(
            "bud",
            "--force-rm",
            "--isolation",
            "oci",
            "--runtime",
            self.runtime,
            "--network",
            f"ns:{netns}",
            "--dns",
            dns,
            "--layers",
            "--pull-never",
            "--memory",
            f"{limits.mem_mib}m",
            "--memory-swap",
            f"{limits.mem_mib}m",
            "--cpu-period",
            "100000",
            "--cpu-quota",
            str(100000 * limits.vcpu),
            "--ulimit",
            f"nproc={limits.nproc}:{limits.nproc}",
            "--cgroup-parent",
            cgroup_parent,  # RUN steps land here: the caller limits pids and kills what is left
            "--cap-drop",
            "NET_RAW",
            "--format",
            "oci",
            "-t",
            tag,
            "-f",
            str(dockerfile),
            str(context),
            on_line=on_line,
            netns=netns,
        )
        return rc

    async def export(self, tag: str, dest: Path) -> None:
        """Copies the image's filesystem to ``dest``."""
        container = (await self._check("from", "--pull-never", tag))[-1].strip()
        try:
            mountpoint = Path((await self._check("mount", container))[-1].strip())
            await _copy_tree(mountpoint, dest)
        finally:
            await self._run("rm", container)  # unmounts it too: one spawn fewer than umount + rm

    async def settings(self, tag: str) -> ImageSettings:
        # inspect prints one JSON document: read it whole (``_run`` keeps only the last lines).
        process = await asyncio.create_subprocess_exec(
            *self._argv("inspect", "--type", "image", tag),
            env=self._env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await process.communicate()
        if process.returncode != 0:
            raise BuildahError(f"buildah inspect {tag} exited with {process.returncode}")
        info = json.loads(out)
        config = (info.get("OCIv1") or {}).get("config") or {}
        image_id = str(info.get("FromImageID") or "")
        env: dict[str, str] = {}
        for item in config.get("Env") or []:
            key, _, value = str(item).partition("=")
            env[key] = value
        return ImageSettings(
            image_id=image_id if image_id.startswith("sha256:") or not image_id else f"sha256:{image_id}",
            env=env,
            workdir=str(config.get("WorkingDir") or ""),
            user=str(config.get("User") or ""),
            entrypoint=[str(part) for part in config.get("Entrypoint") or []],
            cmd=[str(part) for part in config.get("Cmd") or []],
        )

    async def names(self, repository: str) -> list[str]:
        """Every ``repository:tag`` of ``repository`` in this store (not its additional image store's)."""
        rc, lines = await self._run(
            "images", "--noheading", "--format", "{{.Name}}:{{.Tag}}", "--filter", f"reference={repository}"
        )
        if rc != 0:
            raise BuildahError(f"buildah images exited with {rc}: " + " | ".join(lines[-5:]))
        return [line.strip() for line in lines if line.strip() and not line.startswith("time=")]

    async def image_id(self, tag: str) -> str:
        """The image's content id: two builds that hit the cache for every step get the same one."""
        rc, lines = await self._run("images", "--noheading", "--no-trunc", "--format", "{{.ID}}", tag)
        if rc != 0 or not lines:
            raise BuildahError(f"buildah images {tag} exited with {rc}")
        return lines[-1].strip()

    async def release(self) -> None:
        """Removes working containers (a killed build leaves its RUN container) and unmounts what
        containers/storage keeps mounted, so a stopped agent leaves no mounts; images stay cached. When
        the store lists no container (builds that ended cleanly leave none) buildah is not spawned."""
        if self._containers() != 0:
            await self._run("rm", "--all")
        prefixes = (f"{self.storage}/", f"{self.runroot}/")
        mounted = [
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(prefixes)
        ]
        for point in sorted(mounted, key=len, reverse=True):  # deepest first
            process = await asyncio.create_subprocess_exec(
                "umount", "-l", point, stderr=asyncio.subprocess.DEVNULL
            )
            await process.wait()
        await asyncio.to_thread(self._remove_temporary_files)

    def _remove_temporary_files(self) -> None:
        """Empties buildah's ``TMPDIR`` of what killed builds left. Never below a mount point still there
        (a RUN step's root is the tenant's tree): such an entry stays, for the next release."""
        try:
            entries = list(self.tmpdir.iterdir())
        except FileNotFoundError:
            return
        mounted = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for entry in entries:
            if any(point == str(entry) or point.startswith(f"{entry}/") for point in mounted):
                log.warning("builder_temporary_files_kept", path=str(entry), reason="a mount is still below")
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def _containers(self) -> int | None:
        """How many working containers the store lists (None: unknown)."""
        try:
            with open(self.storage / "overlay-containers" / "containers.json", "rb") as handle:
                listed = json.loads(handle.read(MAX_TREES_BYTES))
        except FileNotFoundError:
            return 0
        except (OSError, ValueError):
            return None
        return len(listed) if isinstance(listed, list) else None

    async def remove(self, tag: str) -> None:
        """Drops the tag with the cache images only it used (buildah removes untagged parents), and any
        other dangling image (the partial chain of a failed build)."""
        self._present.discard(tag)
        self.record_tree(tag, None)
        await self._run("rmi", tag)
        await self._run("rmi", "--prune")

    async def remove_all_images(self) -> None:
        """Empties the store's images and cache (bases are imported again when needed)."""
        self._present.clear()
        with contextlib.suppress(OSError):
            (self.storage.parent / TREES_FILE).unlink()
        await self._run("rm", "--all")
        await self._run("rmi", "--all", "--force")


async def _copy_tree(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        "cp",
        "-a",
        "--reflink=auto",
        f"{source}/.",
        str(dest),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    if process.returncode != 0:
        raise BuildahError(f"copying {source} to {dest}: {err.decode(errors='replace').strip()[-300:]}")
