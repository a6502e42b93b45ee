"""Pieces shared by ``Client`` and ``AsyncClient``: configuration, envelopes, retry policy."""

from __future__ import annotations

import email.utils
import json
import os
import random
import re
import time
import warnings
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import httpx

from paddock._errors import APIError, PaddockWarning, ProtocolError, RateLimitedError, error_class

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
        return float(min(self.cap_s, self.base_s * 2**attempt + random.uniform(0, self.base_s)))


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, float(when.timestamp()) - time.time())


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
    warning = resp.headers.get("warning")
    if warning:
        warnings.warn(PaddockWarning(warning), stacklevel=4)
    if 300 <= resp.status_code < 400:
        raise ProtocolError(f"unexpected redirect ({resp.status_code}) to {resp.headers.get('location')!r}")
    if resp.status_code in (204, 205) or not resp.content:
        return None
    try:
        doc = resp.json()
    except ValueError:
        raise ProtocolError(f"expected JSON, got {resp.headers.get('content-type')!r}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise ProtocolError("response is not a JSend success envelope")
    return doc.get("data")


def no_read_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    """The client's connect, write and pool limits with no limit on the wait for the answer (a
    buffered command's run: the server sends nothing until the command ends)."""
    return httpx.Timeout(timeout.connect, read=None, write=timeout.write, pool=timeout.pool)


def timed_out(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, httpx.TimeoutException)


def drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


#: States that end a wait for ``running`` or ``paused``; a wait for ``destroyed`` still awaits ``destroying``.
WAIT_ABORT = frozenset({"error", "failed", "destroying", "destroyed"})


#: The longest single long-poll the SDK asks for, and how quick an answer means "no long-poll here".
LONG_POLL_MAX_MS = 10_000
LONG_POLL_QUICK_S = 0.05


def long_poll_ms(remaining_s: float) -> int:
    return max(0, min(LONG_POLL_MAX_MS, int(remaining_s * 1000)))


def wait_params(wait_for: str | None, wait_ms: int | None) -> dict[str, str] | None:
    if wait_for is None:
        return None
    params = {"wait_for": wait_for}
    if wait_ms is not None:
        params["wait_ms"] = str(wait_ms)
    return params


def wait_aborts(target: str, status: str) -> bool:
    if target == "destroyed":
        return status in ("error", "failed")
    return status in WAIT_ABORT


#: A sandbox's own routes (exec, files, processes …), whose 409 may say it is paused.
_SANDBOX_ROUTE = re.compile(r"^/?v1/sandboxes/(sb-[^/?]+)/([^?]+)")


def paused_sandbox(path: str, exc: APIError) -> str | None:
    """The id of the sandbox whose route ``path`` answered the contract's 409 because it is paused
    (``AsyncClient(auto_resume=True)`` resumes it and tries once more); None for anything else."""
    if exc.status != 409 or exc.code != "INVALID_STATE" or "it is paused" not in exc.message:
        return None
    match = _SANDBOX_ROUTE.match(path)
    if match is None or match.group(2).rstrip("/") in ("resume", "pause"):
        return None
    return unquote(match.group(1))


def path(*segments: str) -> str:
    """``v1/<seg>/<seg>…`` with every dynamic segment percent-encoded (``quote(safe='')``)."""
    return "/".join(["v1", *(quote(str(segment), safe="") for segment in segments)])


def page_items(page: Any) -> tuple[list[Any], int | None]:
    """The items of one page and the ``total`` (None when absent: stop after this page).

    Accepts the paginated envelope, a bare array and the legacy ``{"<key>": [...]}`` wrappers (§8.3).
    """
    if isinstance(page, list):
        return page, None
    if not isinstance(page, dict):
        return [], None
    if isinstance(page.get("data"), list):
        pagination = page.get("pagination")
        total = pagination.get("total") if isinstance(pagination, dict) else None
        return list(page["data"]), int(total) if isinstance(total, int) else None
    for key in ("shapes", "templates", "disks"):
        if isinstance(page.get(key), list):
            return list(page[key]), None
    return [], None


def ndjson_frame(line: str) -> dict[str, Any] | None:
    """One NDJSON line as a frame; None for keep-alives (blank, ``:`` comments, SSE control lines)."""
    line = line.strip()
    if not line or line.startswith(":") or line.startswith(("event:", "id:", "retry:")):
        return None
    if line.startswith("data:"):
        line = line[5:].strip()
    try:
        frame = json.loads(line)
    except ValueError:
        raise ProtocolError(f"stream line is not JSON: {line[:80]!r}") from None
    if not isinstance(frame, dict):
        raise ProtocolError(f"stream line is not a JSON object: {line[:80]!r}")
    return frame


class Backoff:
    """Adaptive poll interval: 0.1 s for the first second, then ×1.25 per poll up to ``cap_s``."""

    def __init__(self, cap_s: float = 2.0) -> None:
        self.cap_s = cap_s
        self.elapsed_s = 0.0
        self.delay_s = 0.1

    def next(self) -> float:
        delay = self.delay_s
        self.elapsed_s += delay
        if self.elapsed_s >= 1.0:
            self.delay_s = min(self.cap_s, self.delay_s * 1.25)
        return delay


__all__ = [
    "APIError",
    "Backoff",
    "RetryPolicy",
    "drop_none",
    "headers",
    "long_poll_ms",
    "ndjson_frame",
    "page_items",
    "path",
    "raise_for_error",
    "resolve",
    "unwrap",
    "wait_params",
]
