"""Template builds on this host: a Dockerfile becomes an image sandboxes boot like catalog ones.

One attempt (``POST /internal/v1/builds``) runs in the background:

1. the base the control plane resolved (``debian:13`` … or a ready template) is offered to buildah as
   a local image (``drivers/buildah.py`` imports the image tree once per tag), and ``FROM`` is rewritten
   to that tag — no registry is ever contacted;
2. the request's build context (a tar the control plane checked) is unpacked into the attempt's own
   context directory, which is all ``COPY``/``ADD`` can read (the Dockerfile itself sits outside it);
3. ``buildah bud --layers`` runs with RUN steps under crun, with cgroup limits, inside a network
   namespace built like a sandbox's (``NetworkManager.create``: its own veth and address, the host's
   nftables guard that refuses the host, link-local and other sandboxes, the egress allowlist and the
   DNS resolver of ``EgressService``) — RUN steps are untrusted code;
4. the image is copied out to ``<image_dir>/<template id>/rootfs`` with ``image.json`` (ENV, WORKDIR,
   USER, ENTRYPOINT, CMD), written last, so nothing half-built is bootable.

The control plane polls the attempt (``GET …/builds/{id}?after=N``) for new log lines and its end, and
retries failed attempts itself. Builds live in memory: a restarted agent forgets them, and the control
plane's lease runs out and it starts a new attempt.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.drivers.base import DriverError
from paddock_hostagent.drivers.buildah import Buildah, BuildLimits
from paddock_hostagent.drivers.cgroups import SandboxCgroup
from paddock_hostagent.drivers.network import NetworkManager, SandboxNetwork
from paddock_hostagent.egress import Attachment, EgressService
from paddock_hostagent.images import TEMPLATE_PREFIX, ImageError, ImageStore, slug
from paddock_hostagent.schemas import BuildBody, BuildLine, BuildView

log = get_logger(__name__)

FROM_LINE = re.compile(r"^(\s*FROM\s+)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE)
BUILD_PIDS_MAX = 4096
MAX_KEPT_LINES = 20000  # per attempt; a build that prints more keeps its last lines


def local_tag(image: str) -> str:
    """buildah's name for a Paddock image: templates by id, catalog images by slug."""
    if image.startswith(TEMPLATE_PREFIX):
        return f"localhost/paddock-tpl/{image.lower()}:latest"
    return f"localhost/paddock-base/{slug(image)}:latest"


