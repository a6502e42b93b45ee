"""``paddock deploy DIR``: pay the gateway with a wallet and deploy a directory (``GatewayClient``).

Progress (upload, quote, payment, confirmation, build) goes to stderr; the URL (or ``--json``) to
stdout. The wallet key comes from ``PADDOCK_WALLET_KEY``, ``--key-file`` or a dev chain's
``devchain.json`` (its public demo wallet); the chain's JSON-RPC URL from ``--rpc-url``,
``PADDOCK_RPC_URL_<CHAIN>`` or ``devchain.json``. ``--x402`` pays by signature instead and the gateway settles it, so no RPC URL and
no gas are needed: ``--asset usdc|usdt`` (``--token``), ``--scheme exact|upto`` (``upto``: the quote as a
maximum, settled later for the runtime used) and ``--method eip3009|permit2`` choose among the 402's
offers; one it does not make is refused before anything is signed. Permit2 needs the wallet's allowance
to the Permit2 contract: with an RPC URL for the chain a short one is approved first (one transaction).

``paddock deploy ls``, ``deploy status NAME [DEPLOYMENT_ID]`` and ``deploy rm NAME`` list, show and delete
the wallet's projects (the gateway's ``GET /agent/projects``, ``GET /agent/deploy/{p}/{d}/status`` and
``DELETE /agent/projects/{p}``), signed with the same wallet key; each takes ``--json``. Any other first
argument is the directory to deploy (``./ls`` for a directory named ``ls``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from paddock_cli.listing import LAZY_GROUPS
from paddock_cli.output import (
    ExitCode,
    api_errors,
    emit,
    fail,
    key_values,
    print_fields,
    print_table,
    show_server_warnings,
)

SUBCOMMANDS = ("ls", "status", "rm")


class DeployGroup(TyperGroup):
    """``deploy ls|status|rm …`` are subcommands; anything else is ``deploy DIR [OPTIONS]``."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:  # typer's own vendored click types
        if args and args[0] in SUBCOMMANDS:
            return super().resolve_command(ctx, args)
        return "dir", self.commands["dir"], args

    def list_commands(self, ctx: Any) -> list[str]:
        return [*SUBCOMMANDS, "dir"]


app = typer.Typer(
    cls=DeployGroup,
    help=LAZY_GROUPS["deploy"].help,
    no_args_is_help=True,
    context_settings={"ignore_unknown_options": True},
    epilog="deploy DIR takes the options listed by `paddock deploy dir --help`.",
)

KEY_FILE = typer.Option(None, "--key-file", help="A file holding the wallet's private key (hex).")
DEVCHAIN = typer.Option(None, "--devchain", help="A dev chain's devchain.json: RPC URLs, demo wallet.")
GATEWAY_URL = typer.Option(
    None, "--gateway-url", envvar="PADDOCK_GATEWAY_URL", help="[default: http://127.0.0.1:8082]"
)
JSON_OUT = typer.Option(False, "--json", help="Print JSON.")


def wallet_key(key_file: Path | None, devchain: Path | None, rpc_urls: dict[str, str] | None = None) -> str:
    """PADDOCK_WALLET_KEY, a --key-file, or a dev chain's demo wallet (whose RPC URLs fill ``rpc_urls``)."""
    private_key = os.environ.get("PADDOCK_WALLET_KEY")
    if devchain is not None:
        try:
            info = json.loads(devchain.read_text())
        except (OSError, ValueError) as exc:
            raise fail(f"--devchain: {exc}", ExitCode.USAGE) from None
        if rpc_urls is not None:
            rpc_urls.update({n: c["rpc_url"] for n, c in info.get("chains", {}).items()})
        private_key = private_key or info.get("demo_wallet", {}).get("private_key")
    if key_file is not None:
        try:
            private_key = key_file.read_text().strip()
        except OSError as exc:
            raise fail(f"--key-file: {exc}", ExitCode.USAGE) from None
    if not private_key:
        raise fail("no wallet key: set PADDOCK_WALLET_KEY, or pass --key-file or --devchain", ExitCode.USAGE)
    return private_key


def gateway_client(gateway_url: str | None, key_file: Path | None, devchain: Path | None) -> Any:
    try:
        from paddock.gateway import GatewayClient
    except ImportError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    show_server_warnings()
    try:
        return GatewayClient(gateway_url, wallet_key(key_file, devchain))
    except ValueError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None


