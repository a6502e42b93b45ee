"""One place that turns exceptions into the contract's error body (§2.2): ``{error, code, …}``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from paddock_core.logging import get_logger
from paddock_gateway.errors import GatewayError, MethodNotAllowed, NotFound

log = get_logger("paddock.gateway.errors")


def error_response(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), exc.status, headers=exc.headers)


def request_id_of(request: Request) -> str | None:
    value = request.scope.get("state", {}).get("request_id")
    return None if value is None else str(value)


def internal_error(request_id: str | None) -> JSONResponse:
    return JSONResponse({"error": "Internal error", "code": "internal_error", "request_id": request_id}, 500)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def _domain(_: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        # Only path/query parameters are declared to FastAPI; none of them has a 422 in the contract.
        return error_response(NotFound())

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            return error_response(MethodNotAllowed())
        return error_response(NotFound())

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = request_id_of(request)
        log.error("unhandled_exception", path=request.url.path, request_id=request_id, exc_info=exc)
        return internal_error(request_id)
