"""Bodies that may be absent: pause/resume-style routes accept no body and no Content-Type (§2.2)."""

from __future__ import annotations

import json
from typing import TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from paddock_core import errors

M = TypeVar("M", bound=BaseModel)


async def optional_body(request: Request, model: type[M]) -> M:
    """Parse a JSON object body into ``model``; an empty body means ``{}``. Content-Type is not required."""
    raw = await request.body()
    if not raw.strip():
        data: object = {}
    else:
        try:
            data = json.loads(raw)
        except ValueError:
            raise errors.ValidationFailed.field("body", "body is not valid JSON") from None
    if not isinstance(data, dict):
        raise errors.ValidationFailed.field("body", "body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
