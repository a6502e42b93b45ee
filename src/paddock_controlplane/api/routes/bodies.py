"""JSON request bodies: one parser for every route (``paddock_core.jsonbody``: NUL, NaN/Infinity and
deep nesting are refused with a 400 naming the field), and bodies that may be absent.

Routes that declare a body model to FastAPI use ``JsonRoute`` (``APIRouter(route_class=JsonRoute)``),
which parses the body with that parser before FastAPI reads it; routes whose body is optional call
``optional_body``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from paddock_core import errors, jsonbody

M = TypeVar("M", bound=BaseModel)


def parse_json(raw: bytes, nul_allowed: frozenset[str] = frozenset()) -> Any:
    """The body's JSON value, or a 400 ``VALIDATION_FAILED`` naming the offending field."""
    try:
        return jsonbody.parse(raw, nul_allowed=nul_allowed)
    except jsonbody.JsonBodyError as exc:
        raise errors.ValidationFailed.field(exc.field, exc.reason) from None


class JsonRoute(APIRoute):
    """A route whose declared JSON body goes through ``parse_json`` first.

    FastAPI parses bodies with Starlette's ``Request.json()`` (plain ``json.loads``), which caches its
    result on the request; the value parsed here is put in that cache, so the body is parsed once."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def parse_then_handle(request: Request) -> Response:
            raw = await request.body()
            if raw.strip():
                request._json = parse_json(raw)  # Starlette's cache of request.json()
            return await handler(request)

        return parse_then_handle


async def optional_body(request: Request, model: type[M], nul_allowed: frozenset[str] = frozenset()) -> M:
    """Parse a JSON object body into ``model``; an empty body means ``{}``. Content-Type is not required.
    ``nul_allowed``: fields whose strings may hold NUL (``paddock_core.jsonbody``)."""
    raw = await request.body()
    data: object = parse_json(raw, nul_allowed) if raw.strip() else {}
    return validate_body(data, model)


def validate_body(data: object, model: type[M]) -> M:
    if not isinstance(data, dict):
        raise errors.ValidationFailed.field("body", "body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
