"""The optional surface of spec §12 that this server does not implement yet: 501, never 404.

A 404 on ``/v1/sandboxes/{id}/…`` reads as "sandbox not found" to both SDKs; 501 with the error
envelope (``{"status":"error","message":"not implemented","code":501}``) is what §12 asks for, and
neither SDK retries it. Each path answers only the methods §12 lists (others get 405). The routes stay
out of the OpenAPI document until they are implemented.
"""

from __future__ import annotations

from typing import NoReturn

from fastapi import APIRouter

from paddock_core import errors

router = APIRouter(include_in_schema=False)

# (methods, path under /v1/sandboxes/{sandbox_id}) as listed in §12.3 (§12.1: access_tokens.py,
# §12.2: processes.py).
ROUTES: list[tuple[tuple[str, ...], str]] = [
    (("GET",), "/computer/screenshot"),
    (("GET",), "/computer/screen"),
    (("GET",), "/computer/cursor"),
    (("GET", "PUT"), "/computer/clipboard"),
    (("POST",), "/computer/open"),
    (("POST",), "/computer/launch"),
    *(
        (("POST",), f"/computer/mouse/{action}")
        for action in ("move", "click", "scroll", "drag", "down", "up")
    ),
    *((("POST",), f"/computer/keyboard/{action}") for action in ("type", "press", "down", "up")),
    (("GET",), "/computer/windows"),
    (("GET",), "/computer/windows/current"),
    (("GET", "DELETE"), "/computer/windows/{window_id}"),
    (("GET",), "/computer/windows/{window_id}/geometry"),
    *(
        (("POST",), f"/computer/windows/{{window_id}}/{action}")
        for action in ("focus", "maximize", "minimize", "restore", "move", "resize")
    ),
    (("GET", "POST"), "/computer/screens"),
    (("GET", "DELETE"), "/computer/screens/{screen_id}"),
    (("GET",), "/computer/screens/{screen_id}/connect"),
    (("POST",), "/computer/screens/{screen_id}/resize"),
]


async def not_implemented() -> NoReturn:
    raise errors.NotImplementedYet("not implemented")


for methods, suffix in ROUTES:
    router.add_api_route(
        "/{sandbox_id}" + suffix, not_implemented, methods=list(methods), response_model=None
    )
