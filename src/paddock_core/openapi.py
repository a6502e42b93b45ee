"""The OpenAPI document a service really honours, made from FastAPI's generated one in one place.

FastAPI documents what it can see: a ``200`` with an untyped object and a ``422`` it never sends (both
services answer validation with ``400``). Routes that read a body or a query parameter by hand (bodies
that may be absent, §2.2; raw file uploads; long-poll parameters) are invisible to it. ``install``
rewrites the generated document once per process with what a client meets on the wire:

- every operation's real status codes, each error in its service's envelope (the control plane's JSend
  ``fail`` for 4xx and ``error`` for 5xx, spec §4; the gateway's ``{error, code}``, its §2.2);
- the bodies, media types and query parameters of the hand-parsed routes, with the constraints the
  server enforces (taken from the same pydantic models that validate them);
- the API-key security scheme on the operations that need a key.

It also makes the ``405`` a wrong method gets carry ``Allow`` (RFC 9110 §15.5.6): the services render
Starlette's ``HTTPException`` into their envelope, and that rendering dropped the header the router put
on it. Each service describes itself with a ``Contract``; the app's ``create_app`` calls ``install``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

JsonSchema = dict[str, Any]
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

REASONS = {
    400: "The request is malformed or a field is invalid; the body names each invalid field.",
    401: "Missing or invalid credentials.",
    402: "Payment required: no credit left, or the quote to pay.",
    403: "A plan or quota limit, a resource of another owner, or an operation the credential may not call.",
    404: "Not found (or not yours).",
    405: "Method not allowed on this path; `Allow` lists the methods that are.",
    408: "The body came too slowly (its rate after a grace period); the connection is closed.",
    409: "Not allowed in the resource's current state, or a name or payment already taken.",
    413: "The body is over the size limit.",
    429: "Rate limited; `Retry-After` says when to come back.",
    500: "Internal error (a bug); the body carries the request id.",
    501: "Not implemented by this server.",
    502: "An upstream service could not be reached.",
    503: "No capacity or a dependency is unavailable, or the sandbox is too busy to take more requests"
    " now; `Retry-After` says when to retry.",
    507: "The sandbox's disk is full: nothing was written.",
}

#: JSend, control-plane contract §4.
JSEND_FAIL: JsonSchema = {
    "type": "object",
    "required": ["status", "data"],
    "properties": {
        "status": {"const": "fail"},
        "data": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            "additionalProperties": {"type": "string", "description": "reason, keyed by wire path"},
        },
    },
}
JSEND_ERROR: JsonSchema = {
    "type": "object",
    "required": ["status", "message", "code"],
    "properties": {
        "status": {"const": "error"},
        "message": {"type": "string"},
        "code": {"type": "integer", "description": "the HTTP status"},
    },
}
JSEND_SUCCESS: JsonSchema = {
    "type": "object",
    "required": ["status", "data"],
    "properties": {"status": {"const": "success"}, "data": {}},
}
#: The gateway's error body, gateway contract §2.2 (402/409/500 add documented fields).
GATEWAY_ERROR: JsonSchema = {
    "type": "object",
    "required": ["error", "code"],
    "properties": {
        "error": {"type": "string"},
        "code": {"type": "string"},
        "details": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}


@dataclass(frozen=True)
class Operation:
    """What FastAPI cannot see about one operation."""

    statuses: tuple[int, ...] = ()  # error statuses it can answer besides the contract's common ones
    body: type[BaseModel] | None = None  # a JSON body read by hand (may be absent unless body_required)
    body_required: bool = False
    raw_body: str | None = None  # media type of a raw body streamed by hand (file upload)
    query: tuple[JsonSchema, ...] = ()  # OpenAPI parameter objects read by hand
    media: tuple[str, ...] = ()  # success media types besides JSON (or instead of it: unwrapped)
    unwrapped: bool = False  # the 200 is not in the success envelope (file download, NDJSON only)
    bodies: Mapping[int, JsonSchema] = field(default_factory=dict)  # a status whose body is not the usual


@dataclass(frozen=True)
class Contract:
    """One service's envelopes, security and the operations' extras, keyed ``(METHOD, path)``."""

    fail_schema: JsonSchema
    error_schema: JsonSchema
    success_schema: JsonSchema | None  # None: the 200 bodies are the routes' own (gateway)
    common_statuses: tuple[int, ...] = (500,)
    operations: Mapping[tuple[str, str], Operation] = field(default_factory=dict)
    security_scheme: tuple[str, JsonSchema] | None = None  # (name, scheme object)
    public: frozenset[str] = frozenset()  # paths that need no credentials
    #: What any operation that needs credentials may answer besides its own statuses.
    authenticated_statuses: tuple[int, ...] = (401,)
    #: What any operation that takes a request body may answer (a body over its cap, or one that stopped
    #: coming: ``paddock_core.bodylimit``), besides the 400 every body or query parameter may meet.
    body_statuses: tuple[int, ...] = ()
    #: What any operation with a path parameter may answer besides the 404 (a value the boundary refuses).
    path_statuses: tuple[int, ...] = ()
    retry_after: frozenset[int] = frozenset({429, 503})


def document(schema: JsonSchema, contract: Contract) -> JsonSchema:
    """A copy of FastAPI's ``schema`` rewritten to what the service answers (see the module doc)."""
    out = copy.deepcopy(schema)
    components = out.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Fail"], schemas["Error"] = contract.fail_schema, contract.error_schema
    if contract.success_schema is not None:
        schemas["Success"] = contract.success_schema
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    if contract.security_scheme is not None:
        scheme_name, scheme = contract.security_scheme
        components.setdefault("securitySchemes", {})[scheme_name] = scheme
    for path, item in out.get("paths", {}).items():
        for method in METHODS:
            operation = item.get(method)
            if operation is not None:
                extras = contract.operations.get((method.upper(), path), Operation())
                _rewrite(operation, path, extras, contract, schemas)
    return out


