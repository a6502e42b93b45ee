"""``paddock webhook …``: the endpoints that receive your signed events (§11.14)."""

from __future__ import annotations

from typing import Any

import typer

from paddock_cli.listing import LAZY_GROUPS
from paddock_cli.output import JSON_OPTION, api_errors, client, emit, print_fields, print_table

app = typer.Typer(no_args_is_help=True, help=LAZY_GROUPS["webhook"].help)


def show(endpoint: Any) -> None:
    print_fields(
        [
            ("id", endpoint.id),
            ("url", endpoint.url),
            ("events", endpoint.events or "every action"),
            ("active", str(endpoint.active).lower()),
            ("failureCount", str(endpoint.failure_count)),
            ("createdAt", endpoint.created_at),
            ("secret", endpoint.secret),
        ]
    )
    if endpoint.deliveries:
        print_table(
            ["DELIVERY", "EVENT", "STATUS", "ATTEMPTS", "DELIVERED", "LAST ERROR"],
            [
                [d.id, d.event_action, d.status, d.attempts, d.delivered_at, d.last_error]
                for d in endpoint.deliveries
            ],
        )


@app.command()
def actions(json_out: bool = JSON_OPTION) -> None:
    """Every action an endpoint can subscribe to."""
    with api_errors(), client() as sdk:
        names = sdk.webhooks.actions()
    emit(names, json_out, lambda items: typer.echo("\n".join(items)))


@app.command()
def create(
    url: str,
    event: list[str] = typer.Option([], "--event", "-e", help="An action to receive (repeat); none = all."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Register an endpoint. Prints its signing secret: shown this once only."""
    with api_errors(), client() as sdk:
        endpoint = sdk.webhooks.create(url, event or None)
    emit(endpoint, json_out, show)


@app.command("ls")
def list_endpoints(json_out: bool = JSON_OPTION) -> None:
    """List your endpoints (never their secrets)."""
    with api_errors(), client() as sdk:
        endpoints = sdk.webhooks.list()
    emit(
        endpoints,
        json_out,
        lambda items: print_table(
            ["ID", "URL", "EVENTS", "ACTIVE", "FAILURES"],
            [[e.id, e.url, ",".join(e.events) or "*", e.active, e.failure_count] for e in items],
        ),
    )


@app.command()
def get(endpoint_id: str, json_out: bool = JSON_OPTION) -> None:
    """Show an endpoint and its recent deliveries (newest first)."""
    with api_errors(), client() as sdk:
        endpoint = sdk.webhooks.get(endpoint_id)
    emit(endpoint, json_out, show)


@app.command()
def suspend(endpoint_id: str, json_out: bool = JSON_OPTION) -> None:
    """Stop deliveries; pending ones wait for resume."""
    with api_errors(), client() as sdk:
        endpoint = sdk.webhooks.suspend(endpoint_id)
    emit(endpoint, json_out, show)


@app.command()
def resume(endpoint_id: str, json_out: bool = JSON_OPTION) -> None:
    """Deliver again (resets failureCount)."""
    with api_errors(), client() as sdk:
        endpoint = sdk.webhooks.resume(endpoint_id)
    emit(endpoint, json_out, show)


@app.command()
def rm(endpoint_ids: list[str], json_out: bool = JSON_OPTION) -> None:
    """Delete endpoints and their deliveries."""
    done = []
    with api_errors(), client() as sdk:
        for endpoint_id in endpoint_ids:
            sdk.webhooks.delete(endpoint_id)
            done.append({"id": endpoint_id, "deleted": True})
    emit(done, json_out, print_deleted)


def print_deleted(items: list[dict[str, Any]]) -> None:
    for item in items:
        typer.echo(f"{item['id']}  deleted")
