"""Serving a Paddock service's ASGI app with uvicorn: the one entry the control plane, the host agent
and the gateway share."""

from __future__ import annotations

import gc
import resource
import socket

import uvicorn
from starlette.types import ASGIApp


class FrozenHeapServer(uvicorn.Server):
    """uvicorn's server, which once the app has started takes its heap out of the full collections."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # Everything alive once the app has started (modules, SQLAlchemy's and pydantic's tables, the
        # routes: ~200,000 objects) lives as long as the process. Left to the collector, each full
        # collection walks all of it again: 50–125 ms on the dev box, during which the event loop
        # answers nothing, so it shows as the p99 of every request. Frozen, a collection walks only
        # what came after.
        gc.collect()
        gc.freeze()


def raise_open_file_limit() -> int:
    """Raises the soft limit on open files to the hard one and returns it. Every kept connection is a
    descriptor (a host agent keeps one to each sandbox's guest, and the clients' connections to each
    service stay open), and systemd's default soft limit of 1,024 would cap a host at a few hundred
    sandboxes long before its memory does; the hard limit is the operator's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


#: How long a service told to stop waits for the requests still open (streams, long polls, the kept
#: channel) before it cancels them and shuts down. uvicorn waits for ever by default, so one open
#: stream (an exec's output followed, a download) kept a host agent from stopping, or from taking its
#: warm pool down, until it was killed.
GRACEFUL_SHUTDOWN_S = 10


def config(app: ASGIApp, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for a service: its own logging and access log off (the services log each
    request themselves), and a bounded graceful shutdown."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def serve(app: ASGIApp, host: str, port: int) -> None:
    """Run ``app`` until the process is told to stop."""
    raise_open_file_limit()
    FrozenHeapServer(config(app, host, port)).run()
