"""Files beyond one file's bytes: list, stat, remove, make a directory, rename, a directory as a tar
stream both ways, and a watch.

Every operation runs inside the sandbox through its exec (``sh -c SCRIPT sh PATH…``, the paths passed
as arguments, never pasted into a command line), so a path, a symlink or ``..`` is resolved by the
sandbox's own kernel view, never by a root process on the host (rule 3). The scripts are
``sandbox_fs``'s, one source for this API and the E2B edge's. A tar goes through a file in the sandbox's
``/tmp``: the upload is the contract's streamed, capped ``PUT /files`` and the extraction is ``tar`` run
as the sandbox's user inside it; a download is packed there and streamed back, then removed.

A watch follows the guest's inotify (``dirwatch``): what appears (``create``), is written (``modify``)
or goes away (``delete``) arrives within tens of milliseconds; a rename shows as a delete and a create,
and ``overflow`` says events were lost (list again). Where the guest has no watch to give (a guest
agent older than it, no inotify instance left, or more directories than it watches) the watch polls a
listing (bounded by ``MAX_WATCH_ENTRIES``) every ``WATCH_INTERVAL_S`` instead, and reports what
appeared, changed size or time, or went away, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.queries import running_sandbox
from paddock_controlplane.records.services import Services
from paddock_controlplane.sandboxes import commands, dirwatch, sandbox_fs
from paddock_controlplane.sandboxes.activity import Inflight, touch
from paddock_core import errors

MAX_DEPTH = sandbox_fs.MAX_DEPTH
MAX_WATCH_ENTRIES = sandbox_fs.MAX_WATCH_ENTRIES
WATCH_INTERVAL_S = sandbox_fs.WATCH_INTERVAL_S
#: A watch ends after this long; the client opens another to go on.
MAX_WATCH_S = 3600.0
HEARTBEAT_S = 15.0
_TYPES = {"FILE_TYPE_FILE": "file", "FILE_TYPE_DIRECTORY": "dir", "FILE_TYPE_SYMLINK": "symlink"}
_UNTAR = 'mkdir -p -- "$1" && tar -xf "$2" -C "$1"; code=$?; rm -f -- "$2"; exit $code'
_TAR = '[ -e "$1" ] || exit 3; [ -d "$1" ] || exit 4; exec tar -cf "$2" -C "$1" .'


def _entry(raw: dict[str, Any]) -> dict[str, Any]:
    out = {
        "name": raw["name"],
        "path": raw["path"],
        "type": _TYPES.get(raw["type"], "other"),
        "size": int(raw["size"]),
        "mode": raw["mode"],
        "permissions": raw["permissions"],
        "owner": raw["owner"],
        "group": raw["group"],
        "modified_at": raw["modifiedTime"],
    }
    if "symlinkTarget" in raw:
        out["symlink_target"] = raw["symlinkTarget"]
    return out


async def _run(services: Services, sandbox: Sandbox, script: str, *args: str) -> tuple[int, bytes, str]:
    link = await hostlink.for_host(services, sandbox.host_id)
    with Inflight(services, sandbox.id):
        result = await link.exec(sandbox.id, "/bin/sh", ["-c", script, "sh", *args], {}, None)
    if result.get("error"):
        raise errors.InvalidState(f"the sandbox did not run the file operation: {result['error']}")
    out = result.get("stdout", "").encode("utf-8", "surrogateescape")
    return int(result.get("exit_code", -1)), out, result.get("stderr", "")


def _fail(code: int, stderr: str, path: str, field: str = "path") -> errors.PaddockError:
    if code == sandbox_fs.MISSING:
        return errors.NotFound(f"{path} does not exist in the sandbox")
    if code == sandbox_fs.NOT_DIR:
        return errors.ValidationFailed.field(field, f"{path} is not a directory")
    if code == sandbox_fs.EXISTS:
        return errors.AlreadyExists(f"{path} already exists")
    detail = (stderr.strip() or f"exit status {code}")[:1000]
    return errors.ValidationFailed.field(field, detail)


async def _one(services: Services, sandbox: Sandbox, script: str, path: str, *more: str) -> dict[str, Any]:
    code, out, err = await _run(services, sandbox, script, path, sandbox_fs.PRINTF, *more)
    entries = sandbox_fs.entries(out) if code == 0 else []
    if not entries:
        raise _fail(code, err, path)
    return _entry(entries[0])


async def _listing(services: Services, sandbox: Sandbox, path: str, depth: int) -> list[dict[str, Any]]:
    code, out, err = await _run(services, sandbox, sandbox_fs.LIST, *sandbox_fs.list_args(path, depth))
    if code != 0:
        raise _fail(code, err, path)
    return [_entry(e) for e in sandbox_fs.listing(out)]


async def list_dir(
    services: Services, user_id: str, sandbox_id: str, path: str, depth: int
) -> dict[str, Any]:
    if not 1 <= depth <= MAX_DEPTH:
        raise errors.ValidationFailed.field("depth", f"must be 1..{MAX_DEPTH}")
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    return {"path": path, "entries": await _listing(services, sandbox, path, depth)}


async def stat(services: Services, user_id: str, sandbox_id: str, path: str) -> dict[str, Any]:
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    return await _one(services, sandbox, sandbox_fs.STAT, path)


async def make_dir(services: Services, user_id: str, sandbox_id: str, path: str) -> dict[str, Any]:
    """The directory and its parents; ``created`` is false when it was already there."""
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    try:
        return {**await _one(services, sandbox, sandbox_fs.MKDIR, path), "created": True}
    except errors.AlreadyExists:
        entry = await _one(services, sandbox, sandbox_fs.STAT, path)
        if entry["type"] != "dir":
            raise errors.AlreadyExists(f"{path} exists and is not a directory") from None
        return {**entry, "created": False}


async def rename(
    services: Services, user_id: str, sandbox_id: str, source: str, destination: str
) -> dict[str, Any]:
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    return await _one(services, sandbox, sandbox_fs.MOVE, source, destination)


async def remove(services: Services, user_id: str, sandbox_id: str, path: str) -> None:
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    code, _, err = await _run(services, sandbox, sandbox_fs.REMOVE, path)
    if code != 0:
        raise _fail(code, err, path)


def _absolute(path: str, resolved: bytes) -> str:
    """``path`` for the guest: as given when absolute, else ``DIRECTORY``'s answer (under ``$HOME``)."""
    return path if path.startswith("/") else resolved.decode("utf-8", "surrogateescape").removesuffix("\n")


