"""One place that turns exceptions into the contract's JSend envelopes (§4, §5)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from paddock_core import envelope, errors
from paddock_core.logging import get_logger

log = get_logger("paddock.errors")


def wire_path(loc: tuple[Any, ...]) -> str:
    """``("body", "disks", 0, "mount_path")`` → ``disks[0].mount_path``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "json-or-python", "str", "list[", "dict[")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


# Bounds and integer parsing read as the rest of the API's reasons do ("limit: must be at least 1").
_REASONS = {
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be greater than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
}


def _validation_reason(err: dict[str, Any]) -> str:
    template = _REASONS.get(str(err.get("type")))
    if template is not None:
        try:
            return template.format(**(err.get("ctx") or {}))
        except (KeyError, IndexError):
            pass
    msg = str(err.get("msg", "invalid"))
    return msg.removeprefix("Value error, ")


def error_response(exc: errors.PaddockError) -> JSONResponse:
    headers: dict[str, str] = {}
    retry_after = getattr(exc, "retry_after_s", None)
    if retry_after is not None and exc.status in (429, 503):
        headers["Retry-After"] = str(int(retry_after))
    if exc.status >= 500:
        return JSONResponse(envelope.error(exc.message, exc.status), exc.status, headers=headers)
    return JSONResponse(envelope.fail(exc.code, exc.message, exc.fields), exc.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(errors.PaddockError)
    async def _domain(_: Request, exc: errors.PaddockError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields: dict[str, str] = {}
        for err in exc.errors():
            if err.get("type") == "json_invalid":
                fields["body"] = "body is not valid JSON"
                continue
            path = wire_path(tuple(err.get("loc", ())))
            if err.get("type") == "model_attributes_type" or (
                path == "body" and err.get("type") in ("dict_type", "model_type")
            ):
                fields["body"] = "body must be a JSON object"
                continue
            fields.setdefault(path, _validation_reason(err))
        message = "; ".join(f"{k}: {v}" for k, v in fields.items()) or "validation failed"
        return error_response(errors.ValidationFailed(message, fields=fields))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error_response(errors.NotFound("route not found"))
        if exc.status_code == 405:
            return error_response(errors.MethodNotAllowed())
        if exc.status_code >= 500:
            return JSONResponse(envelope.error(str(exc.detail), exc.status_code), exc.status_code)
        return JSONResponse(
            envelope.fail("VALIDATION_FAILED" if exc.status_code == 400 else "ERROR", str(exc.detail)),
            exc.status_code,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = getattr(request.state, "request_id", None) or request.scope.get("state", {}).get(
            "request_id"
        )
        log.error("unhandled_exception", path=request.url.path, request_id=request_id, exc_info=exc)
        return JSONResponse(envelope.error(f"internal error (request {request_id})", 500), 500)
