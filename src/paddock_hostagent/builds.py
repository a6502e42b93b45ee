"""Template builds on this host: a Dockerfile becomes an image sandboxes boot like catalog ones.

One attempt (``POST /internal/v1/builds``) runs in the background:

1. the base the control plane resolved (``debian:13`` … or a ready template) is offered to buildah as
   a local image, and ``FROM`` is rewritten to its tag — no registry is ever contacted. A catalog image
   is imported once per host into the catalog store every account's builds read
   (``drivers/build/basestore.py``); a template base once into its owner's store
   (``drivers/build/buildah.py`` ``import_tree``);
2. the request's build context (a tar the control plane checked) is unpacked into the attempt's own
   context directory, which is all ``COPY``/``ADD`` can read (the Dockerfile itself sits outside it);
3. ``buildah bud --layers`` runs in the owner's own builder storage, on a filesystem of its own capped
   at ``disk_mib`` (``drivers/build/buildstore.py``), and runs *itself* inside a network namespace built like
   a sandbox's (``NetworkManager.create``: its own veth and address, the host's nftables guard that
   refuses the host, link-local and other sandboxes, the egress allowlist and the DNS resolver of
   ``EgressService``), with RUN steps under crun with cgroup limits in the same namespace. RUN steps are
   untrusted code, and so is everything buildah does for the Dockerfile (``ADD <url>``, ``COPY --from``):
   the control plane's Dockerfile check is a convenience, not the boundary;
4. the image becomes ``<image_dir>/<template id>/rootfs`` with ``image.json`` (ENV, WORKDIR, USER,
   ENTRYPOINT, CMD), written last, so nothing half-built is bootable. While buildah builds, the base's
   tree on this host is hard-linked into the attempt's tree; then only the layers the build added are
   copied onto it out of the store (``drivers/build/layers.py``). Where the store's base is not known
   to be that tree (recorded when buildah imported it), the merged image is copied out whole.

The control plane polls the attempt (``GET …/builds/{id}?after=N``) for new log lines and its end, and
retries failed attempts itself. An attempt keeps the first ``HEAD_LINES`` lines of its log and the last
``TAIL_LINES`` (each line at most ``MAX_LINE_CHARS``), and says how many it cut between them. A failed or
cancelled attempt leaves nothing in the store but its layer cache: working containers are removed and
the store is unmounted when its last build ends. Builds live in memory: a restarted agent forgets them, and the control
plane's lease runs out and it starts a new attempt.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import fcntl
import io
import json
import os
import re
import secrets
import shutil
import signal
import tarfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.base import DriverError
from paddock_hostagent.drivers.build.basestore import CatalogBases
from paddock_hostagent.drivers.build.buildah import Buildah, BuildLimits
from paddock_hostagent.drivers.build.buildstore import BuildStores
from paddock_hostagent.drivers.build.layers import LayerError, apply_layers, layers_above, link_tree
from paddock_hostagent.drivers.net.network import NetworkManager, SandboxNetwork
from paddock_hostagent.drivers.runtime.cgroups import SandboxCgroup
from paddock_hostagent.egress import Attachment, EgressService
from paddock_hostagent.images import TEMPLATE_PREFIX, ImageError, ImageStore, slug
from paddock_hostagent.schemas import BuildBody, BuildLine, BuildView

log = get_logger(__name__)

FROM_LINE = re.compile(r"^(\s*FROM\s+)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE)
BUILD_PIDS_MAX = 4096
#: Per attempt: the first lines kept, then the last ones; what falls between is counted, not kept.
HEAD_LINES = 2000
TAIL_LINES = 2000
HEAD_BYTES = 1024 * 1024
TAIL_BYTES = 1024 * 1024
MAX_LINE_CHARS = 8192


def local_tag(image: str) -> str:
    """buildah's name for a Paddock image: templates by id, catalog images by slug."""
    if image.startswith(TEMPLATE_PREFIX):
        return f"localhost/paddock-tpl/{image.lower()}:latest"
    return f"localhost/paddock-base/{slug(image)}:latest"