def _rewrite(
    operation: JsonSchema, path: str, extras: Operation, contract: Contract, schemas: JsonSchema
) -> None:
    responses: JsonSchema = operation.setdefault("responses", {})
    responses.pop("422", None)
    ok = responses.setdefault("200", {"description": "Successful Response"})
    json_schema: JsonSchema | None = None
    if contract.success_schema is not None and not extras.unwrapped:
        json_schema = {"$ref": "#/components/schemas/Success"}
    elif "application/json" in ok.get("content", {}):
        json_schema = ok["content"]["application/json"].get("schema", {})
    content: JsonSchema = {} if json_schema is None else {"application/json": {"schema": json_schema}}
    for media in extras.media:
        content[media] = {"schema": {"type": "string", "format": "binary"}}
    ok["content"] = content
    for parameter in extras.query:
        operation.setdefault("parameters", []).append(parameter)
    if extras.body is not None:
        operation["requestBody"] = {
            "required": extras.body_required,
            "content": {"application/json": {"schema": _model_ref(extras.body, schemas)}},
        }
    elif extras.raw_body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {extras.raw_body: {"schema": {"type": "string", "format": "binary"}}},
        }
    elif "requestBody" in operation:
        operation["requestBody"]["required"] = True
    statuses = set(contract.common_statuses) | set(extras.statuses)
    if "requestBody" in operation or any(p.get("in") == "query" for p in operation.get("parameters", [])):
        statuses.add(400)
    if "requestBody" in operation:
        statuses.update(contract.body_statuses)
    if "{" in path:
        statuses.add(404)
        statuses.update(contract.path_statuses)
    public = path in contract.public or contract.security_scheme is None
    if not public:
        statuses.update(contract.authenticated_statuses)
        operation["security"] = [{contract.security_scheme[0]: []}] if contract.security_scheme else []
    for status in sorted(statuses | set(extras.bodies)):
        responses.setdefault(str(status), _error_response(status, contract))
    for status, body_schema in extras.bodies.items():
        responses[str(status)]["content"] = {"application/json": {"schema": body_schema}}


def _error_response(status: int, contract: Contract) -> JsonSchema:
    ref = "#/components/schemas/" + ("Error" if status >= 500 else "Fail")
    response: JsonSchema = {
        "description": REASONS.get(status, "Error"),
        "content": {"application/json": {"schema": {"$ref": ref}}},
    }
    if status in contract.retry_after:
        response["headers"] = {"Retry-After": {"schema": {"type": "string"}, "required": status == 429}}
    return response


def _model_ref(model: type[BaseModel], schemas: JsonSchema) -> JsonSchema:
    model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(model_schema.pop("$defs", {}))
    schemas[model.__name__] = model_schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


def install(app: FastAPI, contract: Contract) -> None:
    """Serve the rewritten document from ``app.openapi()`` and keep ``Allow`` on 405 answers.

    Call after the routes, the error handlers and any ``app.openapi`` override are in place."""
    generate = app.openapi

    def openapi() -> JsonSchema:
        if app.openapi_schema is None:
            base = generate() if generate is not None else _generated(app)
            app.openapi_schema = document(base, contract)
        return app.openapi_schema

    # Made on the first read (the document's route, a client generator), then kept: making it takes
    # ~0.3 s of CPU, which every app a process creates would otherwise pay at once (the test suite
    # creates hundreds).
    app.openapi = openapi  # type: ignore[method-assign]
    render = app.exception_handlers.get(StarletteHTTPException)

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        # The service's own rendering of the 405 body, plus the router's ``Allow`` it leaves out.
        rendered = render(request, exc) if render is not None else Response(status_code=405)
        # Starlette types handlers as sync or async; the services' own are async.
        response = await rendered if inspect.isawaitable(rendered) else rendered
        for name, value in (getattr(exc, "headers", None) or {}).items():
            response.headers[name] = value
        return response

    app.add_exception_handler(405, method_not_allowed)


def _generated(app: FastAPI) -> JsonSchema:
    return get_openapi(title=app.title, version=app.version, routes=app.routes)
