"""Identifiers: lowercase ULIDs with a resource prefix (``sb-01j…``, ``disk_01j…``)."""

from __future__ import annotations

import os
import time

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def ulid(timestamp_ms: int | None = None) -> str:
    """A 26-character lowercase Crockford base32 ULID: 48 bits of ms time, 80 random bits."""
    ms = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    """``new_id("sb-")`` → ``sb-01jabcd…``; the prefix carries its own separator."""
    return f"{prefix}{ulid()}"
