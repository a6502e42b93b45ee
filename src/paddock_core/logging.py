"""structlog set-up: JSON lines to stdout unless stdout is a TTY.

Never pass secrets (API keys, env values, credentials, webhook secrets) to a logger; the
``redact`` processor is a last line of defence for keys that look secret, not a licence.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = ("api_key", "x-api-key", "secret", "password", "token", "private_key", "envs", "credentials")


@functools.lru_cache(maxsize=4096)
def _is_secret(key: str) -> bool:
    # Cached: every request's log line passes the same dozen keys, and the scan was a visible share
    # of a fast request's cost.
    lowered = key.lower()
    return any(marker in lowered for marker in _SECRET_KEYS)


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if _is_secret(key):
            event[key] = "[redacted]"
    return event


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    use_json = (not sys.stdout.isatty()) if json is None else json
    renderer: Any = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    logging.basicConfig(format="%(message)s", stream=sys.stdout, level=level.upper(), force=True)
    for noisy in ("uvicorn.access", "httpx", "httpcore", "aiosqlite", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
