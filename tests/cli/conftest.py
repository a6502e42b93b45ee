"""The admin CLI is tested against the real control plane: reuse its fixtures."""

from __future__ import annotations

from tests.controlplane.conftest import controlplane, cp_settings

__all__ = ["controlplane", "cp_settings"]
