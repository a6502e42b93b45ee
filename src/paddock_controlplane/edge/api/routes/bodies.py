"""JSON request bodies: one parser for every route (``paddock_core.jsonbody``: NUL, NaN/Infinity and
deep nesting are refused with a 400 naming the field), and bodies that may be absent.

Routers use ``BoundaryRoute`` (``APIRouter(route_class=BoundaryRoute)``): it refuses NUL in path and
query parameters and parses a declared body with that parser before FastAPI reads it; routes whose
body is optional call ``optional_body``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from paddock_controlplane.edge.api.errors import error_response
from paddock_controlplane.resources import templates
from paddock_controlplane.sandboxes import commands
from paddock_core import errors, jsonbody
from paddock_core.bodylimit import BodyRoute
from paddock_hostagent.schemas import VOLUME_FILE_BYTES

M = TypeVar("M", bound=BaseModel)

#: Any other request body, refused as it is read past this (``paddock_core.bodylimit``): no other body
#: of the contract comes near it.
MAX_BODY_BYTES = 8 << 20
#: A template's build context travels as base64 in its JSON (4 bytes for 3), with its Dockerfile.
MAX_TEMPLATE_BODY_BYTES = templates.MAX_CONTEXT_BYTES * 4 // 3 + (1 << 20)
#: Bodies with their own cap: an upload streams and is counted against ``max_upload_bytes`` as it goes;
#: an exec's refusal names ``stdin``, its one field without a bound of its own.
BODY_ROUTES = (
    BodyRoute("PUT", r"/v1/sandboxes/[^/]+/files", None),
    BodyRoute("PUT", r"/v1/sandboxes/[^/]+/files/tar", None),
    BodyRoute("PUT", r"/v1/volumes/[^/]+/files", VOLUME_FILE_BYTES),
    BodyRoute("POST", r"/v1/sandboxes/[^/]+/exec", commands.MAX_EXEC_BODY_BYTES, "stdin"),
    BodyRoute("POST", r"/v1/templates", MAX_TEMPLATE_BODY_BYTES),
)


def render_refusal(exc: Exception) -> Response:
    """``body_too_large``'s error as the contract's envelope (``BodyLimit``'s ``render``)."""
    assert isinstance(exc, errors.PaddockError)
    return error_response(exc)


def body_too_large(limit_bytes: int, field: str) -> errors.PaddockError:
    """The 413 for a body refused while it was read, naming the field it is charged to."""
    if field == "stdin":
        reason = (
            f"the exec's body is over {limit_bytes} bytes (stdin may hold {commands.MAX_EXEC_STDIN_BYTES});"
            " upload bulk input as a file (PUT /files) and read it"
        )
    else:
        reason = f"is over the {limit_bytes}-byte limit"
    return errors.PayloadTooLarge(f"{field}: {reason}", fields={field: reason})


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

        model = self.body_field.field_info.annotation if self.body_field is not None else None

        async def checked(request: Request) -> Response:
            check_parameters(request)
            if has_body:
                raw = await request.body()
                if raw.strip():
                    request._json = parse_json(raw)  # Starlette's cache of request.json()
                    note_unknown_fields(request, request._json, model)
            response = await handler(request)
            unknown = request.scope.get("state", {}).get(UNKNOWN_FIELDS)
            if unknown:
                response.headers["Warning"] = warning_header(unknown)
            return response

        return checked


def check_parameters(request: Request) -> None:
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        if "\x00" in name or "\x00" in str(value):
            raise errors.ValidationFailed.field(name.replace("\x00", ""), "must not contain NUL (%00)")


#: Where a request's ignored body fields wait for its response's ``Warning`` header.
UNKNOWN_FIELDS = "unknown_body_fields"
#: Names shown in one ``Warning`` header, and characters of each (the rest is cut: rule 5).
MAX_WARNED_FIELDS = 10
MAX_WARNED_NAME = 64


def unknown_fields(data: object, model: Any) -> list[str]:
    """The top-level keys of ``data`` that ``model`` does not declare (by name or alias)."""
    if not isinstance(data, dict) or not (isinstance(model, type) and issubclass(model, BaseModel)):
        return []
    known = _declared(model)
    return [key for key in data if key not in known]


@functools.cache
def _declared(model: type[BaseModel]) -> frozenset[str]:
    """The field names and aliases of ``model``, once per model: the fast lane's exec asks on every
    request, where building them took longer than validating the body."""
    return frozenset(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}


def note_unknown_fields(request: Request, data: object, model: Any) -> None:
    """The contract ignores unknown body fields (§2.2, forward compatibility); they are named in the
    answer's ``Warning`` header so a typo (``envz``) does not vanish silently."""
    unknown = unknown_fields(data, model)
    if unknown:
        request.scope.setdefault("state", {})[UNKNOWN_FIELDS] = unknown


def warning_header(names: list[str]) -> str:
    """``299 - "unknown field 'envz' ignored"`` per name (RFC 9111 §5.5's form), header-safe."""

    def safe(name: str) -> str:
        cut = name[:MAX_WARNED_NAME] + ("..." if len(name) > MAX_WARNED_NAME else "")
        text = cut.encode("ascii", "backslashreplace").decode()
        return "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "?" for c in text)

    shown = [f"299 - \"unknown field '{safe(n)}' ignored\"" for n in names[:MAX_WARNED_FIELDS]]
    if len(names) > MAX_WARNED_FIELDS:
        shown.append(f'299 - "{len(names) - MAX_WARNED_FIELDS} more unknown fields ignored"')
    return ", ".join(shown)


async def optional_body(request: Request, model: type[M], nul_allowed: frozenset[str] = frozenset()) -> M:
    """Parse a JSON object body into ``model``; an empty body means ``{}``. Content-Type is not required.
    ``nul_allowed``: fields whose strings may hold NUL (``paddock_core.jsonbody``)."""
    raw = await request.body()
    data: object = parse_json(raw, nul_allowed) if raw.strip() else {}
    note_unknown_fields(request, data, model)
    return validate_body(data, model)


def validate_body(data: object, model: type[M]) -> M:
    if not isinstance(data, dict):
        raise errors.ValidationFailed.field("body", "body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