@dataclass
class Build:
    """One attempt and its log: lines are numbered from 0 as said; the first ``HEAD_LINES`` are kept,
    then only the last ``TAIL_LINES``."""

    body: BuildBody
    status: str = "building"
    head: list[BuildLine] = field(default_factory=list)
    head_bytes: int = 0
    tail: collections.deque[BuildLine] = field(default_factory=collections.deque)
    tail_bytes: int = 0
    cut_lines: int = 0
    cut_bytes: int = 0
    ext4_size_bytes: int = 0
    error: str | None = None
    task: asyncio.Task[None] | None = None

    @property
    def said(self) -> int:
        return len(self.head) + self.cut_lines + len(self.tail)

    def say(self, line: str, level: str = "info") -> None:
        line = line[:MAX_LINE_CHARS]
        size = len(line)
        entry = BuildLine(ts=time.time(), level=level, line=line)
        if not self.tail and len(self.head) < HEAD_LINES and self.head_bytes + size <= HEAD_BYTES:
            self.head.append(entry)
            self.head_bytes += size
            return
        self.tail.append(entry)
        self.tail_bytes += size
        while len(self.tail) > TAIL_LINES or self.tail_bytes > TAIL_BYTES:
            gone = self.tail.popleft()
            self.tail_bytes -= len(gone.line)
            self.cut_lines += 1
            self.cut_bytes += len(gone.line)

    def end(self, status: str, error: str | None = None) -> None:
        """Records the end (after saying how much of the log was cut, so a poll that sees the end has
        every line)."""
        if self.cut_lines:
            self.say(
                f"[log cut: {self.cut_lines} lines ({self.cut_bytes} bytes) between the first "
                f"{len(self.head)} and the last {len(self.tail)} were not kept]",
                "warn",
            )
        if error is not None:
            self.error = error
            self.say(error, "error")
        self.status = status

    def view(self, after: int) -> BuildView:
        tail_start = len(self.head) + self.cut_lines  # the number of the first line kept in the tail
        lines = self.head[after:] + list(self.tail)[max(after - tail_start, 0) :]
        return BuildView(
            id=self.body.id,
            attempt=self.body.attempt,
            status=self.status,  # type: ignore[arg-type]
            lines=lines,
            next=self.said,
            ext4_size_bytes=self.ext4_size_bytes,
            error=self.error,
        )


