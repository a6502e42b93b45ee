"""JSON request bodies: one parser for every route (``paddock_core.jsonbody``: NUL, NaN/Infinity and
deep nesting are refused with a 400 naming the field), and bodies that may be absent.

Routers use ``BoundaryRoute`` (``APIRouter(route_class=BoundaryRoute)``): it refuses NUL in path and
query parameters and parses a declared body with that parser before FastAPI reads it; routes whose
body is optional call ``optional_body``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
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


class BoundaryRoute(APIRoute):
    """A route whose input passes the boundary rules before FastAPI sees it.

    - A path or query parameter holding NUL is a 400 naming it: such a value cannot name anything, and
      PostgreSQL refuses it in a query (a 500 otherwise).
    - A declared JSON body goes through ``parse_json``. FastAPI parses bodies with Starlette's
      ``Request.json()`` (plain ``json.loads``), which caches its result on the request; the value
      parsed here is put in that cache, so the body is parsed once."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        has_body = self.body_field is not None

        async def checked(request: Request) -> Response:
            check_parameters(request)
            if has_body:
                raw = await request.body()
                if raw.strip():
                    request._json = parse_json(raw)  # Starlette's cache of request.json()
            return await handler(request)

        return checked


def check_parameters(request: Request) -> None:
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        if "\x00" in name or "\x00" in str(value):
            raise errors.ValidationFailed.field(name.replace("\x00", ""), "must not contain NUL (%00)")


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