@dataclass
class Build:
    body: BuildBody
    status: str = "building"
    lines: list[BuildLine] = field(default_factory=list)
    dropped: int = 0  # lines cut from the front past MAX_KEPT_LINES
    ext4_size_bytes: int = 0
    error: str | None = None
    task: asyncio.Task[None] | None = None

    def say(self, line: str, level: str = "info") -> None:
        self.lines.append(BuildLine(ts=time.time(), level=level, line=line))
        if len(self.lines) > MAX_KEPT_LINES:
            self.lines.pop(0)
            self.dropped += 1

    def view(self, after: int) -> BuildView:
        start = max(after - self.dropped, 0)
        return BuildView(
            id=self.body.id,
            attempt=self.body.attempt,
            status=self.status,  # type: ignore[arg-type]
            lines=self.lines[start:],
            next=self.dropped + len(self.lines),
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
    ) -> None:
        self.images = images
        self.buildah = buildah
        self.work_dir = work_dir
        self.network = network
        self.egress = egress
        self.in_use = in_use
        self._builds: dict[str, Build] = {}
        self._doomed: set[str] = set()  # deleted templates whose image waits for its last sandbox

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
            with contextlib.suppress(ImageError):
                self.images.remove_template(image)
            await self.buildah.remove(local_tag(image))
            log.info("template_image_removed", template_id=image)

    async def close(self) -> None:
        for build_id in list(self._builds):
            await self.cancel(build_id)
        await self.buildah.release()

    # -- one attempt -------------------------------------------------------------------------------

    async def _run(self, build: Build) -> None:
        body = build.body
        work = self.work_dir / f"{body.id}-{body.attempt}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "rootfs").mkdir()
        context = work / "context"
        context.mkdir()
        net: SandboxNetwork | None = None
        guard_id = f"build-{body.id}"
        cgroup = SandboxCgroup(f"/paddock-builds/{body.id}-{body.attempt}")
        started = time.monotonic()
        build.say(f"attempt {body.attempt}: FROM {body.base}")
        try:
            async with asyncio.timeout(body.timeout_s):
                await self._offer_base(build)
                if body.context_b64:
                    await asyncio.to_thread(_unpack_context, body.context_b64, context)
                dockerfile = work / "Dockerfile"
                dockerfile.write_text(FROM_LINE.sub(rf"\g<1>{local_tag(body.base)}\g<3>", body.dockerfile, 1))
                net = await self._network(guard_id, body.egress)
                _limit_pids(cgroup, body)
                build.say("buildah bud: RUN steps under crun, in the build's own network namespace")
                rc = await self.buildah.build(
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
                    self.buildah.forget(local_tag(body.base))  # checked again by the next attempt
                    raise _BuildFailed(f"buildah bud exited with {rc}")
                build.say("exporting the image")
                await self._export(build, work / "rootfs")
            build.status = "ready"
            build.say(f"ready in {time.monotonic() - started:.1f} s, {build.ext4_size_bytes} bytes")
        except TimeoutError:
            self._fail(build, f"the build ran past its limit of {body.timeout_s:g} s")
        except _BuildFailed as exc:
            self._fail(build, str(exc))
        except (DriverError, ImageError, OSError) as exc:
            self._fail(build, f"build error: {exc}")
        finally:
            # A cancel or time limit killed buildah's session, but RUN steps live in their own
            # session inside the container: they go with the build's cgroup.
            await _end_cgroup(cgroup)
            if net is not None:
                await self._release_network(guard_id, net)
            shutil.rmtree(work, ignore_errors=True)
        log.info("template_built", template_id=body.id, attempt=body.attempt, status=build.status)

    def _fail(self, build: Build, reason: str) -> None:
        build.status = "failed"
        build.error = reason
        build.say(reason, "error")

    async def _offer_base(self, build: Build) -> None:
        base = build.body.base
        tag = local_tag(base)
        if base.startswith(TEMPLATE_PREFIX):
            if await self.buildah.has_image(tag):
                return
            # Built on another host and copied here, or storage was reset: import its tree.
            if not self.images.is_cached(base):
                raise _BuildFailed(f"base template {base} is not on this host")
            tree = self.images.rootfs_path(base)
        else:
            tree = await self.images.ensure(base)
            if await self.buildah.has_image(tag):
                return
        build.say(f"importing base image {base} (once per host)")
        await self.buildah.import_tree(tag, tree)

    async def _network(self, guard_id: str, rules: list[str]) -> SandboxNetwork:
        if self.network is None:
            raise _BuildFailed("this host has no sandbox network: builds need one")
        net = await asyncio.to_thread(self.network.create, secrets.token_hex(4))
        if self.egress is not None:
            try:
                await self.egress.attach(Attachment(guard_id, net.host_veth, net.ip, list(rules), -1))
            except BaseException:
                await asyncio.to_thread(self.network.destroy, net)
                raise
        return net

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

    async def _export(self, build: Build, tree: Path) -> None:
        body = build.body
        settings = await self.buildah.settings(local_tag(body.id))  # one spawn: config and image id
        image_id = settings.image_id or await self.buildah.image_id(local_tag(body.id))
        twin = self._twin(image_id, body.id)
        if twin is not None:
            # The same image as a template already here (every step came from the cache): its tree is
            # identical and read-only, so hard links make this one at once.
            build.say(f"same image as {twin}: reusing its tree")
            await _link_tree(self.images.rootfs_path(twin), tree)
            size = self._recorded_size(twin) or await _tree_bytes(tree)
        else:
            await self.buildah.export(local_tag(body.id), tree)
            size = await _tree_bytes(tree)
        meta = {
            "name": body.id,
            "source": f"template from {body.base}",
            "built_at": time.time(),
            "ext4_size_bytes": size,
            "image_id": image_id,
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
        build.ext4_size_bytes = size


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


async def _link_tree(source: Path, dest: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        "cp", "-al", f"{source}/.", str(dest), stderr=asyncio.subprocess.PIPE
    )
    _, err = await process.communicate()
    if process.returncode != 0:
        raise _BuildFailed(f"linking {source}: {err.decode(errors='replace').strip()[-300:]}")


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