def _scratch() -> str:
    return f"/tmp/.paddock-tar-{secrets.token_hex(8)}"


async def upload_tar(
    services: Services,
    user_id: str,
    sandbox_id: str,
    path: str,
    body: AsyncIterator[bytes],
    length: int | None,
) -> dict[str, Any]:
    """Unpack a tar stream into the directory ``path`` (made with its parents) inside the sandbox."""
    scratch = _scratch()
    uploaded = await commands.upload(
        services, user_id, sandbox_id, scratch, body, length, audited_as=(path, "tar")
    )
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    code, _, err = await _run(services, sandbox, _UNTAR, path, scratch)
    if code != 0:
        raise errors.ValidationFailed.field("body", f"the tar did not unpack: {err.strip()[:1000]}")
    return {"path": path, "size": uploaded["size"]}


async def download_tar(services: Services, user_id: str, sandbox_id: str, path: str) -> hostlink.Download:
    """The directory ``path`` as an uncompressed tar of its contents (``./``-relative names)."""
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    scratch = _scratch()
    code, _, err = await _run(services, sandbox, _TAR, path, scratch)
    if code != 0:
        await _run(services, sandbox, 'rm -f -- "$1"', scratch)
        raise _fail(code, err, path)
    link = await hostlink.for_host(services, sandbox.host_id)
    touch(services, sandbox.id)
    try:
        download = await link.download(sandbox.id, scratch)
    except BaseException:
        await _run(services, sandbox, 'rm -f -- "$1"', scratch)
        raise

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in download.chunks:
                yield chunk
        finally:
            with contextlib.suppress(Exception):
                await _run(services, sandbox, 'rm -f -- "$1"', scratch)

    return commands.audited_download(
        services, sandbox, path, hostlink.Download(download.size, chunks()), what="tar"
    )


