"""``paddock volume …``: local persistent volumes (docs/volumes.md), XFS filesystems kept on the host
that made them, which outlive every sandbox they are mounted into.

A volume is named by its id (``vol_…``) or its name (unique in the account). Mount one at create with
``paddock sandbox create`` through the API's ``volumes`` field or the SDK's ``volumes=``; one sandbox
writes at a time, any number read.
"""

from __future__ import annotations

import sys
from pathlib import Path
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
    print_fields,
    print_table,
)
from paddock_cli.sandbox import copied, split_remote

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


@app.command()
def cp(
    source: str = typer.Argument(..., help="A local file, `-` for stdin, or VOLUME:/path."),
    dest: str = typer.Argument(..., help="A local path, `-` for stdout, or VOLUME:/path."),
    json_out: bool = typer.Option(
        False, "--json", help="Print JSON (the paths copied and the bytes) for scripts; not with `-` out."
    ),
) -> None:
    """Copy one file into or out of a volume without a sandbox (its host does it; at most 64 MiB), as
    `cp` does: `paddock volume cp ./init.sql pgdata:/seed/`, `paddock volume cp pgdata:/out.csv .`"""
    from paddock._resources import VolumeFiles  # its bound, checked before a local file is read

    src_ref, src_path = split_remote(source)
    dst_ref, dst_path = split_remote(dest)
    if (src_ref is None) == (dst_ref is None):
        raise fail("exactly one side must be VOLUME:/path", ExitCode.USAGE)
    if json_out and dst_ref is None and dst_path == "-":
        raise fail("--json prints to stdout, where `-` writes the file: use one", ExitCode.USAGE)
    limit = VolumeFiles.MAX_FILE_BYTES
    with api_errors(), client() as sdk:
        if dst_ref is not None:
            if src_path == "-":
                data = sys.stdin.buffer.read(limit + 1)
            else:
                local = Path(src_path)
                if not local.is_file():
                    raise fail(f"{src_path}: no such file", ExitCode.USAGE)
                if local.stat().st_size > limit:
                    raise fail(
                        f"{src_path}: over {limit} bytes; copy it from a sandbox that mounts the volume",
                        ExitCode.USAGE,
                    )
                data = local.read_bytes()
                if dst_path.endswith("/"):
                    dst_path += local.name
            size = sdk.volumes.files(dst_ref).write(dst_path, data)
            destination = f"{dst_ref}:{dst_path}"
        else:
            data = sdk.volumes.files(src_ref or "").read(src_path)
            if dst_path == "-":
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
                return
            target = Path(dst_path)
            if target.is_dir():
                target = target / Path(src_path.rstrip("/")).name
            target.write_bytes(data)
            size, destination = len(data), str(target)
    copied(destination, size, json_out, source=source)


@app.command("files")
def list_files(
    volume: str,
    path: str = typer.Argument("/", help="The directory, from the volume's root."),
    depth: int = typer.Option(1, "--depth", help="Levels to list (1: its entries)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """List a volume's files without a sandbox (a symlink is shown with its target, never followed)."""
    with api_errors(), client() as sdk:
        entries = sdk.volumes.files(volume).list(path, depth=depth)
    emit(
        entries,
        json_out,
        lambda items: print_table(
            ["TYPE", "SIZE", "MODE", "MODIFIED", "PATH"],
            [
                [
                    e.type,
                    e.size,
                    e.permissions,
                    e.modified_at or "",
                    e.path + (f" -> {e.symlink_target}" if e.symlink_target else ""),
                ]
                for e in items
            ],
        ),
    )
