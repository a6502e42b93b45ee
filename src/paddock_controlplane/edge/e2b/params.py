"""Query parameters several E2B routes read alike: bounded integers, one of a set of words, and the
log levels and time bounds E2B's log routes take. Each bad one is a 400 naming it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from paddock_core import errors

#: The last instant a datetime holds, 9999-12-31T23:59:59Z, in unix seconds and in milliseconds (what
#: E2B's ``start``/``end`` and its log cursors may name at most).
LAST_UNIX_S = 253402300799
LAST_UNIX_MS = LAST_UNIX_S * 1000 + 999
#: E2B's log levels, lowest first: a ``level`` asks for it and those above.
LOG_LEVELS = ("debug", "info", "warn", "error")
_INTEGER = re.compile(r"-?[0-9]{1,19}")


def int_param(query: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    """``name`` as an integer of at least ``low`` (a 400 naming it otherwise), ``high`` at most (a larger
    one is cut to it, as E2B's list pages are); None when it is absent."""
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    if not _INTEGER.fullmatch(raw):
        raise errors.ValidationFailed.field(name, "must be an integer")
    value = int(raw)
    if value < low:
        raise errors.ValidationFailed.field(name, f"must be at least {low}")
    return min(value, high)


def choice_param(query: Mapping[str, str], name: str, choices: Sequence[str]) -> str | None:
    """``name`` when it is one of ``choices`` (a 400 naming it otherwise); None when it is absent."""
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    if raw not in choices:
        raise errors.ValidationFailed.field(name, f"must be one of {', '.join(choices)}")
    return raw
