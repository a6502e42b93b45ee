"""Compiles the guest agent (``agent.c``) into a static binary, once per source version.

    python -m paddock_hostagent.guest.build OUTDIR     # prints the binary's path

The host agent calls ``ensure_agent_binary(state_dir / "guest")`` at start-up: a binary whose recorded
source digest matches is reused; otherwise it is rebuilt into a temporary file and renamed into place.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE_DIR = Path(__file__).parent
BINARY_NAME = "paddock-guest"
CFLAGS = ("-O2", "-static", "-Wall", "-Wextra", "-s")


class GuestBuildError(Exception):
    """The C compiler is missing or rejected the agent's source."""


def sources() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.c"))


def source_digest() -> str:
    digest = hashlib.sha256(" ".join(CFLAGS).encode())
    for path in [*sources(), *sorted(SOURCE_DIR.glob("*.h"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def ensure_agent_binary(out_dir: Path, *, compiler: str = "gcc") -> Path:
    """Returns the path of an up-to-date agent binary in ``out_dir``, compiling it if needed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / BINARY_NAME
    stamp = out_dir / f"{BINARY_NAME}.sha256"
    wanted = source_digest()
    if _is_current(binary, stamp, wanted):
        return binary
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(binary, stamp, wanted):
            return binary
        if shutil.which(compiler) is None:
            raise GuestBuildError(f"{compiler} not found; install gcc and libc6-dev to build the guest agent")
        tmp = out_dir / f".{BINARY_NAME}.{os.getpid()}.tmp"
        result = subprocess.run(
            [compiler, *CFLAGS, "-o", str(tmp), *map(str, sources())],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise GuestBuildError(f"compiling the guest agent failed:\n{result.stderr.strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, binary)
        stamp.write_text(wanted + "\n")
    return binary


def _is_current(binary: Path, stamp: Path, wanted: str) -> bool:
    try:
        return binary.is_file() and stamp.read_text().strip() == wanted
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m paddock_hostagent.guest.build OUTDIR", file=sys.stderr)
        return 2
    try:
        print(ensure_agent_binary(Path(args[0])))
    except GuestBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
