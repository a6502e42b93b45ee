"""The guest protocol's version is compared at the guest's hello: a guest agent built from another
version of the protocol is refused at once, saying so, instead of having its frames misread."""

from __future__ import annotations

import asyncio
import re
import struct
import subprocess
from pathlib import Path

import pytest

from paddock_hostagent.guest import GuestClient, GuestVersionError
from paddock_hostagent.guest.build import BINARY_NAME
from paddock_hostagent.guest.protocol import HEADER, PROTOCOL_VERSION, Frame, frame

GUEST_SOURCE = Path(__file__).resolve().parents[2] / "src" / "paddock_hostagent" / "guest"


async def fake_guest(socket_path: Path, version: int) -> asyncio.Server:
    """Answers every INFO like the C guest does (``u64 last_activity_ms, u32 active, u32 version``),
    with ``version`` as its protocol version."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frame_type, length = HEADER.unpack(await reader.readexactly(HEADER.size))
        await reader.readexactly(length)
        assert frame_type == Frame.INFO
        writer.write(frame(Frame.INFO_REPLY, struct.pack("<QII", 0, 0, version)))
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(serve, path=str(socket_path))


async def test_a_guest_of_another_protocol_version_is_refused_at_its_hello(tmp_path: Path) -> None:
    guest_socket = tmp_path / "guest.sock"
    server = await fake_guest(guest_socket, PROTOCOL_VERSION + 1)
    async with server:
        started = asyncio.get_running_loop().time()
        with pytest.raises(GuestVersionError) as refused:
            await GuestClient(guest_socket).wait_ready(timeout_s=10)
        assert asyncio.get_running_loop().time() - started < 5  # refused at once, not after the deadline
    message = str(refused.value)
    assert (
        f"protocol version {PROTOCOL_VERSION + 1}" in message and f"host agent {PROTOCOL_VERSION}" in message
    )


async def test_a_guest_of_this_protocol_version_is_ready(tmp_path: Path) -> None:
    guest_socket = tmp_path / "guest.sock"
    server = await fake_guest(guest_socket, PROTOCOL_VERSION)
    async with server:
        assert (await GuestClient(guest_socket).wait_ready(timeout_s=10)).version == PROTOCOL_VERSION


def test_the_c_guest_and_the_python_client_declare_the_same_version(guest_binary_dir: Path) -> None:
    header = (GUEST_SOURCE / "guest.h").read_text()
    declared = re.search(r"#define PROTOCOL_VERSION (\d+)u", header)
    assert declared is not None and int(declared.group(1)) == PROTOCOL_VERSION
    built = subprocess.run([str(guest_binary_dir / BINARY_NAME), "--version"], capture_output=True, text=True)
    assert built.stdout.strip() == f"paddock-guest {PROTOCOL_VERSION}"
