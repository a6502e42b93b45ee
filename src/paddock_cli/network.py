"""``paddock network …``: private overlay networks between your sandboxes (§11.10, §11.12).

A network is named by its id (``net_…``) or its name; names need not be unique, so a name two networks
share is refused with both ids (use one of them). Sandboxes are named by id or name, as everywhere.
"""

from __future__ import annotations

from typing import Any

import typer

from paddock_cli.listing import LAZY_GROUPS
from paddock_cli.output import (
    JSON_OPTION,
    ExitCode,
    api_errors,
    client,
    emit,
    fail,
    plain,
    print_fields,
    print_table,
)
from paddock_cli.sandbox import resolve

app = typer.Typer(no_args_is_help=True, help=LAZY_GROUPS["network"].help)


def find(sdk: Any, ref: str) -> Any:
    """The network ``ref`` names, with its members: an id (``net_…``) is read as it is; a name is looked
    up in the account's networks and must name exactly one."""
    if ref.startswith("net_"):
        return sdk.networks.get(ref)
    named = [n for n in sdk.networks.list() if n.name == ref]
    if not named:
        raise fail(f"no network named {ref!r}", ExitCode.NOT_FOUND)
    if len(named) > 1:
        ids = ", ".join(n.id for n in named)
        raise fail(f"{len(named)} networks are named {ref!r} ({ids}): name one by its id", ExitCode.USAGE)
    return sdk.networks.get(named[0].id)


def show(network: Any) -> None:
    members = network.members or []
    print_fields(
        [
            ("id", network.id),
            ("name", network.name),
            ("created_at", network.created_at),
            ("members", str(len(members))),
        ]
    )
    if members:
        typer.echo("")
        show_members(members)


def show_members(members: list[Any]) -> None:
    """Members as a table; each a NetworkMember, or its JSON form (attach's result)."""
    rows = [plain(m) for m in members]
    print_table(
        ["SANDBOX", "NAME", "STATUS", "IP"],
        [[r["sandbox_id"], r.get("name"), r["status"], r.get("ip")] for r in rows],
    )


@app.command()
def create(name: str, json_out: bool = JSON_OPTION) -> None:
    """Create a network; prints only its id, for `net=$(paddock network create NAME)` (all with --json)."""
    with api_errors(), client() as sdk:
        network = sdk.networks.create(name)
    emit(network, json_out, lambda n: typer.echo(n.id))


@app.command("ls")
def list_networks(json_out: bool = JSON_OPTION) -> None:
    """List your networks with their member counts."""
    with api_errors(), client() as sdk:
        networks = sdk.networks.list()
    emit(
        networks,
        json_out,
        lambda items: print_table(
            ["ID", "NAME", "MEMBERS", "CREATED"],
            [[n.id, n.name, n.member_count, n.created_at] for n in items],
        ),
    )


@app.command()
def get(network: str, json_out: bool = JSON_OPTION) -> None:
    """Show a network (id or name) and its members: sandbox, status and overlay IP."""
    with api_errors(), client() as sdk:
        found = find(sdk, network)
    emit(found, json_out, show)


@app.command("rm")
def delete(networks: list[str], json_out: bool = JSON_OPTION) -> None:
    """Delete networks (refused while a live sandbox is a member: detach it or destroy it first)."""
    done = []
    with api_errors(), client() as sdk:
        for ref in networks:
            network_id = find(sdk, ref).id
            sdk.networks.delete(network_id)
            done.append({"id": network_id, "deleted": True})
    emit(done, json_out, lambda items: _lines(items, "id", "deleted"))


def _members(sdk: Any, network_id: str, sandbox_ids: list[str]) -> list[Any]:
    """The network's members among ``sandbox_ids``, read back after the change, in that order."""
    members = {m.sandbox_id: m for m in sdk.networks.get(network_id).members or []}
    return [members[sid] for sid in sandbox_ids if sid in members]


@app.command()
def attach(
    network: str,
    sandboxes: list[str] = typer.Argument(..., help="Running sandboxes (id or name) to join."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Join running SANDBOXES to NETWORK and print each one's overlay IP on it (a member stays one)."""
    with api_errors(), client() as sdk:
        network_id = find(sdk, network).id
        joined = []
        for ref in sandboxes:
            sandbox = resolve(sdk, ref)
            sandbox.join_network(network_id)
            joined.append(sandbox.id)
        members = _members(sdk, network_id, joined)
    emit([{"network_id": network_id, **plain(m)} for m in members], json_out, show_members)


@app.command()
def detach(
    network: str,
    sandboxes: list[str] = typer.Argument(..., help="Sandboxes (id or name) to take off the network."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Take SANDBOXES off NETWORK (their overlay interface is removed)."""
    left = []
    with api_errors(), client() as sdk:
        network_id = find(sdk, network).id
        for ref in sandboxes:
            sandbox = resolve(sdk, ref)
            sandbox.leave_network(network_id)
            left.append({"network_id": network_id, "sandbox_id": sandbox.id, "detached": True})
    emit(left, json_out, lambda items: _lines(items, "sandbox_id", "detached"))


def _lines(items: list[dict[str, Any]], key: str, word: str) -> None:
    for item in items:
        typer.echo(f"{item[key]}  {word}")
