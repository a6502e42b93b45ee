"""A minimal QMP (QEMU Machine Protocol) client: one connection per call, over QEMU's unix socket.

    status = await qmp.execute(socket_path, "query-status")      # {"status": "running", ...}
    await qmp.execute(socket_path, "stop")

QEMU serves one QMP client at a time; a connection per call keeps no state in the host agent, so a
restarted agent needs nothing to find a VM again. A call costs about a millisecond. Events arriving
before the answer are skipped.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from paddock_hostagent.drivers.base import DriverError, NotRunningError


class QmpError(DriverError):
    """QEMU answered a command with an error."""


async def execute(
    socket_path: Path, command: str, arguments: dict[str, Any] | None = None, *, timeout_s: float = 10.0
) -> Any:
    """Runs one QMP command and returns its ``return`` value."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=1 << 20)
            try:
                await _read_message(reader)  # the greeting
                await _call(reader, writer, "qmp_capabilities", None)
                return await _call(reader, writer, command, arguments)
            finally:
                writer.close()
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise NotRunningError(f"QEMU at {socket_path} is not running") from exc
    except TimeoutError as exc:
        raise DriverError(f"QMP {command} at {socket_path} timed out after {timeout_s:.0f}s") from exc


async def _call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, command: str, arguments: dict[str, Any] | None
) -> Any:
    message: dict[str, Any] = {"execute": command}
    if arguments:
        message["arguments"] = arguments
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()
    while True:
        reply = await _read_message(reader)
        if "return" in reply:
            return reply["return"]
        if "error" in reply:
            error = reply["error"]
            raise QmpError(f"QMP {command}: {error.get('class')}: {error.get('desc')}")


async def _read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    line = await reader.readline()
    if not line:
        raise NotRunningError("QEMU closed its QMP socket")
    message: dict[str, Any] = json.loads(line)
    return message