def find_project(gateway: Any, name_or_id: str) -> dict[str, Any]:
    """A project of this wallet by its name (uniqueName) or id."""
    for project in gateway.projects():
        if name_or_id in (project.get("id"), project.get("name")):
            return dict(project)
    raise fail(f"no project named {name_or_id!r} for wallet {gateway.address}", ExitCode.NOT_FOUND)


@app.command("ls")
def ls(
    gateway_url: str = GATEWAY_URL,
    key_file: Path = KEY_FILE,
    devchain: Path = DEVCHAIN,
    json_out: bool = JSON_OUT,
) -> None:
    """The wallet's projects, newest first: name, id, status, URL."""
    with api_errors(), gateway_client(gateway_url, key_file, devchain) as gateway:
        projects = gateway.projects()
    emit(
        projects,
        json_out,
        lambda rows: print_table(
            ["NAME", "ID", "STATUS", "URL", "CREATED"],
            [[p.get("name"), p.get("id"), p.get("status"), p.get("url"), p.get("createdAt")] for p in rows],
        ),
    )


@app.command("status")
def status(
    project: str = typer.Argument(..., help="The project's name or id."),
    deployment_id: str = typer.Argument(
        None, help="A deployment's id (as deploy --json printed it): that deployment's status."
    ),
    gateway_url: str = GATEWAY_URL,
    key_file: Path = KEY_FILE,
    devchain: Path = DEVCHAIN,
    json_out: bool = JSON_OUT,
) -> None:
    """A project's status and URL; with DEPLOYMENT_ID, that deployment's (deploying, ready or failed)."""
    with api_errors(), gateway_client(gateway_url, key_file, devchain) as gateway:
        found = find_project(gateway, project)
        if deployment_id:
            found = {"project": found, **gateway.status(found["id"], deployment_id)}
    emit(found, json_out, lambda d: print_fields([(str(k), v) for k, v in d.items() if k != "project"]))


@app.command("rm")
def rm(
    project: str = typer.Argument(..., help="The project's name or id."),
    gateway_url: str = GATEWAY_URL,
    key_file: Path = KEY_FILE,
    devchain: Path = DEVCHAIN,
    json_out: bool = JSON_OUT,
) -> None:
    """Delete a project on the platform (irreversible); it shows as deleting until it is gone."""
    with api_errors(), gateway_client(gateway_url, key_file, devchain) as gateway:
        found = find_project(gateway, project)
        answer = gateway.delete_project(found["id"])
    emit(answer, json_out, lambda d: typer.echo(f"{found.get('name')} {d.get('status', 'deleted')}"))


def default_name(source: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9-]+", "-", source.resolve().stem).strip("-").lower() or "app"
    return f"{stem[:25].strip('-')}-{secrets.token_hex(3)}"


