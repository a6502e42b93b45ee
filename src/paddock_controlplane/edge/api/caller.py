"""Routes that read through a command in the tenant's sandbox end with their caller.

A listing runs ``find`` in the sandbox, and a screenshot ``curl`` or ``python3``: the tenant's own tools,
on the sandbox's ``PATH``, which a tenant can replace, stop or starve. Such a command could last for
ever, and while it runs it counts as the sandbox's activity (never idle-paused). So a caller that goes
away (its timeout, a crash) takes a read with it, as a buffered exec's does: the route's work is
cancelled, the host agent's request with it, and the guest kills the command's process group
(docs/security.md, rule 5).

Only reads end this way. An operation that changes something (a remove, a rename, a click, a create)
runs to its end when its caller has gone, as envd's own do: cut short, ``rm -rf`` or a ``mv`` across
filesystems would leave the tree half changed, and a create or a pause its records half written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request, Response

from paddock_core import fastlane

T = TypeVar("T")

#: Nobody reads the answer once the caller has gone; 499 is what proxies log for a client that closed its
#: request, and what the access log and metrics then show.
CALLER_GONE = 499


async def while_connected(request: Request, work: Awaitable[T], answer: Callable[[T], Response]) -> Response:
    """``answer(result of work)``, or a bare 499 when the client left first (``work`` cancelled). Call it
    once the request's body has been read."""

    async def boxed() -> tuple[T]:  # a result of None is still a result
        return (await work,)

    result = await fastlane.unless_disconnected(request.receive, boxed())
    if result is None:
        return Response(status_code=CALLER_GONE)
    return answer(result[0])
