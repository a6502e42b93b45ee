"""Receiving Paddock webhooks: check that a delivery is authentic and fresh before trusting it.

    from paddock.webhooks import verify, WebhookVerificationError

    try:
        event = verify(raw_body, request.headers, secret)   # the endpoint's whsec_… secret
    except WebhookVerificationError:
        return 400
    if event["event"] == "sandbox.create": ...

The signature (§11.15) is ``X-Webhook-Signature: sha256=<hex>``, the HMAC-SHA256 keyed with the
endpoint's secret over ``<X-Webhook-Timestamp>.<raw body bytes>``. Pass the body exactly as received:
re-serialised JSON has other bytes and never matches.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from paddock._errors import WebhookVerificationError

SIGNATURE_HEADER = "x-webhook-signature"
TIMESTAMP_HEADER = "x-webhook-timestamp"
DELIVERY_HEADER = "x-webhook-delivery"


def _header(headers: Mapping[str, str] | Iterable[tuple[str, str]], name: str) -> str | None:
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        key_text = key.decode() if isinstance(key, bytes) else str(key)
        if key_text.lower() == name:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def sign(secret: str, timestamp: int, raw_body: bytes) -> str:
    """The ``X-Webhook-Signature`` value Paddock sends for this timestamp and body."""
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + raw_body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def verify(
    raw_body: bytes,
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    secret: str,
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """Return the event (``{"event", "occurredAt", "data"}``) if the delivery is authentic and fresh.

    Raises :class:`~paddock.WebhookVerificationError` when a header is missing or malformed, when the
    timestamp is more than ``tolerance_s`` seconds from ``now`` (either way: replays are refused), or
    when the signature does not match (compared in constant time). Header names are case-insensitive.
    """
    if isinstance(raw_body, str):  # a common slip; the signature is over bytes
        raw_body = raw_body.encode()
    timestamp_text = _header(headers, TIMESTAMP_HEADER)
    signature = _header(headers, SIGNATURE_HEADER)
    if not timestamp_text or not signature:
        raise WebhookVerificationError("missing X-Webhook-Timestamp or X-Webhook-Signature header")
    timestamp_text = timestamp_text.strip()
    if not timestamp_text.isdigit():
        raise WebhookVerificationError("X-Webhook-Timestamp is not Unix seconds")
    timestamp = int(timestamp_text)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise WebhookVerificationError(
            f"X-Webhook-Timestamp is {int(current - timestamp)} s away from now (tolerance {tolerance_s} s)"
        )
    expected = sign(secret, timestamp, raw_body)
    if not hmac.compare_digest(signature.strip().encode(), expected.encode()):
        raise WebhookVerificationError("X-Webhook-Signature does not match the body")
    try:
        event = json.loads(raw_body)
    except ValueError:
        raise WebhookVerificationError("the body is not JSON") from None
    if not isinstance(event, dict):
        raise WebhookVerificationError("the body is not a JSON object")
    return event


__all__ = ["WebhookVerificationError", "sign", "verify"]
