"""Fixtures of the terminal tests: those of the host agent suite (guest binary, image, agent, sandbox)."""

from __future__ import annotations

from tests.hostagent.conftest import (
    agent,
    debian_image,
    guest_binary_dir,
    host,
    make_agent,
    sandbox,
    sandboxes,
)

__all__ = ["agent", "debian_image", "guest_binary_dir", "host", "make_agent", "sandbox", "sandboxes"]
