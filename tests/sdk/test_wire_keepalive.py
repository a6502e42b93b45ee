"""The SDK's direct path (``paddock._wire``) does not reuse a connection past the control plane's
keep-alive: the server (uvicorn with ``paddock_core.serving.config``, as ``paddock controlplane`` runs
it, in a thread of its own) closes a connection idle ``KEEP_ALIVE_S``, and an event loop busy elsewhere
reads that close late. Held past the keep-alive, the next call must still be answered: before, the
async client sent it on the closed connection and the call failed, a POST without a retry."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import paddock
from paddock import RetryPolicy, _wire
from paddock_core import serving
from tests.conftest import service_in_thread


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"status": "success", "data": {"got": await request.json()}})


@pytest.fixture
def controlplane_like() -> Iterator[str]:
    with service_in_thread(Starlette(routes=[Route("/v1/echo", echo, methods=["POST"])])) as service:
        yield service.url


async def test_a_call_after_the_servers_keep_alive_goes_out_on_a_fresh_connection(
    controlplane_like: str,
) -> None:
    assert _wire.IDLE_REUSE_S < serving.KEEP_ALIVE_S
    async with paddock.AsyncClient(controlplane_like, "k", retry=RetryPolicy(max_retries=0)) as client:
        assert await client.request("POST", "v1/echo", json={"n": 1}) == {"got": {"n": 1}}
        time.sleep(serving.KEEP_ALIVE_S + 1)  # the loop held: the server closes the idle connection meanwhile
        assert await client.request("POST", "v1/echo", json={"n": 2}) == {"got": {"n": 2}}


def test_the_blocking_client_too(controlplane_like: str) -> None:
    with paddock.Client(controlplane_like, "k", retry=RetryPolicy(max_retries=0)) as client:
        assert client.request("POST", "v1/echo", json={"n": 1}) == {"got": {"n": 1}}
        time.sleep(serving.KEEP_ALIVE_S + 1)
        assert client.request("POST", "v1/echo", json={"n": 2}) == {"got": {"n": 2}}
