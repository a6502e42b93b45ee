"""``paddock wallet-sandbox``: rent a sandbox with a wallet alone, paid by x402 (the gateway's ``POST
/agent/sandboxes``, ``GatewayClient.create_wallet_sandbox``), and list, pause, resume and delete the
wallet's sandboxes. The wallet key and gateway URL are found as ``paddock deploy`` finds them.

``create`` prints the sandbox id and its access token (shown once: keep it) and how to use them with the
other commands: ``PADDOCK_BASE_URL=<control plane> PADDOCK_API_KEY=<token> paddock sandbox exec <id> --
echo hi``. ``--scheme exact`` (default) buys ``--seconds`` of running now; ``--scheme upto`` authorises
that much as a maximum and is settled for the seconds the sandbox really ran. Every command takes
``--json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from paddock_cli.deploy import DEVCHAIN, GATEWAY_URL, JSON_OUT, KEY_FILE, gateway_client, wallet_key
from paddock_cli.listing import LAZY_GROUPS
from paddock_cli.output import (
    ExitCode,
    api_errors,
    emit,
    fail,
    print_fields,
    print_table,
    show_server_warnings,
)

app = typer.Typer(help=LAZY_GROUPS["wallet-sandbox"].help, no_args_is_help=True)

SANDBOX_ID = typer.Argument(..., help="The sandbox's id (sb-…), as create printed it.")


@app.command("create")
def create(
    seconds: int = typer.Option(3600, "--seconds", min=1, max=2_592_000, help="Seconds of running paid for."),
    shape: str = typer.Option(None, "--shape", help="[default: the gateway's]"),
    rootfs: str = typer.Option(None, "--rootfs", help="[default: the gateway's]"),
    chain: str = typer.Option("base", "--chain", help="base or arbitrum."),
    asset: str = typer.Option("usdc", "--asset", help="usdc or usdt (case-insensitive)."),
    scheme: str = typer.Option("exact", "--scheme", help="exact (a block, now) or upto (by the second)."),
    method: str = typer.Option(
        None, "--method", help="eip3009 or permit2 (default: eip3009 where the token has it)."
    ),
    gateway_url: str = GATEWAY_URL,
    key_file: Path = KEY_FILE,
    devchain: Path = DEVCHAIN,
    rpc_url: str = typer.Option(
        None, "--rpc-url", help="JSON-RPC URL of --chain: lets Permit2 be approved when short."
    ),
    json_out: bool = JSON_OUT,
) -> None:
    """Rent a sandbox paid by x402: print its id, access token and control-plane URL."""
    try:
        from paddock.gateway import GatewayClient
    except ImportError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    show_server_warnings()
    rpc_urls: dict[str, str] = {}
    private_key = wallet_key(key_file, devchain, rpc_urls)
    if rpc_url:
        rpc_urls[chain] = rpc_url
    with api_errors():
        try:
            with GatewayClient(gateway_url, private_key, rpc_urls=rpc_urls) as gateway:
                sandbox = gateway.create_wallet_sandbox(
                    seconds=seconds,
                    shape=shape,
                    rootfs=rootfs,
                    chain=chain,
                    token=asset,
                    scheme=scheme,
                    method=method,
                )
        except ValueError as exc:
            raise fail(str(exc), ExitCode.USAGE) from None

    def show(made: Any) -> None:
        paid = (
            f"{made.amount_raw} raw in {made.transaction}"
            if made.scheme == "exact"
            else f"up to {made.authorized_raw} raw, settled for the seconds it runs"
        )
        print_fields(
            [
                ("sandbox_id", made.sandbox_id),
                ("access_token", made.access_token),
                ("control_plane_url", made.control_plane_url),
                ("expires_at", made.expires_at),
                ("payment", f"{made.scheme} on {made.network}: {paid}"),
                ("price_per_second_raw", made.price_per_second_raw),
            ]
        )
        typer.echo(
            f"\nPADDOCK_BASE_URL={made.control_plane_url} PADDOCK_API_KEY=<access_token> "
            f"paddock sandbox exec {made.sandbox_id} -- echo hi",
            err=True,
        )

    emit(sandbox, json_out, show)


@app.command("ls")
def ls(
    gateway_url: str = GATEWAY_URL,
    key_file: Path = KEY_FILE,
    devchain: Path = DEVCHAIN,
    json_out: bool = JSON_OUT,
) -> None:
    """The wallet's sandboxes not deleted: id, state, running and remaining seconds."""
    with api_errors(), gateway_client(gateway_url, key_file, devchain) as gateway:
        sandboxes = gateway.wallet_sandboxes()
    emit(
        sandboxes,
        json_out,
        lambda rows: print_table(
            ["ID", "STATE", "SCHEME", "SHAPE", "RUNNING_S", "REMAINING_S"],
            [
                [
                    s["sandbox_id"],
                    s["state"],
                    s["scheme"],
                    s["shape"],
                    s["running_seconds"],
                    s["remaining_seconds"],
                ]
                for s in rows
            ],
        ),
    )


def _act(
    action: str, sandbox_id: str, gateway_url: str | None, key_file: Path | None, devchain: Path | None
) -> Any:
    with api_errors(), gateway_client(gateway_url, key_file, devchain) as gateway:
        call = {
            "pause": gateway.pause_wallet_sandbox,
            "resume": gateway.resume_wallet_sandbox,
            "rm": gateway.delete_wallet_sandbox,
        }[action]
        try:
            return call(sandbox_id)
        except ValueError as exc:
            raise fail(str(exc), ExitCode.USAGE) from None


def _print_state(answer: Any) -> None:
    typer.echo(f"{answer['sandbox_id']} {answer['state']}")


@app.command("pause")
def pause(
    sandbox_id: str = SANDBOX_ID,
    gateway_url: str = GATEWAY_URL,
    key_file: Path = KEY_FILE,
    devchain: Path = DEVCHAIN,
    json_out: bool = JSON_OUT,
) -> None:
    """Pause a sandbox: its running time, and so its billing, stops."""
    emit(_act("pause", sandbox_id, gateway_url, key_file, devchain), json_out, _print_state)


@app.command("resume")
def resume(
    sandbox_id: str = SANDBOX_ID,
    gateway_url: str = GATEWAY_URL,
    key_file: Path = KEY_FILE,
    devchain: Path = DEVCHAIN,
    json_out: bool = JSON_OUT,
) -> None:
    """Resume a paused sandbox (refused once its paid time is used up)."""
    emit(_act("resume", sandbox_id, gateway_url, key_file, devchain), json_out, _print_state)


@app.command("rm")
def rm(
    sandbox_id: str = SANDBOX_ID,
    gateway_url: str = GATEWAY_URL,
    key_file: Path = KEY_FILE,
    devchain: Path = DEVCHAIN,
    json_out: bool = JSON_OUT,
) -> None:
    """Delete a sandbox and its token; an upto payment is then settled for the seconds it ran."""
    emit(_act("rm", sandbox_id, gateway_url, key_file, devchain), json_out, _print_state)
