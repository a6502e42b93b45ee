"""``paddock`` — one entry point for the services, the admin tasks and (with the SDK) the client.

Server commands import their service lazily, so the client commands work on an SDK-only install.
"""

from __future__ import annotations

import typer

from paddock_cli import admin

app = typer.Typer(
    help="Paddock: a self-hostable sandbox cloud for AI agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(admin.app, name="admin", help="Accounts and API keys (talks to the database directly).")


@app.command()
def serve() -> None:
    """Run everything on embedded defaults: control plane, a host agent, the gateway, the workers."""
    from paddock_cli.serve import serve_embedded

    raise typer.Exit(serve_embedded())


@app.command()
def controlplane() -> None:
    """Run the sandbox control plane alone (configured by PADDOCK_CP_* variables)."""
    from paddock_controlplane.main import main as run

    run()


@app.command()
def hostagent() -> None:
    """Run a host agent alone (configured by PADDOCK_HOST_* variables)."""
    from paddock_hostagent.main import main as run

    run()


@app.command()
def gateway() -> None:
    """Run the deployment payment gateway alone (configured by PADDOCK_GW_* variables)."""
    from paddock_gateway.main import main as run

    run()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
