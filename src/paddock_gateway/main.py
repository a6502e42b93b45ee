"""``paddock gateway``: build the settings from the environment and serve the app with uvicorn."""

from __future__ import annotations

from paddock_core.logging import configure_logging
from paddock_core.serving import serve
from paddock_gateway.app import create_app
from paddock_gateway.settings import GatewaySettings


def main() -> None:
    settings = GatewaySettings()
    configure_logging(settings.log_level, json=settings.log_json)
    app = create_app(settings)
    serve(app, settings.host, settings.port)


if __name__ == "__main__":
    main()
