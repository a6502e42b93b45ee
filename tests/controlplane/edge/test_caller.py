"""``caller.while_connected``: a route's answer while its client waits, a bare 499 once it has gone.
The live tests (``test_a_file_operation_dies_with_its_caller`` and its E2B and computer-use twins) show
the command in the sandbox dying; these pin the seam's own contract."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from paddock_controlplane.edge.api import caller


def _request(leaves: asyncio.Event | None) -> Request:
    """A GET whose client leaves when ``leaves`` is set (never, for None)."""
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": b"", "more_body": False}
        if leaves is None:
            await asyncio.sleep(3600)
        else:
            await leaves.wait()
        return {"type": "http.disconnect"}

    return Request(
        {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}, receive
    )


def _json(result: object) -> Response:
    return JSONResponse({"result": result})


async def test_a_result_of_none_is_still_answered() -> None:
    async def nothing() -> None:
        await asyncio.sleep(0)

    answer = await caller.while_connected(_request(None), nothing(), _json)
    assert answer.status_code == 200 and answer.body == b'{"result":null}'


async def test_a_client_that_leaves_gets_499() -> None:
    """The work is cancelled then (``tests/core/test_fastlane.py`` holds ``unless_disconnected`` to it)."""
    leaves = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, leaves.set)
    answer = await caller.while_connected(_request(leaves), asyncio.sleep(3600, "never"), _json)
    assert answer.status_code == caller.CALLER_GONE == 499 and answer.body == b""
