"""CLI fixtures: the real platform on loopback for the client commands, the in-process control plane
for ``paddock admin``."""

from __future__ import annotations

from tests.controlplane.conftest import controlplane, cp_settings
from tests.gateway.conftest import chain_gateway, devchains, paying_wallet
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.sdk.conftest import live

__all__ = [
    "chain_gateway",
    "controlplane",
    "cp_settings",
    "debian_image",
    "devchains",
    "guest_binary_dir",
    "live",
    "paying_wallet",
]
