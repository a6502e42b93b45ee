"""Root filesystem images: built once per host into a cache, then used read-only as overlay lower layers.

    python -m paddock_hostagent.images build debian:13     # also `paddock hostagent build-image NAME`
    python -m paddock_hostagent.images list

Layout: ``<image_dir>/<name with ':' as '_'>/rootfs`` plus ``image.json``. A build runs into a temporary
directory next to it and is renamed into place, under an exclusive lock, so concurrent builders (two
processes, or two requests) build once and nobody sees a half-built tree.

A build is keyed by its recipe's content, not only its name: ``image.json`` records a digest of what the
recipe installs (``recipe_digest``), and ``build`` (``make images``, the tests' fixtures) rebuilds an image
whose recorded digest differs, so a package added to an image reaches hosts that already have it. An image
built before the digest was recorded counts as current when every package of the recipe is installed in
it. Booting (``ensure``) never rebuilds an image that is there: sandboxes may be using it.

``debian:13``, ``devbox:1``, ``code-interpreter:1`` and ``desktop:1`` come from the Debian archive.
``ubuntu:26.04`` and ``alpine:3.20`` are offered only when ``image_mirrors`` names a mirror for them: an
apt mirror (Ubuntu), or the URL of a root filesystem tarball (any image; required for Alpine).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from paddock_core.logging import get_logger
from paddock_core.rootfs import ROOT_IMAGES_BY_NAME
from paddock_hostagent.drivers.storage.safepaths import TenantPathError, Tree
from paddock_hostagent.settings import HostAgentSettings

log = get_logger(__name__)

DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What each image holds (and so what it installs) is declared once, with the description the control
# plane serves; the recipes below add only how and from where it is built.
_BASE_PACKAGES = ROOT_IMAGES_BY_NAME["debian:13"].packages
_DEVBOX_PACKAGES = ROOT_IMAGES_BY_NAME["devbox:1"].packages
_DESKTOP_PACKAGES = ROOT_IMAGES_BY_NAME["desktop:1"].packages
_CODE_INTERPRETER_PACKAGES = ROOT_IMAGES_BY_NAME["code-interpreter:1"].packages
_TARBALL_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.zst", ".tar.bz2")
_SLIM_DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)


class ImageError(Exception):
    """Root of image errors."""


class UnknownImageError(ImageError):
    """The name is not in the catalog, or not buildable on this host (no mirror configured)."""


class ImageBuildError(ImageError):
    """The build tool failed; the message carries the tail of its output."""


TEMPLATE_PREFIX = "tpl_"
TEMPLATE_DIR_MODE = 0o700  # a template's image directory (``install_template``)
DELETED_MARK = "deleted"  # in a template's image directory: its template is gone (``mark_deleted``)
# Directories a sandbox needs in every image (``_finish_rootfs``).
SANDBOX_DIRS = ("root", "tmp", "run", "etc")


@dataclass(frozen=True)
class ImageConfig:
    """The part of an OCI image config that applies to ``exec`` (see docs/templates.md)."""

    env: dict[str, str]
    workdir: str
    user: str

    def command(self, base_env: dict[str, str], given: CommandAsked, default_cwd: str) -> PreparedCommand:
        """The env, command, arguments, directory and user of a command run in a sandbox of this image,
        for ``exec`` and processes alike: its ENV under what the caller sets, its WORKDIR unless the
        caller names one, and its USER unless the caller names a user, as ``docker exec`` would.

        A USER that is a name or a uid is the guest's to become, as a caller's own ``user`` is: HOME,
        USER and LOGNAME are the account's, its groups are set, and without a WORKDIR the command starts
        in its home. (It went through setpriv before 2026-12-07: HOME stayed /root, the command started
        in /root, and a process list showed ``setpriv`` as every such command.) A ``user:group`` USER
        still goes through setpriv (util-linux, in every Debian image): the guest takes no group.

        A HOME that the image's ENV or the caller sets wins over the account's, as under
        ``docker run -u``; without one, root's is ``/root`` and a user's is the one the guest finds."""
        env = {**base_env, **self.env, **given.env}
        cmd, args, user = given.cmd, list(given.args), given.user
        if user is None and self.user and self.user not in ("root", "0", "0:0"):
            name, _, group = self.user.partition(":")
            if group:
                cmd, args = (
                    "setpriv",
                    [f"--reuid={name}", f"--regid={group}", "--init-groups", cmd, *args],
                )
            else:
                user = name
        if user is None:
            env.setdefault("HOME", "/root")
        cwd = given.cwd or self.workdir or ("" if user else default_cwd)
        return PreparedCommand(env, cmd, args, cwd, user)


@dataclass(frozen=True)
class PreparedCommand:
    """A command as the guest runs it (:meth:`ImageConfig.command`); ``cwd`` empty and ``user`` set: the
    user's home, which the guest finds."""

    env: dict[str, str]
    cmd: str
    args: list[str]
    cwd: str
    user: str | None


