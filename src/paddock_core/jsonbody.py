"""The one JSON parser for request bodies of both services: what is refused at the boundary, and why.

``json.loads`` alone lets through input that later turns into a 500 or into stored garbage:

- nesting deep enough to exhaust the interpreter's stack (``RecursionError`` in the parser or in any
  later walk over the value): refused beyond ``MAX_DEPTH`` levels — no body of either contract nests
  more than four;
- ``NaN``, ``Infinity`` and numbers that overflow to infinity (``1e999``): not JSON (RFC 8259 §6), and
  the databases either refuse or silently store them;
- NUL (``\\u0000``) in any string, key or value: PostgreSQL text cannot hold it, the kernel's argv and
  environment end at it, and no field of either contract means it — except data that is neither stored
  nor handed to the kernel as a C string, which a route names in ``nul_allowed`` (exec's ``stdin``).

Each refusal names the offending field by its wire path (``args[1]``, ``envs.FOO``), so a client
sees which value to fix. Both checks that walk the value only run when the raw bytes could hold what
they look for, so the common body costs one ``json.loads`` plus two ``bytes.count`` scans.

    data = parse(raw)            # raises JsonBodyError(field, reason); JsonSyntaxError if not JSON
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32


class JsonBodyError(ValueError):
    """A body the services refuse; ``field`` is the wire path (``body`` for the whole document)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class JsonSyntaxError(JsonBodyError):
    """The body is not JSON at all (or not UTF-8)."""


class _NonFinite:
    """Stands in for a NaN/Infinity while parsing, so the walk below can say where it was."""

    __slots__ = ()


_NON_FINITE = _NonFinite()


def _child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]" if path else f"[{key}]"
    return f"{path}.{key}" if path else key


def _walk(data: Any, *, deep: bool, nul: bool, non_finite: bool, nul_allowed: frozenset[str]) -> None:
    """Iterative (an explicit stack), so a value at the depth limit cannot exhaust the real one."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list):
            if deep and depth >= MAX_DEPTH:
                raise JsonBodyError("body", f"nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if nul and isinstance(key, str) and "\x00" in key:
                    raise JsonBodyError(path or "body", "keys must not contain NUL (\\u0000)")
                stack.append((child, _child_path(path, key), depth + 1))
        elif nul and isinstance(value, str) and "\x00" in value and path not in nul_allowed:
            raise JsonBodyError(path or "body", "must not contain NUL (\\u0000)")
        elif non_finite and value is _NON_FINITE:
            raise JsonBodyError(path or "body", "NaN and Infinity are not JSON numbers")


def parse(raw: bytes | str, *, nul_allowed: frozenset[str] = frozenset()) -> Any:
    """The parsed body, or ``JsonBodyError``. An empty body is the caller's business (not handled here).
    ``nul_allowed``: wire paths of string fields that may hold NUL."""
    saw_non_finite = False

    def constant(_: str) -> _NonFinite:
        nonlocal saw_non_finite
        saw_non_finite = True
        return _NON_FINITE

    def parse_float(text: str) -> float | _NonFinite:
        nonlocal saw_non_finite
        value = float(text)
        if math.isfinite(value):
            return value
        saw_non_finite = True
        return _NON_FINITE

    try:
        data = json.loads(raw, parse_constant=constant, parse_float=parse_float)
    except RecursionError:
        raise JsonBodyError("body", f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise JsonSyntaxError("body", "body is not valid UTF-8") from None
    except ValueError:
        raise JsonSyntaxError("body", "body is not valid JSON") from None
    text = raw.encode() if isinstance(raw, str) else raw
    # Upper bounds, cheap in C: a document with at most MAX_DEPTH brackets cannot nest deeper, and a
    # NUL can only be written "\u0000" (a raw control byte inside a string is invalid JSON).
    deep = text.count(b"[") + text.count(b"{") > MAX_DEPTH
    nul = b"\\u0000" in text
    if deep or nul or saw_non_finite:
        _walk(data, deep=deep, nul=nul, non_finite=saw_non_finite, nul_allowed=nul_allowed)
    return data
