"""Computer use (spec §12.3): ``/v1/sandboxes/{id}/computer/…`` on a desktop sandbox.

Every route takes ``SandboxPrincipalDep`` (§12.1 opens ``computer/*`` to a sandbox's own access token)
and the optional ``screen_id`` query. Actions answer ``{"ok": true}``; ``/screenshot`` answers the raw
PNG; ``/windows`` and ``/screens`` a bare array. The work is in ``computer.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from paddock_controlplane.edge.api import caller
from paddock_controlplane.edge.api.deps import SandboxPrincipalDep, ServicesDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute, optional_body
from paddock_controlplane.records.schemas.computer import (
    ClipboardRequest,
    KeysRequest,
    LaunchRequest,
    MouseButtonRequest,
    MouseClickRequest,
    MouseDragRequest,
    MouseMoveRequest,
    MouseScrollRequest,
    OpenRequest,
    ScreenSizeRequest,
    TypeRequest,
    WindowMoveRequest,
    WindowSizeRequest,
)
from paddock_controlplane.sandboxes import computer
from paddock_core import envelope

router = APIRouter(prefix="/v1/sandboxes", tags=["computer"], route_class=BoundaryRoute)
BASE = "/{sandbox_id}/computer"
ScreenQuery = Annotated[
    str | None, Query(description="screen-0 … screen-7 (default screen-0)", pattern=r"^screen-[0-7]$")
]
Coordinate = Annotated[int | None, Query(ge=0, le=100_000)]
ScreenPath = Annotated[str, Path(description="screen-0 … screen-7", pattern=r"^screen-[0-7]$")]
WindowPath = Annotated[
    str, Path(description="an X window id, decimal or 0x hex", pattern=computer.WINDOW_ID.pattern)
]
Endpoint = Callable[..., Awaitable[Response]]


def _ok(data: object) -> JSONResponse:
    return JSONResponse(envelope.success(data))


async def _answered(request: Request, work: Awaitable[object], *, reads_only: bool = True) -> Response:
    """The helper's answer. A read (GET) ends with its caller (``caller.py``); an action (a click, a
    window closed) runs to its end even when its caller has gone, so it never stops half done."""
    if reads_only:
        return await caller.while_connected(request, work, _ok)
    return _ok(await work)


async def _body(request: Request, model: type[BaseModel] | None) -> dict[str, Any]:
    return computer.dump(await optional_body(request, model)) if model is not None else {}


def _sandbox_operation(operation: str, model: type[BaseModel] | None, reads_only: bool) -> Endpoint:
    async def endpoint(
        sandbox_id: str,
        request: Request,
        principal: SandboxPrincipalDep,
        services: ServicesDep,
        screen_id: ScreenQuery = None,
    ) -> Response:
        args = await _body(request, model)
        done = computer.perform(services, principal.user_id, sandbox_id, operation, args, screen_id)
        return await _answered(request, done, reads_only=reads_only)

    return endpoint


def _window_operation(operation: str, model: type[BaseModel] | None, reads_only: bool) -> Endpoint:
    async def endpoint(
        sandbox_id: str,
        window_id: WindowPath,
        request: Request,
        principal: SandboxPrincipalDep,
        services: ServicesDep,
        screen_id: ScreenQuery = None,
    ) -> Response:
        args = {**await _body(request, model), "window_id": computer.check_window_id(window_id)}
        done = computer.perform(services, principal.user_id, sandbox_id, operation, args, screen_id)
        return await _answered(request, done, reads_only=reads_only)

    return endpoint


def _screen_operation(operation: str, model: type[BaseModel] | None, reads_only: bool) -> Endpoint:
    async def endpoint(
        sandbox_id: str,
        screen_id: ScreenPath,
        request: Request,
        principal: SandboxPrincipalDep,
        services: ServicesDep,
    ) -> Response:
        args = await _body(request, model)
        screen = computer.check_screen_id(screen_id)
        done = computer.perform(services, principal.user_id, sandbox_id, operation, args, screen)
        return await _answered(request, done, reads_only=reads_only)

    return endpoint


@router.get(
    BASE + "/screenshot",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}, "description": "the screenshot as PNG"}},
)
async def screenshot(
    sandbox_id: str,
    request: Request,
    principal: SandboxPrincipalDep,
    services: ServicesDep,
    screen_id: ScreenQuery = None,
    window_id: Annotated[str | None, Query(max_length=20)] = None,
    x: Coordinate = None,
    y: Coordinate = None,
    width: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    height: Annotated[int | None, Query(ge=1, le=100_000)] = None,
) -> Response:
    png = computer.screenshot(
        services,
        principal.user_id,
        sandbox_id,
        screen_id=screen_id,
        window_id=window_id,
        region={"x": x, "y": y, "width": width, "height": height},
    )
    return await caller.while_connected(
        request, png, lambda png: Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})
    )


@router.get(BASE + "/windows")
async def list_windows(
    sandbox_id: str,
    request: Request,
    principal: SandboxPrincipalDep,
    services: ServicesDep,
    screen_id: ScreenQuery = None,
    application: Annotated[str | None, Query(max_length=256)] = None,
) -> Response:
    args = {"application": application} if application else {}
    return await _answered(
        request, computer.perform(services, principal.user_id, sandbox_id, "windows", args, screen_id)
    )


@router.get(BASE + "/screens/{screen_id}/connect")
async def connect(
    sandbox_id: str, screen_id: ScreenPath, principal: SandboxPrincipalDep, services: ServicesDep
) -> JSONResponse:
    screen = computer.check_screen_id(screen_id)
    return _ok(await computer.connect(services, principal.user_id, sandbox_id, screen))


# (method, path under /computer, helper operation, body model, kind); kind picks the path parameters.
ROUTES: list[tuple[str, str, str, type[BaseModel] | None, str]] = [
    ("GET", "/screen", "screen", None, "sandbox"),
    ("GET", "/cursor", "cursor", None, "sandbox"),
    ("GET", "/clipboard", "clipboard_get", None, "sandbox"),
    ("PUT", "/clipboard", "clipboard_set", ClipboardRequest, "sandbox"),
    ("POST", "/open", "open", OpenRequest, "sandbox"),
    ("POST", "/launch", "launch", LaunchRequest, "sandbox"),
    ("POST", "/mouse/move", "mouse_move", MouseMoveRequest, "sandbox"),
    ("POST", "/mouse/click", "mouse_click", MouseClickRequest, "sandbox"),
    ("POST", "/mouse/scroll", "mouse_scroll", MouseScrollRequest, "sandbox"),
    ("POST", "/mouse/drag", "mouse_drag", MouseDragRequest, "sandbox"),
    ("POST", "/mouse/down", "mouse_down", MouseButtonRequest, "sandbox"),
    ("POST", "/mouse/up", "mouse_up", MouseButtonRequest, "sandbox"),
    ("POST", "/keyboard/type", "keyboard_type", TypeRequest, "sandbox"),
    ("POST", "/keyboard/press", "keyboard_press", KeysRequest, "sandbox"),
    ("POST", "/keyboard/down", "keyboard_down", KeysRequest, "sandbox"),
    ("POST", "/keyboard/up", "keyboard_up", KeysRequest, "sandbox"),
    ("GET", "/windows/current", "window_current", None, "sandbox"),
    ("GET", "/windows/{window_id}", "window_get", None, "window"),
    ("DELETE", "/windows/{window_id}", "window_close", None, "window"),
    ("GET", "/windows/{window_id}/geometry", "window_geometry", None, "window"),
    ("POST", "/windows/{window_id}/focus", "window_focus", None, "window"),
    ("POST", "/windows/{window_id}/maximize", "window_maximize", None, "window"),
    ("POST", "/windows/{window_id}/minimize", "window_minimize", None, "window"),
    ("POST", "/windows/{window_id}/restore", "window_restore", None, "window"),
    ("POST", "/windows/{window_id}/move", "window_move", WindowMoveRequest, "window"),
    ("POST", "/windows/{window_id}/resize", "window_resize", WindowSizeRequest, "window"),
    ("GET", "/screens", "screens", None, "sandbox"),
    ("POST", "/screens", "screen_create", ScreenSizeRequest, "sandbox"),
    ("GET", "/screens/{screen_id}", "screen_get", None, "screen"),
    ("DELETE", "/screens/{screen_id}", "screen_delete", None, "screen"),
    ("POST", "/screens/{screen_id}/resize", "screen_resize", ScreenSizeRequest, "screen"),
]
FACTORIES = {"sandbox": _sandbox_operation, "window": _window_operation, "screen": _screen_operation}


async def _current_window_is_get_only() -> Response:
    raise StarletteHTTPException(405, headers={"Allow": "GET"})


# /windows/current is GET only; without this, DELETE /windows/{window_id} would take "current" as an id
# and answer 400 where the path's other methods must be a 405. Registered first, so it matches first.
router.add_api_route(
    BASE + "/windows/current",
    _current_window_is_get_only,
    methods=["DELETE"],
    name="computer_window_current_not_allowed",
    include_in_schema=False,
)

for method, suffix, operation, model, kind in ROUTES:
    router.add_api_route(
        BASE + suffix,
        FACTORIES[kind](operation, model, method == "GET"),
        methods=[method],
        name=f"computer_{operation}",
        response_model=None,
    )