@dataclass(frozen=True)
class CommandAsked:
    """What a caller asked of a command: :meth:`ImageConfig.command` puts the image's config under it."""

    cmd: str
    args: list[str]
    env: dict[str, str]
    cwd: str | None
    user: str | None


@dataclass(frozen=True)
class ImageRecipe:
    name: str
    suite: str
    packages: tuple[str, ...]
    default_mirror: str | None  # None: buildable only with a configured mirror
    components: tuple[str, ...] = ("main",)
    keyring: str | None = None
    links: tuple[tuple[str, str], ...] = ()  # symbolic links made after the packages (``_add_to_tree``)
    files: tuple[tuple[str, str, int], ...] = ()  # files (path, text, mode) written after the packages


def _debian_13(name: str, packages: tuple[str, ...]) -> ImageRecipe:
    """A Debian 13 image of the catalog, with the links and files its description names (``rootfs``):
    they are in its recipe's digest, so a change to them rebuilds it."""
    image = ROOT_IMAGES_BY_NAME[name]
    return ImageRecipe(name, "trixie", packages, DEBIAN_MIRROR, links=image.links, files=image.files)


CATALOG: dict[str, ImageRecipe] = {
    recipe.name: recipe
    for recipe in (
        _debian_13("debian:13", _BASE_PACKAGES),
        _debian_13("devbox:1", _DEVBOX_PACKAGES),
        _debian_13("code-interpreter:1", _CODE_INTERPRETER_PACKAGES),
        ImageRecipe(
            "ubuntu:26.04",
            "resolute",
            ROOT_IMAGES_BY_NAME["ubuntu:26.04"].packages,
            None,
            ("main", "universe"),
            "/usr/share/keyrings/ubuntu-archive-keyring.gpg",
        ),
        ImageRecipe("alpine:3.20", "", (), None),
        _debian_13("desktop:1", _DESKTOP_PACKAGES),
    )
}


def recipe_digest(recipe: ImageRecipe, source: str) -> str:
    """What ``image.json`` records of the recipe an image was built from: a change here means a rebuild.

    A tarball's URL is its content; an apt mirror's is not (another mirror of the same suite installs the
    same packages), so only the former is in it."""
    content: dict[str, object] = {
        "suite": recipe.suite,
        "packages": list(recipe.packages),
        "components": list(recipe.components),
        "keyring": recipe.keyring,
        "dpkg_options": list(_SLIM_DPKG_OPTIONS),
        "tarball": source if source.endswith(_TARBALL_SUFFIXES) else None,
    }
    if recipe.links:  # only where there are any, so that the other images' digests stay as they were
        content["links"] = [list(link) for link in recipe.links]
    if recipe.files:
        content["files"] = [list(file) for file in recipe.files]
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _installed_packages(rootfs: Path) -> set[str]:
    """Packages dpkg lists as installed in ``rootfs`` (empty when it has no dpkg database)."""
    installed: set[str] = set()
    try:
        text = (rootfs / "var/lib/dpkg/status").read_text(errors="replace")
    except OSError:
        return installed
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith(" ")
        )
        if fields.get("Status", "").strip() == "install ok installed" and "Package" in fields:
            installed.add(fields["Package"].strip())
    return installed


def slug(name: str) -> str:
    return name.replace(":", "_").replace("/", "_")


