"""A built image's tree made from its base's tree on the host plus only the layers the build added.

Exporting a template used to copy the whole merged tree out of the builder's store (``cp -a`` of the
base and every layer: 235 MB for debian:13 with jq, 3-6 s under load). The base is already on the host
as a tree (the catalog image, or the template the Dockerfile starts ``FROM``), read-only: the new tree
hard-links it (``link_tree``, started while ``buildah bud`` runs) and then applies, bottom to top, only
the layers above the base (``layers_above`` reads their order from the store's own metadata), as
overlayfs would stack them:

- a whiteout (a character device 0/0) removes what is below it; an opaque directory
  (``trusted.overlay.opaque``) hides everything below it;
- anything else replaces what is below it. An entry below is always *removed* first (``prepare``),
  never written through: a hard-linked file is shared with the base's tree, and ``cp`` only ever
  creates new files.

Layers in a store are unpacked from tars (containers/storage's ``ApplyDiff``), so they hold no
redirected directories or metacopy files; a directory marked redirected is refused
(``LayerFormatError``) and the caller exports the merged tree instead.

The layers are the tenant's: nothing here follows a symlink in them or in the tree being made. Both are
walked by descriptors opened ``O_NOFOLLOW`` and entries removed relative to them, so every directory
``cp`` later writes into is a real one. No process of the build is left when this runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from paddock_hostagent.drivers.base import DriverError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OPAQUE = "trusted.overlay.opaque"
REDIRECT = "trusted.overlay.redirect"
LAYER_ID = re.compile(r"^[0-9a-f]{64}$")
#: containers/storage's image and layer lists, read whole: far above any real store's, bounded anyway.
MAX_METADATA_BYTES = 64 * 1024 * 1024


class LayerError(DriverError):
    """A layer could not be applied (a copy or a link failed): the caller exports the merged tree."""


class LayerFormatError(LayerError):
    """A layer holds something this module does not apply (a redirected directory)."""


def _read_json(path: Path) -> object:
    with open(path, "rb") as handle:
        data = handle.read(MAX_METADATA_BYTES + 1)
    if len(data) > MAX_METADATA_BYTES:
        raise LayerError(f"{path.name} is larger than {MAX_METADATA_BYTES} bytes")
    return json.loads(data)


def layers_above(
    storage: Path, tag: str, base_tag: str, base_storage: Path | None = None
) -> list[Path] | None:
    """The diff directories of ``tag``'s layers above ``base_tag``'s top layer, bottom first; None when
    ``tag``'s layers do not stand on ``base_tag`` (another ``FROM``), or either is not in its store.
    ``base_storage``: the store ``base_tag`` is in, when not ``storage`` (the catalog's,
    ``basestore.py``, which the build read as an additional image store)."""
    try:
        parent = _parents(storage)
        tops = _tops(storage)
        base = (_tops(base_storage) if base_storage is not None else tops).get(base_tag)
    except (OSError, ValueError, LayerError):
        return None
    current = tops.get(tag)
    chain: list[str] = []
    while current and current != base and len(chain) <= len(parent):
        if not LAYER_ID.fullmatch(current):
            return None
        chain.append(current)
        current = parent.get(current, "")
    if not current or current != base:
        return None
    return [storage / "overlay" / layer / "diff" for layer in reversed(chain)]


def stands_on_missing_layers(storage: Path, image_store: Path) -> bool:
    """Whether a layer in ``storage`` has a parent that is neither there nor in ``image_store`` (the
    additional image store it reads): an account's store whose images stood on a catalog image the
    host's catalog store no longer holds. Unreadable records count as missing."""
    try:
        parent = _parents(storage)
    except FileNotFoundError:
        return False  # a new store: no layer at all
    except (OSError, ValueError, LayerError):
        return True
    try:
        known = parent.keys() | _parents(image_store).keys()
    except FileNotFoundError:
        known = set(parent)  # an image store not made yet holds nothing
    except (OSError, ValueError, LayerError):
        return True
    return any(up and up not in known for up in parent.values())


def _parents(storage: Path) -> dict[str, str]:
    """Each layer in ``storage`` to its parent's id ('' for a bottom layer)."""
    layers = _read_json(storage / "overlay-layers" / "layers.json")
    if not isinstance(layers, list):
        raise LayerError(f"{storage}: layers.json is not a list")
    return {
        str(layer["id"]): str(layer.get("parent") or "")
        for layer in layers
        if isinstance(layer, dict) and "id" in layer
    }


def _tops(storage: Path) -> dict[str, str]:
    """Each image name in ``storage`` to its top layer's id."""
    images = _read_json(storage / "overlay-images" / "images.json")
    if not isinstance(images, list):
        raise LayerError(f"{storage}: images.json is not a list")
    top: dict[str, str] = {}
    for image in images:
        if isinstance(image, dict) and isinstance(image.get("layer"), str):
            for name in image.get("names") or []:
                top[str(name)] = image["layer"]
    return top


