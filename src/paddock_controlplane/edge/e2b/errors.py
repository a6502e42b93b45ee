"""E2B's error shape: ``{"code": <HTTP status>, "message": "…"}`` (e2b-dev/infra ``spec/openapi.yml``,
``Error``), which the SDK reads ``message`` from and maps by status (404 not found, 409 paused, 401, 429
and 503 with their own exceptions)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from paddock_controlplane.edge.api.errors import wire_path
from paddock_core import errors
from paddock_core.logging import get_logger

log = get_logger("paddock.e2b")


class NotBuilt(errors.PaddockError):
    """An E2B operation Paddock does not serve yet: 501, never a bare 404 (docs/e2b.md lists them)."""

    status, code, default_message = 501, "NOT_IMPLEMENTED", "not implemented by Paddock's E2B API"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"code": status, "message": message}


def respond(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def from_paddock(exc: errors.PaddockError, message: str | None = None) -> JSONResponse:
    """``exc`` in E2B's shape (``message`` in place of its own when given)."""
    headers: dict[str, str] = {}
    retry_after = getattr(exc, "retry_after_s", None)
    if exc.status in (429, 503):
        headers["Retry-After"] = str(max(1, int(retry_after or 1)))
    return respond(exc.status, message or exc.message, headers)


def install(app: FastAPI) -> None:
    """Every error the E2B listener answers is in E2B's shape; an unknown route is 501, not 404."""

    @app.exception_handler(errors.PaddockError)
    async def paddock_error(_: Request, exc: errors.PaddockError) -> JSONResponse:
        return from_paddock(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = exc.errors()
        first = problems[0] if problems else {}
        field = wire_path(tuple(first.get("loc", ())))
        reason = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return respond(400, f"{field}: {reason}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            return respond(
                501, f"{request.method} {request.url.path} is not implemented by Paddock's E2B API"
            )
        return respond(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("e2b_unexpected_error", path=request.url.path, error=str(exc))
        return respond(500, "internal error")
