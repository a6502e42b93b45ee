"""x402's ``bazaar`` extension: what the paid resource takes and answers, for discovery (a facilitator that
catalogues x402 resources reads it from the payment payload, which copies the 402's extensions).

The gateway has one paid resource, ``POST /agent/deploy``. Its declaration has the shape of x402's
``declare_discovery_extension`` for a JSON body, with the method already filled in (as x402's server
enriches it per request): ``info`` holds an example (``input``: ``{type: "http", method: "POST",
bodyType: "json", body}``; ``output``: ``{type: "json", example}``) and ``schema`` a JSON Schema that
``info`` satisfies, whose ``body`` is the deploy request's own schema and whose ``output.example`` is the
200's. The request schema's ``$defs`` sit at the schema's root, where its ``#/$defs/…`` references point;
no reference leaves the document.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from paddock_gateway.schemas import DeployAccepted, DeployRequest

BAZAAR = "bazaar"

#: A deploy an agent could send as is: one static file, one month.
EXAMPLE_BODY: dict[str, Any] = {
    "uniqueName": "my-site-1234",
    "displayName": "My site",
    "months": 1,
    "settings": {"port": 8080},
    "upload": {"type": "files", "files": [{"path": "index.html", "content": "PGgxPkhlbGxvPC9oMT4="}]},
}
EXAMPLE_OUTPUT: dict[str, Any] = {
    "projectId": "0d9f3a52-7c1e-4b8a-9a51-2f7d8c4e6b10",
    "deploymentId": "6c2b8e14-3f5a-4d97-8e02-b1a4c7d9e3f5",
    "status": "deploying",
    "message": "Payment verified and credits added. Deployment started. Poll status for updates.",
}


def _untitled(schema: Any) -> Any:
    """The schema without pydantic's ``title`` annotations: the 402's header, and every payment payload
    that copies it, stay small (a property *named* ``title`` would stay; none is)."""
    if isinstance(schema, dict):
        return {key: _untitled(value) for key, value in schema.items() if key != "title"}
    if isinstance(schema, list):
        return [_untitled(item) for item in schema]
    return schema


@cache
def _deploy_discovery() -> dict[str, Any]:
    body_schema = _untitled(DeployRequest.model_json_schema(ref_template="#/$defs/{model}"))
    definitions = body_schema.pop("$defs", {})
    output_schema = _untitled(DeployAccepted.model_json_schema(ref_template="#/$defs/{model}"))
    definitions.update(output_schema.pop("$defs", {}))
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "input": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "const": "http"},
                    "method": {"type": "string", "enum": ["POST"]},
                    "bodyType": {"type": "string", "enum": ["json"]},
                    "body": body_schema,
                },
                "required": ["type", "method", "bodyType", "body"],
                "additionalProperties": False,
            },
            "output": {
                "type": "object",
                "properties": {"type": {"type": "string"}, "example": output_schema},
                "required": ["type"],
            },
        },
        "required": ["input"],
        "$defs": definitions,
    }
    info = {
        "input": {"type": "http", "method": "POST", "bodyType": "json", "body": EXAMPLE_BODY},
        "output": {"type": "json", "example": EXAMPLE_OUTPUT},
    }
    return {"info": info, "schema": schema}


def deploy_discovery() -> dict[str, Any]:
    """``extensions["bazaar"]`` for ``POST /agent/deploy`` (a copy: callers may not change the cache)."""
    return copy.deepcopy(_deploy_discovery())
