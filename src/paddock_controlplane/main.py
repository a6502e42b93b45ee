"""``paddock controlplane``: run the control plane alone."""

from __future__ import annotations

import uvicorn

from paddock_controlplane.app import create_app
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.logging import configure_logging


def main(settings: ControlPlaneSettings | None = None) -> None:
    settings = settings or ControlPlaneSettings()
    configure_logging(settings.log_level, json=settings.log_json)
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port, log_config=None, access_log=False
    )