class BuildManager:
    def __init__(
        self,
        images: ImageStore,
        buildah: Buildah,
        work_dir: Path,
        *,
        network: NetworkManager | None,
        egress: EgressService | None,
        in_use: Callable[[str], bool] = lambda image: False,
        base_store: Path | None = None,
    ) -> None:
        """``base_store``: where the catalog's images are imported once for every account's builds
        (``drivers/build/basestore.py``); None imports them into each account's store."""
        self.images = images
        self.buildah = buildah  # the builder root; the stores are under it, one per owner
        self.bases = CatalogBases(base_store, buildah.runtime) if base_store is not None else None
        self.stores = BuildStores(
            buildah.root, buildah.runtime, image_store=self.bases.storage if self.bases else None
        )
        self.work_dir = work_dir
        self.network = network
        self.egress = egress
        self.in_use = in_use
        self._builds: dict[str, Build] = {}
        self._doomed: set[str] = set()  # deleted templates whose image waits for its last sandbox
        self._shared_retired = False
        remove_stale_work(work_dir)

    def start(self, body: BuildBody) -> BuildView:
        if not Buildah.available():
            raise errors.BadRequest("buildah is not installed on this host (scripts/setup-host.sh)")
        if not body.id.startswith(TEMPLATE_PREFIX):
            raise errors.BadRequest(f"a template id starts with {TEMPLATE_PREFIX}")
        current = self._builds.get(body.id)
        if current is not None and current.status == "building":
            if current.body.attempt == body.attempt:
                return current.view(0)  # the same request again: idempotent
            raise errors.InvalidState(f"template {body.id} is already building")
        build = Build(body)
        self._builds[body.id] = build
        build.task = asyncio.create_task(self._run(build), name=f"build-{body.id}")
        return build.view(0)

    def view(self, build_id: str, after: int = 0) -> BuildView:
        build = self._builds.get(build_id)
        if build is None:
            raise errors.SandboxNotFound(f"no build {build_id} on this host")
        return build.view(after)

    async def cancel(self, build_id: str) -> None:
        """Stops a running attempt (its RUN step killed) and removes what it made."""
        build = self._builds.pop(build_id, None)
        if build is not None and build.task is not None and not build.task.done():
            build.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await build.task

    async def delete(self, build_id: str) -> None:
        """Cancels the build, and removes the image unless a sandbox still boots from it (then when the
        last one is destroyed: ``collect``)."""
        await self.cancel(build_id)
        self._doomed.add(build_id)
        await self.collect()

    async def collect(self) -> None:
        for image in sorted(self._doomed):
            if self.in_use(image):
                continue
            self._doomed.discard(image)
            owner = self._owner_of(image)
            with contextlib.suppress(ImageError):
                self.images.remove_template(image)
            if owner == image:
                await self.stores.remove(owner)  # a store of its own: nothing else in it
            elif self.stores.exists(owner):
                with contextlib.suppress(DriverError):
                    async with self.stores.open(owner) as buildah:
                        await buildah.remove(local_tag(image))
            log.info("template_image_removed", template_id=image)

    def _owner_of(self, image: str) -> str:
        build = self._builds.get(image)
        if build is not None:
            return build.body.owner or image
        with contextlib.suppress(OSError, ValueError, AttributeError):
            meta = json.loads((self.images.image_dir / slug(image) / "image.json").read_text())
            return str(meta.get("owner") or image)
        return image

    async def close(self) -> None:
        for build_id in list(self._builds):
            await self.cancel(build_id)
        await self.stores.close()

    # -- one attempt -------------------------------------------------------------------------------

    async def _run(self, build: Build) -> None:
        body = build.body
        work = self.work_dir / f"{body.id}-{body.attempt}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        held = _hold(work)  # while held, no agent's start takes the dir for a dead build's
        (work / "rootfs").mkdir()
        context = work / "context"
        context.mkdir()
        net: SandboxNetwork | None = None
        linking: _Prelink | None = None
        guard_id = f"build-{body.id}"
        cgroup = SandboxCgroup(f"/paddock-builds/{body.id}-{body.attempt}")
        started = time.monotonic()
        build.say(f"attempt {body.attempt}: FROM {body.base}")
        await self._retire_shared_store()
        try:
            async with (
                asyncio.timeout(body.timeout_s),
                self.stores.open(body.owner or body.id, body.disk_mib) as buildah,
            ):
                try:
                    base = await self._offer_base(build, buildah)
                    linking = self._prelink(body.base, base, work / "rootfs")
                    if body.context_b64:
                        await asyncio.to_thread(_unpack_context, body.context_b64, context)
                    dockerfile = work / "Dockerfile"
                    dockerfile.write_text(FROM_LINE.sub(rf"\g<1>{base.tag}\g<3>", body.dockerfile, 1))
                    net = await self._network(guard_id, body.egress)
                    _limit_pids(cgroup, body)
                    build.say(
                        f"buildah bud: in the build's own network namespace, on a {body.disk_mib} MiB "
                        "filesystem of this account's own"
                    )
                    buildah.record_tree(local_tag(body.id), None)  # the tag is about to change
                    rc = await buildah.build(
                        dockerfile,
                        context,
                        local_tag(body.id),
                        netns=net.netns_path,
                        dns=net.gateway,
                        limits=BuildLimits(mem_mib=body.mem_mib, vcpu=body.vcpu),
                        cgroup_parent=cgroup.path,
                        on_line=build.say,
                    )
                    if rc != 0:
                        base.store.forget(base.tag)  # checked again by the next attempt
                        raise _BuildFailed(f"buildah bud exited with {rc}")
                    await _end_cgroup(cgroup)  # nothing of the build runs while its layers are read
                    build.say("exporting the image")
                    await self._export(build, buildah, work / "rootfs", linking)
                finally:
                    if linking is not None:
                        await linking.stop()
                    # RUN steps live in their own session inside the container: they go with the
                    # build's cgroup, before the store they write to is taken down.
                    await _end_cgroup(cgroup)
            build.say(f"ready in {time.monotonic() - started:.1f} s, {build.ext4_size_bytes} bytes")
            build.end("ready")
        except TimeoutError:
            build.end("failed", f"the build ran past its limit of {body.timeout_s:g} s")
        except _BuildFailed as exc:
            build.end("failed", str(exc))
        except (DriverError, ImageError, OSError) as exc:
            build.end("failed", f"build error: {exc}")
        finally:
            # The store's last user removed the working containers and unmounted it on the way out
            # of the block above.
            try:
                await _to_the_end(self._end_attempt(cgroup, guard_id, net, work))
            finally:
                os.close(held)
        log.info("template_built", template_id=body.id, attempt=body.attempt, status=build.status)

    async def _retire_shared_store(self) -> None:
        """An older agent kept every account's images in one store (``<root>/storage``): it is emptied
        and removed once, before the first build of this agent."""
        if self._shared_retired:
            return
        self._shared_retired = True
        if self.buildah.storage.exists():
            with contextlib.suppress(DriverError, OSError):
                await self.buildah.release()
                await asyncio.to_thread(shutil.rmtree, self.buildah.storage, True)
                log.info("shared_builder_store_removed", path=str(self.buildah.storage))

    async def _offer_base(self, build: Build, buildah: Buildah) -> _Base:
        """Makes the base a local image the owner's build reads: a catalog image from the host's
        catalog store (``basestore.py``), a template (or any base, without that store) in the owner's
        own store."""
        base = build.body.base
        tag = local_tag(base)
        if base.startswith(TEMPLATE_PREFIX):
            tree = self.images.rootfs_path(base) if self.images.is_cached(base) else None
            if await buildah.has_image(tag):
                return _Base(tag, tree, buildah)
            # Built on another host and copied here, or storage was reset: import its tree.
            if tree is None:
                raise _BuildFailed(f"base template {base} is not on this host")
        else:
            tree = await self.images.ensure(base)
            ident = self.images.tree_ident(base)
            if self.bases is not None and ident:
                shared = await self.bases.offer(base, slug(base), tree, ident, build.say)
                if self.images.tree_ident(base) == ident:
                    return _Base(shared, tree, self.bases.buildah)
                # Replaced while it was copied: the tag may not hold the tree it names. No build names
                # it again (the tree has another ident now), and the next import of the image drops it.
            if await buildah.has_image(tag):
                return _Base(tag, tree, buildah)
        build.say(f"importing base image {base} (once per account's builder storage)")
        ident = self.images.tree_ident(base)
        await buildah.import_tree(tag, tree, ident)
        if self.images.tree_ident(base) != ident:  # replaced while it was copied: not known to match
            buildah.record_tree(tag, None)
        return _Base(tag, tree, buildah)

    def _prelink(self, base: str, offered: _Base, dest: Path) -> _Prelink | None:
        """Starts hard-linking the base's tree into ``dest`` while buildah builds, when the store's base
        image is known to hold exactly that tree (``_export`` then copies only the layers above it)."""
        ident = self.images.tree_ident(base)
        if offered.tree is None or not ident or offered.store.recorded_tree(offered.tag) != ident:
            return None
        return _Prelink(base, ident, asyncio.create_task(link_tree(offered.tree, dest)), offered)

    async def _network(self, guard_id: str, rules: list[str]) -> SandboxNetwork:
        if self.network is None:
            raise _BuildFailed("this host has no sandbox network: builds need one")
        # A build cancelled (its template deleted) while the namespace is being made must not strand it:
        # the thread goes on to the end whatever happens to this task, so it is awaited, shielded, and
        # what it made is taken down before the cancellation goes on; else the address it took would stay
        # in addresses.json and the namespace on the host.
        creating = asyncio.ensure_future(asyncio.to_thread(self.network.create, secrets.token_hex(4)))
        try:
            net = await asyncio.shield(creating)
        except asyncio.CancelledError:
            await _to_the_end(self._destroy_once_made(creating))
            raise
        if self.egress is not None:
            try:
                await self.egress.attach(Attachment(guard_id, net.host_veth, net.ip, list(rules), -1))
            except BaseException:
                await asyncio.to_thread(self.network.destroy, net)
                raise
        return net

    async def _destroy_once_made(self, creating: asyncio.Future[SandboxNetwork]) -> None:
        assert self.network is not None
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.network.destroy, await creating)

    async def _end_attempt(
        self, cgroup: SandboxCgroup, guard_id: str, net: SandboxNetwork | None, work: Path
    ) -> None:
        await _end_cgroup(cgroup)
        if net is not None:
            await self._release_network(guard_id, net)
        # A failed attempt may leave a linked tree of thousands of entries: removed off the loop.
        await asyncio.to_thread(shutil.rmtree, work, True)

    async def _release_network(self, guard_id: str, net: SandboxNetwork) -> None:
        with contextlib.suppress(Exception):
            if self.egress is not None:
                await self.egress.detach(guard_id, net.host_veth)
        if self.network is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.network.destroy, net)

    def _twin(self, image_id: str, exclude: str) -> str | None:
        """A template on this host built to the same image, not being deleted."""
        for name in self.images.templates():
            if name != exclude and name not in self._doomed and self.images.image_id(name) == image_id:
                return name
        return None

    def _recorded_size(self, name: str) -> int:
        """The ext4 size a template here recorded at its build (0 if unknown): a twin's tree is the
        same, so walking it again would only cost time."""
        with contextlib.suppress(OSError, ValueError, TypeError):
            meta = json.loads((self.images.image_dir / slug(name) / "image.json").read_text())
            return int(meta.get("ext4_size_bytes") or 0)
        return 0

    async def _export(self, build: Build, buildah: Buildah, tree: Path, linking: _Prelink | None) -> None:
        body = build.body
        tag = local_tag(body.id)
        began = time.monotonic()
        # One spawn for the config and image id, while the layers are applied.
        reading = asyncio.create_task(buildah.settings(tag))
        try:
            applied = await self._apply_layers(build, buildah, tree, linking)
            settings = await reading
        finally:
            reading.cancel()  # a no-op once done
            await asyncio.wait([reading])
            if not reading.cancelled():
                reading.exception()  # retrieved: raised above when it mattered
        image_id = settings.image_id or await buildah.image_id(tag)
        applied_s = time.monotonic() - began
        if applied:
            size = await _tree_bytes(tree)
        elif (twin := self._twin(image_id, body.id)) is not None:
            # The same image as a template already here (every step came from the cache): its tree is
            # identical and read-only, so hard links make this one at once.
            build.say(f"same image as {twin}: reusing its tree")
            await link_tree(self.images.rootfs_path(twin), tree)
            size = self._recorded_size(twin) or await _tree_bytes(tree)
        else:
            await buildah.export(tag, tree)
            size = await _tree_bytes(tree)
        meta = {
            "name": body.id,
            "source": f"template from {body.base}",
            "built_at": time.time(),
            "ext4_size_bytes": size,
            "image_id": image_id,
            "owner": body.owner or body.id,
            "config": {
                "env": settings.env,
                "workdir": settings.workdir,
                "user": settings.user,
                "entrypoint": settings.entrypoint,
                "cmd": settings.cmd,
            },
        }
        # Same filesystem as the image dir? The work dir sits under the agent's state dir; a rename
        # across filesystems fails, so move (copy) when needed.
        target = self.images.image_dir / slug(body.id) / "rootfs.incoming"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        await asyncio.to_thread(shutil.move, str(tree), str(target))
        await asyncio.to_thread(self.images.install_template, body.id, target, meta)
        log.info(
            "template_exported",
            template_id=body.id,
            layers_only=applied,
            tree_s=round(applied_s, 3),
            total_s=round(time.monotonic() - began, 3),
        )
        # A build FROM this template links the tree just installed: the tag's own layers are what it
        # holds, but for what ``install_template`` makes of every image (``_finish_rootfs``), which
        # that build's export makes again.
        buildah.record_tree(tag, self.images.tree_ident(body.id))
        build.ext4_size_bytes = size

    async def _apply_layers(
        self, build: Build, buildah: Buildah, tree: Path, linking: _Prelink | None
    ) -> bool:
        """The image's tree as the base's, linked while buildah built, plus the layers the build added
        (``drivers/build/layers.py``); False (``tree`` emptied) when that is not known to be the image:
        the base's tree changed meanwhile, the image does not stand on the base, or a layer holds what
        is not applied."""
        if linking is None:
            return False
        body = build.body
        try:
            await linking.task
            diffs = layers_above(
                buildah.storage, local_tag(body.id), linking.offered.tag, linking.offered.store.storage
            )
            if diffs is None:
                raise LayerError("the image does not stand on its base's layers")
            if self.images.tree_ident(linking.base) != linking.ident:
                raise LayerError("the base's tree changed while the build ran")
            await apply_layers(diffs, tree)
        except (LayerError, OSError) as exc:
            log.info("template_export_copies_the_tree", template_id=body.id, reason=str(exc))
            await asyncio.to_thread(shutil.rmtree, tree, True)
            tree.mkdir()
            return False
        build.say(f"linked the files of {body.base}, copied the {len(diffs)} layers the build added")
        return True


