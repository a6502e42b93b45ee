"""The control plane's connections to a host agent are not reused past the agent's keep-alive.

The agent (uvicorn, ``paddock_core.serving.config``) closes a connection idle for ``KEEP_ALIVE_S``. The
client kept idle connections for 30 s, so a call made after 5–30 s of quiet could go out on one the
agent had closed, when the client's loop had not yet read the close (a busy loop reads it late): the
call failed ("Can not write request body", a resize answered 500 in a full run). Here the client's loop
is held past the agent's keep-alive, as a busy one is, and the next call must still be answered.
The agent side is the real server configuration, in a thread of its own."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from paddock_core import serving
from paddock_hostagent.client import IDLE_REUSE_S, HostAgentClient
from tests.conftest import service_in_thread


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"got": len(await request.body())})


@pytest.fixture
def agent_like_server() -> Iterator[str]:
    with service_in_thread(Starlette(routes=[Route("/echo", echo, methods=["POST"])])) as service:
        yield service.url


async def test_a_call_after_the_agents_keep_alive_gets_a_fresh_connection(agent_like_server: str) -> None:
    assert IDLE_REUSE_S < serving.KEEP_ALIVE_S
    client = HostAgentClient(agent_like_server, "token", channel=False)
    try:
        session = client._aiohttp()
        async with session.post(f"{agent_like_server}/echo", json={"a": 1}) as first:
            assert first.status == 200
        time.sleep(serving.KEEP_ALIVE_S + 1)  # this loop held: the agent closes the idle connection meanwhile
        async with session.post(f"{agent_like_server}/echo", json={"a": 2}) as second:
            assert second.status == 200 and await second.json() == {"got": 7}
    finally:
        await client.aclose()
