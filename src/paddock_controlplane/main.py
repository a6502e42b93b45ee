"""``paddock controlplane``: run the control plane alone."""

from __future__ import annotations

from paddock_controlplane.app import create_app
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.logging import configure_logging
from paddock_core.serving import serve


def main(settings: ControlPlaneSettings | None = None) -> None:
    settings = settings or ControlPlaneSettings()
    configure_logging(settings.log_level, json=settings.log_json)
    serve(create_app(settings), settings.host, settings.port)
