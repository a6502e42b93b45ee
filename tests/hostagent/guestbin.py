"""The guest agent binary run outside any container (``--listen PATH``) for tests, this tree's or one
built from an older commit's sources (a sandbox started before the host agent was upgraded)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from paddock_hostagent.guest import GuestClient
from paddock_hostagent.guest.build import CFLAGS, SOURCE_DIR
from tests.hostagent.test_guest_agent import _listening


def serve(binary: Path, socket_path: Path) -> Iterator[GuestClient]:
    """The guest agent ``binary`` listening on ``socket_path`` while the caller holds the client."""
    process = subprocess.Popen([str(binary), "--listen", str(socket_path)])
    deadline = time.monotonic() + 5
    while not _listening(socket_path) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _listening(socket_path), "the guest agent did not listen"
    try:
        yield GuestClient(socket_path)
    finally:
        process.kill()
        process.wait()


def build_old(commit: str, workdir: Path) -> Path:
    """The guest agent built from ``commit``'s sources (skipped without that history, as in a shallow
    clone); returns the binary's path."""
    repo = SOURCE_DIR.parents[2]
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", commit, "src/paddock_hostagent/guest/"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip(f"git history without {commit}: {listed.stderr.strip()}")
    sources = []
    for name in listed.stdout.split():
        if name.endswith((".c", ".h")):
            target = workdir / Path(name).name
            shown = subprocess.run(
                ["git", "-C", str(repo), "show", f"{commit}:{name}"], capture_output=True, check=True
            )
            target.write_bytes(shown.stdout)
            sources.append(target)
    binary = workdir / "old-guest"
    subprocess.run(
        ["gcc", *CFLAGS, "-o", str(binary), *(str(s) for s in sources if s.suffix == ".c")], check=True
    )
    return binary
