"""An S3 disk's configuration parsed into fields s3fs can be given safely, in one place for both sides.

The control plane checks a disk's fields when it is registered or attached (a 400 naming the field),
and the host agent checks them again before it builds s3fs's command line from them (defence in
depth, and for records written before these rules). s3fs takes its settings as ``-o a=b,c=d``: a comma
in any value is another option (``url=https://…,use_cache=/some/host/dir``), so every value is parsed
here, against a whitelist of characters, and re-serialised; nothing a user wrote reaches s3fs as is.

Each function returns the canonical value or raises ``ValueError`` with what is wrong (no field name:
the caller names the field).
"""

from __future__ import annotations

import ipaddress
import re

MAX_ENDPOINT = 2048
MAX_PATH = 1024
#: The sandbox's own kernel filesystems: a disk mounted over them hides them, and a detach there would
#: take the sandbox's procfs, devtmpfs or sysfs with it.
RESERVED_ROOTS = ("proc", "dev", "sys")

_URL = re.compile(
    r"(?P<scheme>[A-Za-z]+)://"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>(?:/[A-Za-z0-9._~-]*)*)"
)
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_REGION = re.compile(r"[A-Za-z0-9-]{1,64}")
_SEGMENT = re.compile(r"[A-Za-z0-9._~@+=!()' -]+")


def endpoint(text: str) -> str:
    """``scheme://host[:port][/path]`` with scheme http or https: no user info, query, fragment,
    comma, whitespace or control character anywhere. Returns it re-serialised (scheme and host in
    lower case, no trailing slash)."""
    if len(text) > MAX_ENDPOINT:
        raise ValueError(f"must be at most {MAX_ENDPOINT} characters")
    match = _URL.fullmatch(text)
    if match is None:
        raise ValueError(
            "must be an http or https URL: scheme://host[:port][/path], without user info, query, "
            "fragment, commas, spaces or control characters"
        )
    scheme = match["scheme"].lower()
    if scheme not in ("http", "https"):
        raise ValueError("must be an http or https URL")
    host = match["host"].lower()
    if host.startswith("["):
        try:
            address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError("must name a valid host") from None
        host = f"[{address.compressed}]"
    else:
        labels = host.removesuffix(".").split(".")
        if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
            raise ValueError("must name a valid host")
        host = ".".join(labels)
    port = match["port"]
    if port is not None:
        if not 1 <= int(port) <= 65535:
            raise ValueError("must have a port between 1 and 65535")
        port = str(int(port))
    path = match["path"].rstrip("/")
    if any(segment in (".", "..") for segment in path.split("/")) or "//" in path:
        raise ValueError("must have a path without empty, '.' or '..' segments")
    return f"{scheme}://{host}{':' + port if port else ''}{path}"


def bucket(text: str) -> str:
    if not _BUCKET.fullmatch(text):
        raise ValueError("must be a bucket name: letters, digits, '.', '_' and '-', at most 255")
    return text


def region(text: str) -> str:
    if not _REGION.fullmatch(text):
        raise ValueError("must be a region name: letters, digits and '-', at most 64")
    return text


def sub_path(text: str | None) -> str | None:
    """A folder of the bucket, relative (``reports/2026``); None or empty for the whole bucket."""
    if not text:
        return None
    if len(text) > MAX_PATH:
        raise ValueError(f"must be at most {MAX_PATH} characters")
    segments = text.strip("/").split("/") if not text.startswith("/") else []
    if not segments or any(s in (".", "..") or not _SEGMENT.fullmatch(s) for s in segments):
        raise ValueError(
            "must be a relative folder of the bucket: segments of letters, digits and ._~@+=!()' -, "
            "without '.' or '..'"
        )
    return "/".join(segments)


def mount_path(text: str) -> str:
    """A clean absolute path in the sandbox, not ``/`` and not under /proc, /dev or /sys; returned
    without a trailing slash."""
    if not text.startswith("/"):
        raise ValueError("must be an absolute path")
    if len(text) > MAX_PATH:
        raise ValueError(f"must be at most {MAX_PATH} characters")
    if any(ch.isspace() or not ch.isprintable() or ch == "\\" for ch in text):
        raise ValueError("must not contain whitespace, control characters or backslashes")
    normal = text.rstrip("/") if text != "/" else ""
    if not normal:
        raise ValueError("must not be /")
    segments = normal.split("/")[1:]
    if any(segment in ("", ".", "..") for segment in segments):
        raise ValueError("must be a normal absolute path: no '//', '.' or '..' segments")
    if segments[0] in RESERVED_ROOTS:
        raise ValueError("must not be /proc, /dev, /sys or a path under them (the sandbox's own)")
    return normal