class ImageStore:
    def __init__(self, image_dir: Path, mirrors: dict[str, str] | None = None) -> None:
        self.image_dir = image_dir
        self.mirrors = dict(mirrors or {})
        self._locks: dict[str, asyncio.Lock] = {}
        self._configs: dict[str, ImageConfig] = {}

    @classmethod
    def from_settings(cls, settings: HostAgentSettings) -> ImageStore:
        return cls(settings.image_dir, settings.image_mirrors)

    def rootfs_path(self, name: str) -> Path:
        return self.image_dir / slug(name) / "rootfs"

    def offered(self) -> list[str]:
        """Catalog names this host can build (or already has)."""
        return [name for name in CATALOG if self._source(name) is not None or self.is_cached(name)]

    def is_cached(self, name: str) -> bool:
        return (self.image_dir / slug(name) / "image.json").is_file() and self.rootfs_path(name).is_dir()

    def cached(self) -> list[str]:
        """Catalog images and templates built here: the names this host boots without building."""
        return [name for name in CATALOG if self.is_cached(name)] + self.templates()

    # -- templates: images built from a Dockerfile (``builds.py``), booted exactly like catalog ones --

    def templates(self) -> list[str]:
        """Templates this host offers: built or fetched here, and not deleted."""
        return [name for name in self._template_dirs() if not self.is_deleted(name)]

    def _template_dirs(self) -> list[str]:
        if not self.image_dir.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self.image_dir.iterdir()
            if entry.name.startswith(TEMPLATE_PREFIX) and self.is_cached(entry.name)
        )

    # A deleted template's image stays while a sandbox here boots from it (its overlay's lower layer),
    # and its sandboxes can still be forked; it is no longer offered. The mark is a file in the image's
    # directory naming the host agent that received the delete (agents on one machine may share an
    # image directory, each with sandboxes of its own), so that agent still drops the image once its
    # last sandbox is gone, also after a restart.

    def mark_deleted(self, name: str, owner: str) -> bool:
        """Marks a template here as deleted by ``owner`` (False when it is not here, or no template)."""
        if not name.startswith(TEMPLATE_PREFIX) or not self.is_cached(name):
            return False
        (self.image_dir / slug(name) / DELETED_MARK).write_text(owner + "\n")
        return True

    def is_deleted(self, name: str) -> bool:
        return (self.image_dir / slug(name) / DELETED_MARK).exists()

    def deleted_templates(self, owner: str) -> list[str]:
        """Templates ``owner`` marked deleted whose image is still here (``remove_template`` once no
        sandbox of the owner's uses it)."""
        found = []
        for name in self._template_dirs():
            try:
                marked_by = (self.image_dir / slug(name) / DELETED_MARK).read_text().strip()
            except OSError:
                continue
            if marked_by == owner:
                found.append(name)
        return found

    def config(self, name: str) -> ImageConfig:
        """What an image asks of the commands run in it (a template's ENV, WORKDIR, USER)."""
        cached = self._configs.get(name)
        if cached is None:
            try:
                meta = json.loads((self.image_dir / slug(name) / "image.json").read_text())
            except (OSError, ValueError):
                meta = {}
            raw = meta.get("config") or {}
            cached = ImageConfig(
                env=dict(raw.get("env") or {}),
                workdir=str(raw.get("workdir") or ""),
                user=str(raw.get("user") or ""),
            )
            self._configs[name] = cached
        return cached

    def image_id(self, name: str) -> str:
        """The buildah image id a template was exported from ('' if unknown)."""
        try:
            return str(
                json.loads((self.image_dir / slug(name) / "image.json").read_text()).get("image_id") or ""
            )
        except (OSError, ValueError):
            return ""

    def tree_ident(self, name: str) -> str:
        """What tells this image's tree here from any other it had or will have: its ``built_at`` and
        its ``rootfs`` directory's inode (a rebuilt, re-fetched or re-installed image gets new ones);
        '' when it is not here. A template build that starts ``FROM`` it links its files only while
        this is what the builder imported (``drivers/build/layers.py``)."""
        image_root = self.image_dir / slug(name)
        try:
            built_at = json.loads((image_root / "image.json").read_text()).get("built_at")
            info = os.stat(image_root / "rootfs", follow_symlinks=False)
        except (OSError, ValueError, AttributeError):
            return ""
        if built_at is None or not stat.S_ISDIR(info.st_mode):
            return ""
        return f"{built_at!r}:{info.st_dev}:{info.st_ino}"

    def install_template(self, name: str, tree: Path, meta: dict[str, object]) -> Path:
        """Moves a finished tree into place as image ``name`` (``tree`` must be on the same filesystem);
        ``image.json`` is written last, so a half-installed template is never offered.

        The image's directory is root's alone (0700): the tree is a tenant's, and may hold set-user-id
        programs or device nodes that only its sandboxes (root inside them) may use, never a local
        user of the host."""
        image_root = self.image_dir / slug(name)
        image_root.mkdir(parents=True, exist_ok=True)
        image_root.chmod(TEMPLATE_DIR_MODE)
        (image_root / "image.json").unlink(missing_ok=True)
        (image_root / DELETED_MARK).unlink(missing_ok=True)
        final = image_root / "rootfs"
        if final.exists():
            shutil.rmtree(final)
        _finish_rootfs(tree)
        tree.rename(final)
        meta_tmp = image_root / "image.json.tmp"
        meta_tmp.write_text(json.dumps(meta, indent=2) + "\n")
        meta_tmp.rename(image_root / "image.json")
        self._configs.pop(name, None)
        return final

    def remove_template(self, name: str) -> None:
        if not name.startswith(TEMPLATE_PREFIX):
            raise UnknownImageError(f"{name!r} is not a template image")
        self._configs.pop(name, None)
        image_root = self.image_dir / slug(name)
        (image_root / "image.json").unlink(missing_ok=True)
        shutil.rmtree(image_root, ignore_errors=True)

    def _source(self, name: str) -> str | None:
        recipe = CATALOG.get(name)
        if recipe is None:
            return None
        return self.mirrors.get(name) or recipe.default_mirror

    async def ensure(self, name: str) -> Path:
        """Returns the image's rootfs, building it first if needed (builds of one name are serialised)."""
        if self.is_cached(name):
            return self.rootfs_path(name)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self.build, name)

    def is_current(self, name: str) -> bool:
        """``name`` is cached and was built from the catalog's recipe as it is now (see the module doc)."""
        recipe = CATALOG.get(name)
        source = self._source(name)
        if not self.is_cached(name) or recipe is None or source is None:
            return self.is_cached(name)
        try:
            meta = json.loads((self.image_dir / slug(name) / "image.json").read_text())
        except (OSError, ValueError):
            return False
        recorded = meta.get("recipe") if isinstance(meta, dict) else None
        if recorded is not None:
            return bool(recorded == recipe_digest(recipe, source))
        # Built before image.json recorded the recipe: current if it holds every package the recipe names.
        return set(recipe.packages) <= _installed_packages(self.rootfs_path(name))

    def build(self, name: str, *, force: bool = False) -> Path:
        """Builds ``name`` unless it is cached and current (built from the recipe as it is now). Blocking;
        safe against concurrent builders."""
        recipe = CATALOG.get(name)
        source = self._source(name)
        if recipe is None or source is None:
            raise UnknownImageError(f"image {name!r} is not buildable on this host")
        image_root = self.image_dir / slug(name)
        image_root.mkdir(parents=True, exist_ok=True)
        with open(image_root / ".build.lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            if self.is_current(name) and not force:
                return self.rootfs_path(name)
            if self.is_cached(name):
                log.info("image_recipe_changed", image=name)
            return self._build_locked(recipe, source, image_root)

    def _build_locked(self, recipe: ImageRecipe, source: str, image_root: Path) -> Path:
        tmp = image_root / f"rootfs.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        log_path = image_root / "build.log"
        started = time.monotonic()
        log.info("image_build_started", image=recipe.name, source=source)
        try:
            if source.endswith(_TARBALL_SUFFIXES):
                _extract_tarball(source, tmp, log_path)
            else:
                _run_mmdebstrap(recipe, source, tmp, log_path)
            _add_to_tree(tmp, recipe.links, recipe.files)
            _finish_rootfs(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        final = image_root / "rootfs"
        (image_root / "image.json").unlink(missing_ok=True)
        if final.exists():
            old = image_root / f"rootfs.old-{os.getpid()}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(final)
        build_s = round(time.monotonic() - started, 1)
        meta = {
            "name": recipe.name,
            "source": source,
            "recipe": recipe_digest(recipe, source),
            "built_at": time.time(),
            "build_s": build_s,
        }
        meta_tmp = image_root / "image.json.tmp"
        meta_tmp.write_text(json.dumps(meta, indent=2) + "\n")
        meta_tmp.rename(image_root / "image.json")
        log.info("image_build_finished", image=recipe.name, build_s=build_s)
        return final


def _run_mmdebstrap(recipe: ImageRecipe, mirror: str, target: Path, log_path: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    argv = ["mmdebstrap", "--variant=minbase", "--mode=root", f"--components={','.join(recipe.components)}"]
    if recipe.packages:
        argv.append(f"--include={','.join(recipe.packages)}")
    argv += [f"--dpkgopt={option}" for option in _SLIM_DPKG_OPTIONS]
    argv.append('--aptopt=Acquire::Retries "3"')
    if recipe.keyring:
        argv.append(f"--keyring={recipe.keyring}")
    argv += [recipe.suite, str(target), mirror]
    _run_logged(argv, log_path)


def _extract_tarball(url: str, target: Path, log_path: Path) -> None:
    target.mkdir(parents=True)
    archive = target.with_name(target.name + ".archive")
    try:
        if url.startswith(("http://", "https://")):
            import httpx

            with httpx.stream("GET", url, follow_redirects=True, timeout=60) as response:
                response.raise_for_status()
                with open(archive, "wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
        else:
            shutil.copyfile(url.removeprefix("file://"), archive)
        _run_logged(["tar", "--numeric-owner", "-xpf", str(archive), "-C", str(target)], log_path)
    except OSError as exc:
        raise ImageBuildError(f"fetching {url}: {exc}") from exc
    finally:
        archive.unlink(missing_ok=True)


def _run_logged(argv: list[str], log_path: Path) -> None:
    with open(log_path, "w") as log_file:
        result = subprocess.run(argv, stdout=log_file, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise ImageBuildError(f"{argv[0]} exited with {result.returncode}:\n" + "\n".join(tail))


def _add_to_tree(
    root: Path, links: tuple[tuple[str, str], ...], files: tuple[tuple[str, str, int], ...] = ()
) -> None:
    """Makes the recipe's symbolic links and writes its files inside the new tree (parents made as
    needed, an entry in their place replaced). Paths resolve inside the tree (drivers/storage/safepaths.py)."""
    if not links and not files:
        return
    with Tree.open(root) as tree:
        for path in (*(link[0] for link in links), *(file[0] for file in files)):
            parent = path.rpartition("/")[0]
            if parent:
                tree.makedirs(parent)
        for path, points_to in links:
            tree.unlink(path)
            with tree.parent(path) as (fd, name):
                os.symlink(points_to, name, dir_fd=fd)
        for path, text, mode in files:
            tree.write_file(path, text.encode(), mode)


def _finish_rootfs(root: Path) -> None:
    """Leaves what every sandbox rewrites per boot out of the image, and the dirs it needs in.

    The tree may be a tenant's (a template): every path is resolved inside it (drivers/storage/safepaths.py),
    so a ``/tmp`` or ``/etc`` that is a symlink leads where it leads inside the image, as in a sandbox,
    never to the host's directories; one that leads nowhere inside it is replaced by an empty directory.
    """
    with Tree.open(root) as tree:
        for relative in SANDBOX_DIRS:
            try:
                tree.makedirs(relative)
            except TenantPathError:  # a symlink leading nowhere inside the image, or a file
                tree.unlink(relative)
                tree.makedirs(relative)
        tree.chmod("tmp", 0o1777)
        for relative in ("etc/hostname", "etc/resolv.conf"):
            tree.unlink(relative)
        os.fchmod(tree.fd, 0o755)


def build_image(name: str, settings: HostAgentSettings) -> Path:
    """CLI entry (``paddock hostagent build-image NAME``): builds the image unless cached."""
    return ImageStore.from_settings(settings).build(name)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings = HostAgentSettings()
    store = ImageStore.from_settings(settings)
    if args[:1] == ["list"]:
        for name in store.offered():
            print(f"{name}\t{'cached' if store.is_cached(name) else 'buildable'}")
        return 0
    if len(args) == 2 and args[0] == "build":
        try:
            print(build_image(args[1], settings))
        except ImageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    print("usage: python -m paddock_hostagent.images build NAME | list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