@app.command("dir", hidden=True)
def deploy(
    source: Path = typer.Argument(..., help="A directory (every file in it) or a .zip archive."),
    name: str = typer.Option(
        None, "--name", "-n", help="uniqueName: the public host name [default: DIR-xxxxxx]."
    ),
    display_name: str = typer.Option(None, "--display-name", help="[default: the name]"),
    description: str = typer.Option(None, "--description"),
    months: int = typer.Option(1, "--months", min=1, max=120, help="Months paid for (multiplies the price)."),
    port: int = typer.Option(3000, "--port", help="The port the application listens on."),
    runtime: str = typer.Option(None, "--runtime", help="e.g. python:3.12, node:22, static."),
    run_command: str = typer.Option(None, "--run-command", help="How to start it (else inferred)."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for the running app (repeat)."),
    chain: str = typer.Option("base", "--chain", help="base or arbitrum."),
    token: str = typer.Option("usdc", "--asset", "--token", help="usdc or usdt (case-insensitive)."),
    x402: bool = typer.Option(
        False, "--x402", help="Pay by x402 signature: the gateway settles it; no gas, no RPC URL."
    ),
    scheme: str = typer.Option(
        None,
        "--scheme",
        help="x402: exact (the quote, now) or upto (at most the quote, for the runtime used).",
    ),
    method: str = typer.Option(
        None, "--method", help="x402: eip3009 or permit2 (default: eip3009 where the token has it)."
    ),
    use_existing_credits: bool = typer.Option(
        False, "--use-existing-credits", help="Deploy on credits shared with your active projects."
    ),
    gateway_url: str = typer.Option(
        None, "--gateway-url", envvar="PADDOCK_GATEWAY_URL", help="[default: http://127.0.0.1:8082]"
    ),
    key_file: Path = typer.Option(None, "--key-file", help="A file holding the wallet's private key (hex)."),
    rpc_url: str = typer.Option(
        None, "--rpc-url", help="JSON-RPC URL of --chain (or PADDOCK_RPC_URL_<CHAIN>)."
    ),
    devchain: Path = typer.Option(
        None, "--devchain", help="A dev chain's devchain.json: RPC URLs, demo wallet."
    ),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds to wait for the build."),
    poll_interval: float = typer.Option(5.0, "--poll-interval", help="Seconds between status polls."),
    json_out: bool = typer.Option(False, "--json", help="Print the deployment as JSON."),
) -> None:
    """Deploy a directory through the payment gateway: quote, pay (ERC-20), build, print the URL."""
    from rich.console import Console

    try:
        from paddock.gateway import GatewayClient
    except ImportError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    show_server_warnings()

    rpc_urls: dict[str, str] = {}
    private_key = wallet_key(key_file, devchain, rpc_urls)
    if rpc_url:
        rpc_urls[chain] = rpc_url
    if not source.exists():
        raise fail(f"{source}: no such directory or file", ExitCode.USAGE)

    settings: dict[str, Any] = {"port": port}
    if runtime:
        settings["runtime"] = runtime
    if run_command:
        settings["runCommand"] = run_command
    if env:
        settings["runEnvs"] = key_values(env, "--env")
    unique_name = name or default_name(source)
    token = token if token.startswith("0x") else token.lower()
    if (scheme or method) and not x402:
        raise fail("--scheme and --method choose an x402 offer: add --x402", ExitCode.USAGE)

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    seen: list[str] = []

    def progress(stage: str, detail: dict[str, Any]) -> None:
        if stage == "upload":
            console.print(
                f"[bold]upload[/]        {detail['files']} file(s), {detail['bytes'] // 1024} KiB as {unique_name}"
            )
        elif stage == "quote":
            console.print(
                f"[bold]quote[/]         {detail['amount_usd']} USD = {detail['amount_token']} raw {token} "
                f"to {detail['pay_to']} on {chain}"
            )
        elif stage == "approval":
            console.print(
                f"[bold]approval[/]      Permit2 approved for {detail['asset']} in {detail['tx_hash']}"
            )
        elif stage == "payment" and detail.get("method") == "x402":
            console.print(
                f"[bold]payment[/]       x402 authorization signed: {detail['scheme']} "
                f"{str(detail['asset']).upper()} by {detail['transfer_method']} (nonce {detail['nonce']})"
            )
        elif stage == "confirmation" and detail.get("method") == "x402":
            settled = detail.get("tx_hash")
            console.print(
                f"[bold]confirmation[/]  the gateway settled it in {settled}"
                if settled
                else "[bold]confirmation[/]  the gateway accepted the authorization (settled later)"
            )
        elif stage == "payment":
            resumed = " (resubmitting an earlier payment)" if detail.get("resumed") else ""
            console.print(f"[bold]payment[/]       {detail['tx_hash']}{resumed}")
        elif stage == "confirmation":
            console.print("[bold]confirmation[/]  the gateway accepted the payment")
        elif stage == "build":
            state = str(detail.get("deployment_status") or detail.get("status"))
            if not seen or seen[-1] != state:
                console.print(f"[bold]build[/]         {state}")
                seen.append(state)
        elif stage == "ready":
            console.print(f"[bold green]ready[/]         {detail.get('endpoint') or '(no URL yet)'}")

    with api_errors():
        try:
            gateway = GatewayClient(
                gateway_url, private_key, rpc_urls=rpc_urls, poll_interval_s=poll_interval
            )
        except ValueError as exc:
            raise fail(str(exc), ExitCode.USAGE) from None
        with gateway:
            try:
                deployment = gateway.deploy(
                    source,
                    unique_name=unique_name,
                    display_name=display_name,
                    description=description,
                    months=months,
                    settings=settings,
                    chain=chain,
                    token=token,
                    use_existing_credits=use_existing_credits,
                    pay_with="x402" if x402 else "transfer",
                    scheme=scheme or "exact",
                    method=method,
                    timeout_s=timeout,
                    on_progress=progress,
                )
            except ValueError as exc:
                raise fail(str(exc), ExitCode.USAGE) from None
    emit(deployment, json_out, lambda d: typer.echo(d.url or d.project_id))
