"""Pieces shared by ``Client`` and ``AsyncClient``: configuration, envelopes, retry policy."""

from __future__ import annotations

import email.utils
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from paddock._errors import APIError, ProtocolError, RateLimitedError, error_class

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
ENV_BASE_URL = "PADDOCK_BASE_URL"
ENV_API_KEY = "PADDOCK_API_KEY"
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
RETRY_ANY_METHOD = frozenset({429, 503})
RETRY_IDEMPOTENT = frozenset({408, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``max_retries`` retries; backoff ``base × 2^attempt + jitter``, capped; Retry-After wins."""

    max_retries: int = 2
    base_s: float = 0.5
    cap_s: float = 30.0

    def should_retry(self, method: str, status: int | None, attempt: int) -> bool:
        if attempt >= self.max_retries:
            return False
        if status is None:  # no answer at all
            return method in IDEMPOTENT
        return status in RETRY_ANY_METHOD or (method in IDEMPOTENT and status in RETRY_IDEMPOTENT)

    def delay_s(self, attempt: int, retry_after: str | None = None) -> float:
        parsed = parse_retry_after(retry_after)
        if parsed is not None:
            return parsed
        return min(self.cap_s, self.base_s * 2**attempt + random.uniform(0, self.base_s))


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def resolve(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    url = base_url or os.environ.get(ENV_BASE_URL) or DEFAULT_BASE_URL
    return url.rstrip("/") + "/", api_key or os.environ.get(ENV_API_KEY)


def headers(api_key: str | None) -> dict[str, str]:
    out = {"Accept": "application/json", "User-Agent": "paddock-python/0.1.0"}
    if api_key:
        out["X-Api-Key"] = api_key
    return out


def raise_for_error(resp: httpx.Response, body: bytes | None = None) -> None:
    if resp.status_code < 400:
        return
    raw = body if body is not None else resp.content
    message, code, fields = f"HTTP {resp.status_code}", None, {}
    try:
        doc = httpx.Response(200, content=raw).json()
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        data = doc.get("data")
        if doc.get("status") == "fail" and isinstance(data, dict):
            code = data.get("code")
            message = str(data.get("message") or message)
            fields = {k: str(v) for k, v in data.items() if k not in ("code", "message")}
        elif isinstance(doc.get("message"), str):
            message = doc["message"]
        elif isinstance(doc.get("error"), str):  # the gateway's error body
            message, code = doc["error"], doc.get("code")
    cls = error_class(resp.status_code)
    request_id = resp.headers.get("x-request-id")
    if cls is RateLimitedError:
        raise RateLimitedError(
            resp.status_code,
            message,
            code=code,
            request_id=request_id,
            fields=fields,
            retry_after_s=parse_retry_after(resp.headers.get("retry-after")),
        )
    raise cls(resp.status_code, message, code=code, request_id=request_id, fields=fields)


def unwrap(resp: httpx.Response) -> Any:
    """The ``data`` of a JSend success; raise the typed error otherwise."""
    raise_for_error(resp)
    if resp.status_code in (204, 205) or not resp.content:
        return None
    try:
        doc = resp.json()
    except ValueError:
        raise ProtocolError(f"expected JSON, got {resp.headers.get('content-type')!r}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise ProtocolError("response is not a JSend success envelope")
    return doc.get("data")


def drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


__all__ = ["APIError", "RetryPolicy", "drop_none", "headers", "raise_for_error", "resolve", "unwrap"]
