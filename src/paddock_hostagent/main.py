"""``paddock hostagent``: run the host agent (configured by ``PADDOCK_HOST_*`` variables)."""

from __future__ import annotations

from paddock_core.logging import configure_logging
from paddock_core.serving import serve
from paddock_hostagent.app import create_app
from paddock_hostagent.settings import HostAgentSettings


def main() -> None:
    settings = HostAgentSettings()
    configure_logging(settings.log_level, json=settings.log_json)
    app = create_app(settings)
    serve(app, settings.host, settings.port)


if __name__ == "__main__":
    main()