@dataclass(frozen=True)
class _Base:
    """The base as buildah's build reads it: its tag, its tree on this host (None: a template base only
    in the store), and the store that holds the tag (the owner's, or the catalog's)."""

    tag: str
    tree: Path | None
    store: Buildah


@dataclass
class _Prelink:
    """The base's tree being hard-linked into the attempt's tree while buildah builds."""

    base: str
    ident: str
    task: asyncio.Task[None]
    offered: _Base  # the image whose layers the build's stand on

    async def stop(self) -> None:
        """Ends the linking if still running (a failed or cancelled build)."""
        if not self.task.done():
            self.task.cancel()
        await asyncio.wait([self.task])
        if not self.task.cancelled():
            self.task.exception()  # retrieved: a failure is handled (or moot) where it matters


def _unpack_context(encoded: str, dest: Path) -> None:
    """Unpacks the build context: regular files and directories only, inside ``dest`` (the ``data``
    filter refuses absolute paths, ``..``, links and devices, and drops set-id bits)."""
    try:
        with tarfile.open(
            fileobj=io.BytesIO(base64.b64decode(encoded, validate=True)), mode="r:*"
        ) as archive:
            members = [member for member in archive.getmembers() if member.isfile() or member.isdir()]
            archive.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, ValueError, EOFError) as exc:
        raise _BuildFailed(f"the build context cannot be unpacked: {exc}") from exc


