"""What the ingress proxy re-frames, against scripted apps on 127.0.0.1 (the seam of
test_ingress_protocol.py): bodies re-emitted from what llhttp decoded, responses that leave bytes
behind, upgrades with data in the same packet, a refused upgrade. The smuggling probes against a real
app in a real sandbox are tests/security/test_ingress_smuggling.py.
"""

from __future__ import annotations

import asyncio

from tests.controlplane.edge.test_ingress_protocol import (
    DOMAIN,
    SANDBOX,
    handler_from,
    proxy_port,
    read_head,
    start_app,
    talk,
)

__all__ = ["proxy_port"]  # the fixture


async def test_a_chunked_upload_reaches_the_app_re_framed(proxy_port: int) -> None:
    """Chunk extensions and request trailers are not passed on; the data is, chunked."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_head(reader)
        received.append(head.encode())
        received.append(await reader.readuntil(b"0\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()

    server, app_port = await start_app(handle)
    async with server:
        reader, writer = await talk(
            proxy_port,
            app_port,
            b"POST / HTTP/1.1\r\nHost: HOST\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3;name=value\r\nabc\r\n0\r\nX-Trailer: sneaky\r\n\r\n",
        )
        assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 204")
        writer.close()
    head, body = received
    assert b"\r\nTransfer-Encoding: chunked\r\n" in head
    assert body == b"3\r\nabc\r\n0\r\n\r\n"


async def test_an_app_that_sends_more_than_its_response_gets_a_fresh_connection(proxy_port: int) -> None:
    """Bytes after a complete response are never read as the answer to the next request."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        number = len(connections)
        await read_head(reader)
        writer.write(
            f"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{number}!".encode()
            + b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
        )
        await writer.drain()
        await reader.read()  # keeps the connection open until the proxy lets go
        writer.close()

    server, app_port = await start_app(handle)
    async with server:
        request = f"GET / HTTP/1.1\r\nHost: {app_port}-{SANDBOX}.{DOMAIN}\r\n\r\n".encode()
        reader, writer = await talk(proxy_port, app_port, request)
        answers = []
        for _ in range(2):
            assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 200")
            answers.append(await reader.readexactly(2))
            writer.write(request)
        writer.close()
    assert answers == [b"1!", b"2!"]
    assert len(connections) >= 2


async def test_a_101_to_a_plain_request_is_a_502(proxy_port: int) -> None:
    server, app_port = await start_app(
        handler_from([b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"])
    )
    async with server:
        reader, writer = await talk(proxy_port, app_port, b"GET / HTTP/1.1\r\nHost: HOST\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert data.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert b"X-Paddock-Ingress-Error: BAD_UPSTREAM_RESPONSE" in data


async def test_an_upgrade_passes_the_bytes_that_came_with_each_head(proxy_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\nfirst")
        early = await reader.readexactly(5)
        writer.write(b"<" + early + b">")
        await writer.drain()
        writer.close()

    server, app_port = await start_app(handle)
    async with server:
        reader, writer = await talk(
            proxy_port,
            app_port,
            b"GET / HTTP/1.1\r\nHost: HOST\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\nearly",
        )
        assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 101")
        assert await asyncio.wait_for(reader.read(), 5) == b"first<early>"
        writer.close()


async def test_a_refused_upgrade_leaves_the_connection_speaking_http(proxy_port: int) -> None:
    seen: list[str] = []
    answers = [
        b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 2\r\n\r\nno",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ]
    server, app_port = await start_app(handler_from(answers, seen))
    async with server:
        host = f"{app_port}-{SANDBOX}.{DOMAIN}"
        reader, writer = await talk(
            proxy_port,
            app_port,
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n"
            f"GET /next HTTP/1.1\r\nHost: {host}\r\n\r\n".encode(),
        )
        assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 426")
        assert await reader.readexactly(2) == b"no"
        assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 200")
        assert await reader.readexactly(2) == b"ok"
        writer.close()
    assert [head.split(" ")[1] for head in seen] == ["/ws", "/next"]


async def test_a_bad_chunk_from_the_app_cuts_the_client_connection(proxy_port: int) -> None:
    """The head went out already: the client sees a body that never ends properly, not forged data."""
    server, app_port = await start_app(
        handler_from(
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\nforged\r\n0\r\n\r\n"]
        )
    )
    async with server:
        reader, writer = await talk(proxy_port, app_port, b"GET / HTTP/1.1\r\nHost: HOST\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert data.endswith(b"2\r\nok\r\n")  # no last chunk: a client knows the body was cut
    assert b"forged" not in data


async def test_a_head_and_a_large_body_in_one_write_pass(proxy_port: int) -> None:
    """The head-size bound counts the head, not the body bytes that arrived in the same read."""
    body = bytes(range(256)) * 1024  # 256 KiB

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        received = await reader.readexactly(len(body))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n" + (b"ok" if received == body else b"no"))
        await writer.drain()
        writer.close()

    server, app_port = await start_app(handle)
    async with server:
        reader, writer = await talk(
            proxy_port,
            app_port,
            f"POST / HTTP/1.1\r\nHost: HOST\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body,
        )
        assert (await asyncio.wait_for(read_head(reader), 5)).startswith("HTTP/1.1 200")
        assert await reader.readexactly(2) == b"ok"
        writer.close()
