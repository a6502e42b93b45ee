"""The SDK is tested against the real control plane: reuse its fixtures."""

from __future__ import annotations

from tests.controlplane.conftest import controlplane, cp_settings
from tests.controlplane.test_sandboxes_rules import fake_host

__all__ = ["controlplane", "cp_settings", "fake_host"]
