"""Disk fixtures: S3 servers (moto, on 127.0.0.1) and the host agent fixtures, all torn down afterwards."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

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


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """An S3 server that accepts any key (the data path)."""
    server = S3Server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_checked() -> Iterator[S3Server]:
    """An S3 server that checks signatures (wrong credentials are refused)."""
    server = S3Server.start(auth=True)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def no_s3fs_left() -> Iterator[None]:
    """Every s3fs process a disk test started is gone at the end of the session."""
    yield
    left = subprocess.run(["pgrep", "-a", "-x", "s3fs"], capture_output=True, text=True).stdout
    assert "pdkt-" not in left and "pdkcp-" not in left, f"s3fs processes left behind: {left}"