async def link_tree(source: Path, dest: Path) -> None:
    """``dest`` (missing or empty) becomes ``source``'s tree with every file hard-linked (directories
    are new); ``source`` is a tree the host made (a catalog image or an installed template)."""
    dest.mkdir(parents=True, exist_ok=True)
    await _tool("cp", "-al", f"{source}/.", str(dest))


async def apply_layers(diffs: list[Path], dest: Path) -> None:
    """Applies each layer in turn onto ``dest`` as overlayfs stacks it (see the module doc)."""
    for diff in diffs:
        found = await asyncio.to_thread(prepare, diff, dest)
        await _tool("cp", "-a", f"{diff}/.", str(dest))
        await asyncio.to_thread(finish, dest, found)


@dataclass
class Found:
    """What ``prepare`` saw in a layer that ``cp`` copies as it is: whiteouts (device nodes in the tree
    once copied) and opaque directories (their xattr copied with them)."""

    whiteouts: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)


def prepare(diff: Path, dest: Path) -> Found:
    """Removes from ``dest`` everything the layer ``diff`` replaces, hides or deletes, so that copying the
    layer onto it only creates new entries (and sets the metadata of directories both hold)."""
    found = Found()
    diff_fd = os.open(diff, _DIR_FLAGS)
    try:
        dest_fd = os.open(dest, _DIR_FLAGS)
        try:
            _prepare_dir(diff_fd, dest_fd, "", found)
        finally:
            os.close(dest_fd)
    finally:
        os.close(diff_fd)
    return found


def _xattrs(fd: int) -> list[str]:
    try:
        return os.listxattr(fd)
    except OSError:
        return []


def _prepare_dir(diff_fd: int, dest_fd: int | None, rel: str, found: Found) -> None:
    names = _xattrs(diff_fd)
    if REDIRECT in names:
        raise LayerFormatError(f"/{rel}: a redirected directory")
    if OPAQUE in names and rel:
        found.opaque.append(rel)
        if dest_fd is not None:
            for name in os.listdir(dest_fd):
                _remove(dest_fd, name)
    with os.scandir(diff_fd) as entries:
        children = [(entry.name, entry.stat(follow_symlinks=False)) for entry in entries]
    for name, info in children:
        path = f"{rel}/{name}" if rel else name
        below = _lstat(dest_fd, name) if dest_fd is not None else None
        is_dir = stat.S_ISDIR(info.st_mode)
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
            found.whiteouts.append(path)
        child_dest: int | None = None
        if dest_fd is not None and below is not None:
            if is_dir and stat.S_ISDIR(below.st_mode):
                child_dest = os.open(name, _DIR_FLAGS, dir_fd=dest_fd)
            else:  # replaced or deleted: removed, never written through (it may be the base's file)
                _remove(dest_fd, name, below)
        if not is_dir:
            continue
        child_diff = os.open(name, _DIR_FLAGS, dir_fd=diff_fd)
        try:
            _prepare_dir(child_diff, child_dest, path, found)
        finally:
            os.close(child_diff)
            if child_dest is not None:
                os.close(child_dest)


def _lstat(dir_fd: int | None, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove(dir_fd: int, name: str, info: os.stat_result | None = None) -> None:
    """Removes an entry of the directory ``dir_fd`` whatever it is, a directory with all it holds
    (``rmtree`` by descriptors: never follows a symlink in it)."""
    info = info or _lstat(dir_fd, name)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def finish(dest: Path, found: Found) -> None:
    """After a layer's copy: its whiteouts leave no device node behind, and its opaque directories no
    overlay mark (the tree is a lower layer of its own later)."""
    root = os.open(dest, _DIR_FLAGS)
    try:
        for path in found.whiteouts:
            parent, _, name = path.rpartition("/")
            with _opened(root, parent) as fd, contextlib.suppress(FileNotFoundError):
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                    os.unlink(name, dir_fd=fd)
        for path in found.opaque:
            with _opened(root, path) as fd, contextlib.suppress(OSError):
                os.removexattr(fd, OPAQUE)
    finally:
        os.close(root)


@contextlib.contextmanager
def _opened(root: int, rel: str) -> Iterator[int]:
    """The directory ``rel`` under ``root``, each component opened ``O_NOFOLLOW``."""
    fds = [os.dup(root)]
    try:
        for part in (p for p in rel.split("/") if p):
            fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


async def _tool(*argv: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = await process.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(Exception):
            await asyncio.shield(process.wait())
        raise
    if process.returncode != 0:
        raise LayerError(f"{argv[0]} {argv[1]} failed: {err.decode(errors='replace').strip()[-300:]}")