def _limit_pids(cgroup: SandboxCgroup, body: BuildBody) -> None:
    """A fork bomb in a RUN step stops at the build's own pids cap (crun joins the existing group)."""
    directory = cgroup.dir("pids")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pids.max").write_text(f"{BUILD_PIDS_MAX}\n")


async def _to_the_end(cleanup: Coroutine[Any, Any, None]) -> None:
    """Awaits ``cleanup`` to its end even when this task is cancelled meanwhile, once or again, then lets
    the cancellation go on. A build is cancelled by its template's delete, and again when the caller
    awaiting that delete is cancelled: the second cancellation, landing between the egress detach and
    the namespace's destroy, left the build's address in addresses.json (a full run's teardown found it)."""
    task = asyncio.ensure_future(cleanup)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    task.result()


async def _end_cgroup(cgroup: SandboxCgroup) -> None:
    for _ in range(100):  # ends: each pass kills every task left; a task cannot outlive SIGKILL long
        pids: set[int] = set(cgroup.pids())
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(pid) for pid in (cgroup.dir("memory") / "cgroup.procs").read_text().split())
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.05)
    with contextlib.suppress(OSError):
        cgroup.remove()


#: A work dir is stale only when also untouched this long: another agent on a shared image dir (tests run
#: several) may have made one an instant ago and not yet locked it.
STALE_WORK_AFTER_S = 60.0


