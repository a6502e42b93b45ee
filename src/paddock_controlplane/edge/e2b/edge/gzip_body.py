"""gzip on envd's ``/files``, as envd serves it: ``POST`` takes ``Content-Encoding: gzip`` (what the SDKs send
for ``write(..., gzip=True)``), ``GET`` answers gzip when the client asks for gzip alone (see ``accepts_gzip``).

An upload is inflated under the same cap as a plain one (``max_upload_bytes``) and checked whole before
anything is written: the compressed body is spooled (itself capped), inflated once in bounded pieces only
to count (a body that inflates past the cap is a 413 and leaves nothing in the sandbox, however small it
was compressed), then inflated again into the write. A body that inflates to little is kept from the
first pass instead of being inflated twice.
"""

from __future__ import annotations

import asyncio
import tempfile
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import IO

from paddock_core import errors

#: zlib's window bits for the gzip format (header and trailer), as ``Content-Encoding: gzip`` is.
GZIP_WBITS = 16 + zlib.MAX_WBITS
#: The most one inflate step yields: what a member's worth of zeros costs in memory at once.
PIECE_BYTES = 1 << 20
#: The compressed body read per step.
READ_BYTES = 64 << 10
#: The compressed body is kept in memory up to this, then in a temporary file.
SPOOL_MEMORY_BYTES = 8 << 20
#: An upload that inflates to at most this is kept from the counting pass (not inflated twice).
KEEP_BYTES = 8 << 20
#: Downloads are compressed fast: the edge's clients are on loopback or a LAN.
COMPRESS_LEVEL = 1


def accepts_gzip(header: str) -> bool:
    """Whether a read is answered gzip: when gzip is the only coding the client offers (what the SDKs send
    for ``read(..., gzip=True)``: ``Accept-Encoding: gzip``), or when it refuses identity. A library's
    default list (httpx's and fetch's ``gzip, deflate, br …`` on every request) reads as "any is fine"
    and gets the bytes as they are: envd compresses those too, but here the compressing is the control
    plane's CPU, ~30 ms a MiB of data that does not compress, on every SDK read."""
    acceptable: set[str] = set()
    identity_refused = False
    for item in header.split(","):
        name, _, params = item.partition(";")
        name = name.strip().lower()
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if not name:
            continue
        if quality > 0:
            acceptable.add(name)
        elif name in ("identity", "*"):
            identity_refused = True
    if "gzip" not in acceptable and "*" not in acceptable:
        return False
    return identity_refused or acceptable <= {"gzip", "identity"}


async def compressed(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` as one gzip member (compressed off the event loop, a chunk at a time)."""
    compressor = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, GZIP_WBITS)
    try:
        async for chunk in chunks:
            if len(chunk) > READ_BYTES:
                out = await asyncio.to_thread(compressor.compress, chunk)
            else:
                out = compressor.compress(chunk)
            if out:
                yield out
        yield compressor.flush()
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def _invalid(reason: str) -> errors.ValidationFailed:
    return errors.ValidationFailed.field("Content-Encoding", f"gzip: {reason}")


def _inflate(spool: IO[bytes]) -> Iterator[bytes]:
    """The spooled body inflated, in pieces of at most ``PIECE_BYTES``: one gzip member or several one
    after another (as a gzip reader takes them). Raises a 400 naming Content-Encoding for a body that is
    not gzip, is empty, or ends inside a member."""
    spool.seek(0)
    inflater = zlib.decompressobj(GZIP_WBITS)
    pending, fed = b"", False
    while True:
        if not pending:
            pending = spool.read(READ_BYTES)
            if not pending:
                break
        if inflater.eof:  # the previous member has ended: what follows is another member
            inflater = zlib.decompressobj(GZIP_WBITS)
        try:
            out = inflater.decompress(pending, PIECE_BYTES)
        except zlib.error as exc:
            raise _invalid(f"the body is not valid gzip ({exc})") from None
        fed = True
        pending = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
        if out:
            yield out
    if not fed:
        raise _invalid("the body is empty")
    tail = inflater.flush()  # at most a match's worth: the input is all consumed
    if tail:
        yield tail
    if not inflater.eof:
        raise _invalid("the body ends inside the compressed stream")


@dataclass
class Inflated:
    """A checked gzip upload: its inflated ``size`` (at most the cap) and its content, from memory when
    small, else inflated again from the spool. ``close`` drops the spool."""

    size: int
    spool: IO[bytes]
    kept: list[bytes] | None

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.kept is not None:
            for piece in self.kept:
                yield piece
            return
        for piece in _inflate(self.spool):
            yield piece
            await asyncio.sleep(0)  # a piece is at most 1 MiB of inflate: let others run between

    def close(self) -> None:
        self.spool.close()


def _count(spool: IO[bytes], limit: int) -> tuple[int, list[bytes] | None]:
    """The inflated size (a 413 past ``limit``), and the pieces themselves while they total at most
    ``KEEP_BYTES``."""
    size = 0
    kept: list[bytes] | None = []
    for piece in _inflate(spool):
        size += len(piece)
        if size > limit:
            raise errors.PayloadTooLarge(
                f"upload is over the {limit}-byte limit once decompressed (Content-Encoding: gzip)"
            )
        if kept is not None and size <= KEEP_BYTES:
            kept.append(piece)
        else:
            kept = None
    return size, kept


async def inflate_checked(chunks: AsyncIterator[bytes], limit: int) -> Inflated:
    """Spools the gzip body (at most ``limit`` bytes compressed) and inflates it once to check it: a 413
    naming the limit when it inflates past ``limit``, a 400 naming Content-Encoding when it is not gzip.
    Nothing is written anywhere until it has passed."""
    spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115 (Inflated closes it)
    try:
        received = 0
        async for chunk in chunks:
            received += len(chunk)
            if received > limit:
                raise errors.PayloadTooLarge(f"upload is over the {limit}-byte limit")
            spool.write(chunk)
        size, kept = await asyncio.to_thread(_count, spool, limit)
    except BaseException:
        spool.close()
        raise
    return Inflated(size, spool, kept)
