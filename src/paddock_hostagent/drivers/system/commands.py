"""Running host tools: one place that turns a failed subprocess into ``CommandFailedError``."""

from __future__ import annotations

import asyncio
import subprocess

from paddock_hostagent.drivers.base import CommandFailedError


async def run(
    argv: list[str], *, check: bool = True, timeout_s: float = 120.0, input_text: str | None = None
) -> str:
    """Runs ``argv`` without a shell and returns its stdout; raises CommandFailedError on failure."""
    stdin = subprocess.DEVNULL if input_text is None else subprocess.PIPE
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        raise CommandFailedError(argv, 127, str(exc)) from exc
    try:
        stdout, stderr = await asyncio.wait_for(
            process.communicate(None if input_text is None else input_text.encode()), timeout_s
        )
    except TimeoutError as exc:
        process.kill()
        await process.wait()
        raise CommandFailedError(argv, -9, f"timed out after {timeout_s:.0f}s") from exc
    if check and process.returncode != 0:
        raise CommandFailedError(argv, process.returncode or 0, stderr.decode(errors="replace"))
    return stdout.decode(errors="replace")


def run_sync(argv: list[str], *, check: bool = True, input_text: str | None = None) -> str:
    """The blocking twin of ``run``, for start-up and CLI paths."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False, input=input_text)
    except OSError as exc:
        raise CommandFailedError(argv, 127, str(exc)) from exc
    if check and result.returncode != 0:
        raise CommandFailedError(argv, result.returncode, result.stderr)
    return result.stdout
