"""Signed file URLs: a link that reads (``GET``) or writes (``PUT``) one path of one sandbox through
``/v1/sandboxes/{id}/files`` without an API key, until it expires (docs/files.md). It is what E2B's
``download_url``/``upload_url`` give an agent to hand a browser or another service a file, on ``/v1``.

The signature is an HMAC-SHA256 of the sandbox id, the operation, the path and the expiry under a key
derived from the server's secret key, so a link opens that one path of that one sandbox for that one
operation, and changing any of them (or the expiry) breaks it. Nothing is stored: a link cannot be
revoked before it expires except by the sandbox's end or a new ``PADDOCK_CP_SECRET_KEY``, which is why
its life is bounded (a week at most, ``schemas.commands.MAX_EXPIRES_IN_S``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from paddock_core.crypto import constant_time_equals, purpose_key

#: What a link opens: the operation its maker names, and the method it answers.
METHODS = {"read": "GET", "write": "PUT"}
#: An expiry is Unix seconds, so at most 12 digits (a longer one is not one this server made).
_MAX_EXPIRY_DIGITS = 12


def signature(secret: str, sandbox_id: str, operation: str, path: str, expires: int) -> str:
    message = "\n".join((sandbox_id, operation, path, str(expires))).encode()
    digest = hmac.new(purpose_key(secret, b"paddock-file-url"), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def query(secret: str, sandbox_id: str, operation: str, path: str, expires: int) -> dict[str, Any]:
    """The query string that opens ``path``: the path itself, its expiry and their signature."""
    return {
        "path": path,
        "expires": str(expires),
        "signature": signature(secret, sandbox_id, operation, path, expires),
    }


def refusal(
    secret: str, sandbox_id: str, method: str, path: str, expires: str, given: str, now: float
) -> str | None:
    """Why a signed request does not open ``path`` (None: it does): a method no link answers, an expiry
    that is not Unix seconds, a signature made for another sandbox, path, operation or expiry, or a
    link past its expiry."""
    operation = next((name for name, answers in METHODS.items() if answers == method), None)
    if operation is None:
        return f"a signed URL does not open {method}"
    if not (expires.isascii() and expires.isdigit() and len(expires) <= _MAX_EXPIRY_DIGITS):
        return "expires: must be a Unix time in seconds"
    if not constant_time_equals(given, signature(secret, sandbox_id, operation, path, int(expires))):
        return "signature: not this server's for this sandbox, path, operation and expiry"
    if int(expires) < now:
        return "the signed URL has expired"
    return None
