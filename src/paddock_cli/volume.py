"""``paddock volume …``: local persistent volumes (docs/volumes.md), XFS filesystems kept on the host
that made them, which outlive every sandbox they are mounted into.

A volume is named by its id (``vol_…``) or its name (unique in the account). Mount one at create with
``paddock sandbox create`` through the API's ``volumes`` field or the SDK's ``volumes=``; one sandbox
writes at a time, any number read.
"""

from __future__ import annotations

from typing import Any

import typer

from paddock_cli.listing import LAZY_GROUPS
from paddock_cli.output import JSON_OPTION, api_errors, client, emit, print_fields, print_table

app = typer.Typer(no_args_is_help=True, help=LAZY_GROUPS["volume"].help)


def holders(volume: Any) -> str:
    return ", ".join(
        f"{a.sandbox_id}:{a.mount_path}{' (ro)' if a.read_only else ''}" for a in volume.attachments or []
    )


def show(volume: Any) -> None:
    print_fields(
        [
            ("id", volume.id),
            ("name", volume.name),
            ("status", volume.status),
            ("size_mib", str(volume.size_mib)),
            ("host_id", volume.host_id),
            ("created_at", volume.created_at),
            ("attached", holders(volume)),
        ]
    )


@app.command()
def create(
    name: str,
    size_mib: int = typer.Option(..., "--size-mib", help="Its size in MiB (at least 512)."),
    host_id: str = typer.Option(None, "--host-id", help="The host to keep it on (default: one with room)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Create a volume; prints only its id, for `vol=$(paddock volume create NAME --size-mib N)`."""
    with api_errors(), client() as sdk:
        volume = sdk.volumes.create(name, size_mib, host_id=host_id)
    emit(volume, json_out, lambda v: typer.echo(v.id))


@app.command("ls")
def list_volumes(json_out: bool = JSON_OPTION) -> None:
    """List your volumes with their size, host and the sandboxes holding them."""
    with api_errors(), client() as sdk:
        volumes = sdk.volumes.list()
    emit(
        volumes,
        json_out,
        lambda items: print_table(
            ["ID", "NAME", "STATUS", "SIZE_MIB", "HOST", "ATTACHED"],
            [[v.id, v.name, v.status, v.size_mib, v.host_id, holders(v)] for v in items],
        ),
    )


@app.command()
def get(volume: str, json_out: bool = JSON_OPTION) -> None:
    """Show a volume (id or name) and the sandboxes holding it."""
    with api_errors(), client() as sdk:
        found = sdk.volumes.get(volume)
    emit(found, json_out, show)


@app.command()
def resize(
    volume: str,
    size_mib: int = typer.Option(..., "--size-mib", help="The new, larger size in MiB."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Grow a volume (online while a sandbox holds it; a volume never shrinks)."""
    with api_errors(), client() as sdk:
        grown = sdk.volumes.resize(volume, size_mib)
    emit(grown, json_out, show)


@app.command("rm")
def delete(volumes: list[str], json_out: bool = JSON_OPTION) -> None:
    """Delete volumes and their data (refused while a sandbox holds one: detach it or destroy it first)."""
    done = []
    with api_errors(), client() as sdk:
        for ref in volumes:
            volume_id = sdk.volumes.get(ref).id
            sdk.volumes.delete(volume_id)
            done.append({"id": volume_id, "deleted": True})
    emit(done, json_out, _deleted)


def _deleted(items: list[dict[str, Any]]) -> None:
    for item in items:
        typer.echo(f"{item['id']}  deleted")