def _hold(work: Path) -> int:
    """An open descriptor of ``work`` with an exclusive lock, held for the attempt's life."""
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def remove_stale_work(work_dir: Path) -> list[str]:
    """Removes the work dirs of attempts that ended without their cleanup (the agent was killed in a
    build): each live attempt holds a lock on its own, so a dir nobody holds is stale, while another
    agent's running build on a shared image dir is left alone. Returns the names removed."""
    removed: list[str] = []
    young = time.time() - STALE_WORK_AFTER_S
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(work_dir):
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_mtime > young:
                continue
            try:
                fd = _hold(Path(entry.path))
            except OSError:
                continue  # held by a live attempt (or gone meanwhile)
            try:
                shutil.rmtree(entry.path, ignore_errors=True)  # fd-based: never follows a link in it
                removed.append(entry.name)
            finally:
                os.close(fd)
    if removed:
        log.info("stale_build_work_removed", count=len(removed))
    return removed


class _BuildFailed(Exception):
    """The user's build failed (a RUN step, a missing base): the message goes to the log."""


async def _tree_bytes(root: Path) -> int:
    """What the tree needs on ext4: regular files' sizes rounded up to 4 KiB blocks, plus one block per
    inode. ``find`` walks it (a Python walk took 4× as long)."""
    process = await asyncio.create_subprocess_exec(
        "find", str(root), "-mindepth", "1", "-printf", "%y %s\n",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await process.communicate()
    total = 0
    for line in out.decode(errors="replace").splitlines():
        kind, _, size = line.partition(" ")
        total += 4096 + (-(-int(size or 0) // 4096) * 4096 if kind == "f" else 0)
    return total
