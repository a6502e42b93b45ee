"""``paddock`` — one entry point for the services, the admin tasks and (with the SDK) the client.

Server commands import their service lazily, so the client commands work on an SDK-only install. The
client and admin commands live in their own modules, imported only when their command runs: ``paddock
--help`` lists them from ``listing.LAZY`` and imports none of them (nor the SDK, httpx or SQLAlchemy), and
``paddock admin …`` imports the admin module alone.
"""

from __future__ import annotations

import importlib
import operator
from typing import Any

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from paddock_cli import output
from paddock_cli.listing import LAZY, LAZY_FIRST, LAZY_GROUPS


class Listed(TyperCommand):
    """A lazy command as ``--help`` and shell completion list it: its name and help, nothing imported.
    ``PaddockGroup.resolve_command`` puts the real command in its place before it can run."""

    def invoke(self, ctx: Any) -> Any:  # typer's own vendored click types
        raise RuntimeError(f"paddock {self.name} was not loaded")  # pragma: no cover


def load(name: str) -> Any:
    """The real command ``name`` of ``LAZY``: its module imported, its Typer app or function made into a
    command as ``add_typer``/``command`` on the root app would have (the same defaults)."""
    module, _, attribute = LAZY[name].target.partition(":")
    target = operator.attrgetter(attribute)(importlib.import_module(module))
    wrapper = typer.Typer()
    if isinstance(target, typer.Typer):
        wrapper.add_typer(target, name=name)
    else:
        wrapper.command(name)(target)
    return typer.main.get_group(wrapper).commands[name]


class PaddockGroup(TyperGroup):
    """The root command: lists every command, but imports a lazy one's module only to run it (or to
    complete or show the help of anything under it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        listed = {name: Listed(name, help=lazy.help) for name, lazy in LAZY.items()}
        self.commands = {
            **{name: listed[name] for name in LAZY_FIRST},
            **self.commands,
            **{name: listed[name] for name in LAZY_GROUPS},
        }

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and isinstance(self.commands.get(args[0]), Listed):
            self.commands[args[0]] = load(args[0])
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=PaddockGroup,
    help="Paddock: a self-hostable sandbox cloud for AI agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    epilog=(
        "Client commands exit 0 on success, 1 on an API error, 2 on a usage error, 3 when the server "
        "cannot be reached, 4 when something is not found, 5 when a wait fails (sandbox failed, timeout, "
        "deployment failed), 6 when a payment cannot be made or is refused. `sandbox exec` exits with "
        "the command's own code (127 if it could not run)."
    ),
)


@app.callback()
def configure(
    url: str = typer.Option(
        None, "--url", envvar="PADDOCK_BASE_URL", help="Control-plane URL (default http://127.0.0.1:8080)."
    ),
    api_key: str = typer.Option(
        None, "--api-key", envvar="PADDOCK_API_KEY", help="Your API key.", show_default=False
    ),
) -> None:
    """Where the client commands find the control plane (flags win over the environment)."""
    output.CONFIG.url = url
    output.CONFIG.api_key = api_key


@app.command()
def mcp(
    transport: str = typer.Option(
        "stdio", "--transport", "-t", help="stdio (for a client that starts this process) or http."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="http: the address to listen on."),
    port: int = typer.Option(8765, "--port", help="http: the port; the endpoint is /mcp."),
) -> None:
    """Serve Paddock's sandboxes as MCP tools (needs the mcp extra of the paddock package).

    Configured like the other client commands: PADDOCK_BASE_URL and PADDOCK_API_KEY (or --url and
    --api-key before `mcp`). Over http every client acts with this key: keep it on 127.0.0.1.
    """
    if transport not in ("stdio", "http"):
        raise output.fail(f"--transport must be stdio or http, not {transport!r}", output.ExitCode.USAGE)
    try:
        # Lazy: the mcp extra is optional, and the other commands work without it.
        import paddock_mcp
    except ImportError as exc:
        raise output.fail(
            f"paddock mcp needs the mcp extra: pip install 'paddock[mcp]' ({exc})", output.ExitCode.USAGE
        ) from None
    output.show_server_warnings()
    paddock_mcp.run(
        "stdio" if transport == "stdio" else "http",
        host=host,
        port=port,
        base_url=output.CONFIG.url,
        api_key=output.CONFIG.api_key,
    )


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
