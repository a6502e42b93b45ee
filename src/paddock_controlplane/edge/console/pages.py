"""The console's routes: the page, its assets, and the browser's terminal socket.

Every answer carries a Content-Security-Policy that allows scripts from this origin only (no inline
script, no eval), connections to this origin only, and no framing. Styles also allow ``'unsafe-inline'``
because xterm.js writes its cell-size and colour rules into a ``<style>`` element at run time; no
script can be injected that way.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

from paddock_controlplane.edge.console import shell
from paddock_core import envelope

STATIC = Path(__file__).parent / "static"
#: What ``/console/assets/`` serves: these names only, so no path from a request reaches the disk.
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "vendor/xterm.js": "text/javascript; charset=utf-8",
    "vendor/xterm.css": "text/css; charset=utf-8",
    "vendor/addon-fit.js": "text/javascript; charset=utf-8",
}
CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "font-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
MARK = "paddock_console_mounted"

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> Response:
    return RedirectResponse("/console", status_code=307)


@router.get("/console")
@router.get("/console/")
async def page() -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/console/assets/{name:path}")
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    path = STATIC / name
    if media_type is None or not path.is_file():
        # A vendor file is missing until ``make console-assets`` has run; the page says so.
        body = envelope.fail("NOT_FOUND", f"console asset {name!r} not found")
        return JSONResponse(body, status_code=404, headers=HEADERS)
    return FileResponse(path, media_type=media_type, headers=HEADERS)


def mount_console(app: FastAPI) -> None:
    """Adds the console's routes to ``app`` (once; a second call is a no-op)."""
    if getattr(app.state, MARK, False):
        return
    app.include_router(router)
    app.add_api_websocket_route("/console/shell-ws/{sandbox_id}", shell.console_shell_ws)
    setattr(app.state, MARK, True)
