"""The JSend envelope of the control-plane contract (§4).

success: ``{"status": "success", "data": …}``
fail:    ``{"status": "fail", "data": {"code": …, "message": …, <field>: <reason>…}}`` (4xx)
error:   ``{"status": "error", "message": …, "code": <http status>}`` (5xx)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def success(data: Any) -> dict[str, Any]:
    return {"status": "success", "data": data}


def fail(code: str, message: str, fields: Mapping[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    for key, reason in (fields or {}).items():
        if key not in ("code", "message"):
            body[key] = str(reason)
    return {"status": "fail", "data": body}


def error(message: str, status: int) -> dict[str, Any]:
    return {"status": "error", "message": message, "code": int(status)}


def page(items: list[Any], *, total: int, limit: int, offset: int) -> dict[str, Any]:
    """The paginated list inside ``data`` (§8.1)."""
    return {
        "data": items,
        "pagination": {"total": total, "limit": limit, "offset": offset, "count": len(items)},
    }
