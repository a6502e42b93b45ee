"""Disk fixtures: S3 servers (moto, on 127.0.0.1) and the host agent fixtures, all torn down afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import sweep
from tests.controlplane.conftest import controlplane, cp_settings
from tests.disks.s3server import S3Server
from tests.hostagent.conftest import (
    agent,
    debian_image,
    guest_binary_dir,
    host,
    make_agent,
    pytest_collection_modifyitems,
    sandboxes,
)

__all__ = [
    "agent",
    "controlplane",
    "cp_settings",
    "debian_image",
    "guest_binary_dir",
    "host",
    "make_agent",
    "pytest_collection_modifyitems",
    "sandboxes",
]


@pytest.fixture(scope="package")
def s3() -> Iterator[S3Server]:
    """An S3 server that accepts any key (the data path)."""
    server = S3Server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def s3_checked() -> Iterator[S3Server]:
    """An S3 server that checks signatures (wrong credentials are refused)."""
    server = S3Server.start(auth=True)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def no_s3fs_left() -> Iterator[None]:
    """Every s3fs process a disk test started is gone at the end of the session. Another test run's
    (a CI run, a benchmark) serves a state dir whose owner, another live process, still holds it."""
    yield
    listed = subprocess.run(["pgrep", "-a", "-x", "s3fs"], capture_output=True, text=True).stdout
    left = [line for line in listed.splitlines() if _test_state_dir(line) and not _owned_elsewhere(line)]
    assert left == [], f"s3fs processes left behind: {left}"


def _test_state_dir(line: str) -> Path | None:
    """The test state dir (an agent's ``/tmp/pdkt-…``, a control plane's ``/tmp/pdkcp-…``) an s3fs
    command line names."""
    match = re.search(r"/tmp/(pdkt2?-[0-9a-f]+|pdkcp-[0-9a-f]+)/", line)
    return Path("/tmp", match.group(1)) if match else None


def _owned_elsewhere(line: str) -> bool:
    directory = _test_state_dir(line)
    lock = directory / sweep.OWNER_LOCK if directory else None
    if lock is None or sweep.lock_free(lock):  # nobody holds it: left behind, by this run or a dead one
        return False
    try:
        owner = json.loads(lock.read_text()).get("pid")
    except (OSError, ValueError):
        return False
    return bool(owner != os.getpid())