async def watch(
    services: Services, user_id: str, sandbox_id: str, path: str, recursive: bool
) -> AsyncIterator[bytes]:
    """NDJSON lines: ``{"event": "create"|"modify"|"delete", "path": …, "type": …}`` (and ``"overflow"``
    with the watched path when the guest lost events: list again); the first line is
    ``{"watching": path}`` once the watch is in place (no events for what was already there)."""
    sandbox = await running_sandbox(services, user_id, sandbox_id)
    depth = MAX_DEPTH if recursive else 1
    # One limiter with the edge's WatchDir: a place per open watch, 429 with Retry-After past the cap.
    slot = sandbox_fs.watch_slots.take(user_id, sandbox.id)

    async def snapshot() -> dict[str, dict[str, Any]]:
        entries = await _listing(services, sandbox, path, depth)
        return {e["path"]: e for e in entries[:MAX_WATCH_ENTRIES]}

    seen: dict[str, dict[str, Any]] = {}
    try:
        # errors (missing, not a directory) are the route's 404/400, in the listing's words
        code, out, err = await _run(services, sandbox, sandbox_fs.DIRECTORY, path)
        if code != 0:
            raise _fail(code, err, path)
        link = await hostlink.for_host(services, sandbox.host_id)
        inotify = await dirwatch.open_stream(link, sandbox.id, _absolute(path, out), recursive)
        if inotify is None:
            seen = await snapshot()
    except BaseException:
        slot.release()
        raise

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for line in poll() if inotify is None else follow(inotify):
                yield line
        finally:
            slot.release()

    async def follow(stream: dirwatch.Lines) -> AsyncIterator[bytes]:
        yield json.dumps({"watching": path}).encode() + b"\n"
        until = asyncio.get_running_loop().time() + MAX_WATCH_S
        async for item in dirwatch.follow(stream, path, HEARTBEAT_S, until):
            if isinstance(item, dirwatch.Event):
                yield json.dumps({"event": item.kind, "path": item.path, "type": item.type}).encode() + b"\n"
            elif isinstance(item, dirwatch.Overflow):
                yield json.dumps({"event": "overflow", "path": path, "type": "dir"}).encode() + b"\n"
            elif isinstance(item, dirwatch.Tick):
                yield b'{"hb": true}\n'  # keeps proxies and client read timeouts from ending a quiet watch
            else:
                gone = (
                    f"{path} does not exist in the sandbox"
                    if item.missing
                    else "the sandbox is no longer running"
                )
                yield json.dumps({"error": gone}).encode() + b"\n"

    async def poll() -> AsyncIterator[bytes]:
        nonlocal seen
        yield json.dumps({"watching": path}).encode() + b"\n"
        loop = asyncio.get_running_loop()
        end = loop.time() + MAX_WATCH_S
        quiet_since = loop.time()
        while loop.time() < end:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if loop.time() - quiet_since > HEARTBEAT_S:
                quiet_since = loop.time()
                yield b'{"hb": true}\n'  # keeps proxies and client read timeouts from ending a quiet watch
            try:
                now = await snapshot()
            except errors.PaddockError as exc:
                yield json.dumps({"error": exc.message}).encode() + b"\n"
                return
            except hostlink.SandboxGoneError:
                yield json.dumps({"error": "the sandbox is no longer running"}).encode() + b"\n"
                return
            for name, entry in now.items():
                before = seen.get(name)
                if before is None:
                    kind = "create"
                elif (before["size"], before["modified_at"]) != (entry["size"], entry["modified_at"]):
                    kind = "modify"
                else:
                    continue
                yield json.dumps({"event": kind, "path": name, "type": entry["type"]}).encode() + b"\n"
            for name in seen.keys() - now.keys():
                yield (
                    json.dumps({"event": "delete", "path": name, "type": seen[name]["type"]}).encode() + b"\n"
                )
            seen = now

    stream = lines()
    slot.hold_for(stream)  # a stream never iterated (its client left first) frees its place too
    return stream
