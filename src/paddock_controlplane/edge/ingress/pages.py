"""The proxy's own answers (404, 502 …): HTML for browsers, the JSend envelope for everything else.

Every such answer carries ``X-Paddock-Ingress-Error: <code>`` so a client can tell the proxy's 404
from one sent by the application in the sandbox, and (over HTTP/1.1) ``Connection: close``.
"""

from __future__ import annotations

import html
import json
from http import HTTPStatus

from paddock_core import envelope

HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{status} {reason}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:40rem;margin:4rem auto;color:#222}}
code{{background:#f3f3f3;padding:0 .2em}}</style></head>
<body><h1>{status} {reason}</h1><p>{message}</p>
<p><small>Paddock ingress &middot; <code>{code}</code></small></p></body></html>
"""


def parts(status: int, code: str, message: str, *, accept: str | None) -> tuple[list[tuple[str, str]], bytes]:
    """The page's headers (without framing and ``Connection``) and body, for HTTP/1.1 and HTTP/2 alike."""
    reason = HTTPStatus(status).phrase
    if accept and "text/html" in accept:
        content_type = "text/html; charset=utf-8"
        body = HTML.format(status=status, reason=reason, message=html.escape(message), code=code).encode()
    else:
        content_type = "application/json"
        payload = envelope.fail(code, message) if status < 500 else envelope.error(message, status)
        if status >= 500:
            payload["data"] = {"code": code}
        body = json.dumps(payload).encode()
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        ("X-Paddock-Ingress-Error", code),
    ]
    return headers, body


def render(status: int, code: str, message: str, *, accept: str | None, head_only: bool = False) -> bytes:
    headers, body = parts(status, code, message, accept=accept)
    lines = "".join(f"{key}: {value}\r\n" for key, value in headers)
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n{lines}Connection: close\r\n\r\n".encode()
    return head if head_only else head + body
