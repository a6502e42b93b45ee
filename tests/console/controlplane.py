"""``paddock controlplane`` with the web console mounted: what the tests start until the control plane's
app factory calls ``mount_console`` itself (then this mounts nothing more: the call is idempotent)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from paddock_controlplane import main as controlplane_main
from paddock_controlplane.edge.console import mount_console

factory = controlplane_main.create_app


def create_app(*args: Any, **kwargs: Any) -> FastAPI:
    app: FastAPI = factory(*args, **kwargs)
    mount_console(app)
    return app


if __name__ == "__main__":
    controlplane_main.create_app = create_app
    controlplane_main.main()
