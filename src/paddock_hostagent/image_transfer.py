"""Template images between hosts: a host that lacks a template's image fetches it from the host that
built it (docs/templates.md, "More than one host").

- ``GET /internal/v1/images/{id}`` on the holding host streams the template's image directory as an
  uncompressed tar (``image.json`` and ``rootfs``, numeric owners), straight from ``tar``;
- ``POST /internal/v1/images/{id}/fetch`` (``{"source_url": …}``) on the host that lacks it pulls that
  stream from the source host with the caller's own bearer token (every host agent accepts the one
  host token the control plane holds), unpacks it next to where the image will live (same filesystem),
  checks that its ``image.json`` names this template, and installs it with ``ImageStore.install_template``
  — ``image.json`` written last, so a fetch that stops half-way leaves nothing bootable. Fetches of one
  image are serialized; one already here answers at once.

Only templates travel: catalog images are built by each host from the Debian archive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from paddock_core.logging import get_logger
from paddock_hostagent import errors
from paddock_hostagent.images import TEMPLATE_PREFIX, ImageStore, slug

log = get_logger(__name__)

CHUNK_BYTES = 1 << 20
FETCH_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0)


def _check(images: ImageStore, name: str) -> None:
    if not name.startswith(TEMPLATE_PREFIX):
        raise errors.BadRequest(f"only templates ({TEMPLATE_PREFIX}…) move between hosts, not {name!r}")


async def stream(images: ImageStore, name: str) -> AsyncIterator[bytes]:
    """The image as a tar stream; 404 (``SandboxNotFound``) before the first byte when it is not here."""
    _check(images, name)
    if not images.is_cached(name):
        raise errors.SandboxNotFound(f"image {name} is not on this host")
    root = images.image_dir / slug(name)
    process = await asyncio.create_subprocess_exec(
        "tar", "-C", str(root), "--numeric-owner", "-cf", "-", "image.json", "rootfs",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip

    async def chunks() -> AsyncIterator[bytes]:
        assert process.stdout is not None
        try:
            while chunk := await process.stdout.read(CHUNK_BYTES):
                yield chunk
            if await process.wait() != 0:  # the receiver sees a short tar and refuses it
                raise OSError(f"tar of {name} exited with {process.returncode}")
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    return chunks()


def recorded_size(images: ImageStore, name: str) -> int:
    """The ext4 size the image's ``image.json`` records (0 if unknown)."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        return int(
            json.loads((images.image_dir / slug(name) / "image.json").read_text()).get("ext4_size_bytes") or 0
        )
    return 0


class ImageFetcher:
    def __init__(self, images: ImageStore) -> None:
        self.images = images
        self._locks: dict[str, asyncio.Lock] = {}

    async def fetch(self, name: str, source_url: str, authorization: str) -> None:
        _check(self.images, name)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if self.images.is_cached(name):
                return
            image_root = self.images.image_dir / slug(name)
            incoming = image_root / f"fetch-{secrets.token_hex(4)}.incoming"
            incoming.mkdir(parents=True)
            try:
                await self._receive(name, source_url.rstrip("/"), authorization, incoming)
                try:
                    meta = json.loads((incoming / "image.json").read_text())
                except (OSError, ValueError) as exc:
                    raise errors.BadRequest(
                        f"the image from {source_url} has no readable image.json"
                    ) from exc
                if (
                    not isinstance(meta, dict)
                    or meta.get("name") != name
                    or not (incoming / "rootfs").is_dir()
                ):
                    raise errors.BadRequest(f"{source_url} sent an image that is not {name}")
                await asyncio.to_thread(self.images.install_template, name, incoming / "rootfs", meta)
            finally:
                await asyncio.to_thread(shutil.rmtree, incoming, True)
                with contextlib.suppress(OSError):
                    image_root.rmdir()  # a failed fetch leaves no empty image directory behind
        log.info("template_image_fetched", template_id=name, source=source_url)

    async def _receive(self, name: str, source_url: str, authorization: str, dest: Path) -> None:
        process = await asyncio.create_subprocess_exec(
            "tar", "-C", str(dest), "--numeric-owner", "-xf", "-",
            stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stdin is not None
        try:
            async with (
                httpx.AsyncClient(timeout=FETCH_TIMEOUT) as http,
                http.stream(
                    "GET", f"{source_url}/internal/v1/images/{name}", headers={"Authorization": authorization}
                ) as response,
            ):
                if response.status_code != 200:
                    body = (await response.aread()).decode(errors="replace")[:300]
                    raise errors.BadRequest(f"{source_url} answered {response.status_code}: {body}")
                async for chunk in response.aiter_bytes(CHUNK_BYTES):
                    process.stdin.write(chunk)
                    await process.stdin.drain()
            process.stdin.close()
            _, err = await process.communicate()
            if process.returncode != 0:
                raise errors.BadRequest(f"unpacking {name}: {err.decode(errors='replace').strip()[-300:]}")
        except httpx.HTTPError as exc:
            raise errors.BadRequest(f"fetching {name} from {source_url}: {exc}") from exc
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
