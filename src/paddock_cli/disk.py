"""``paddock disk …``: S3 buckets registered once and mounted into sandboxes (§11.10, §11.11).

The credentials are read from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``) or
prompted for without echo, never taken as arguments: a command line is visible to every user of the
machine in ``ps`` and is kept in shell history.
"""

from __future__ import annotations

from typing import Any

import typer

from paddock_cli.listing import LAZY_GROUPS
from paddock_cli.output import JSON_OPTION, api_errors, client, emit, print_fields, print_table
from paddock_cli.sandbox import resolve

app = typer.Typer(no_args_is_help=True, help=LAZY_GROUPS["disk"].help)

ACCESS_KEY = typer.Option(
    ..., "--access-key", envvar="AWS_ACCESS_KEY_ID", prompt=True, hide_input=True, show_default=False
)
SECRET_KEY = typer.Option(
    ..., "--secret-key", envvar="AWS_SECRET_ACCESS_KEY", prompt=True, hide_input=True, show_default=False
)


def show(disk: Any) -> None:
    config = disk.config or {}
    print_fields(
        [
            ("id", disk.id),
            ("name", disk.name),
            ("kind", disk.kind),
            ("bucket", config.get("bucket")),
            ("endpoint", config.get("endpoint")),
            ("region", config.get("region")),
            ("use_path_style", str(bool(config.get("use_path_style"))).lower()),
            ("created_at", disk.created_at),
        ]
    )


def show_mounts(items: Any) -> None:
    print_table(
        ["DISK", "NAME", "MOUNT PATH", "SUB PATH", "STATUS", "ERROR"],
        [[m.disk_id, m.name, m.mount_path, m.sub_path, m.mount_status, m.mount_error] for m in items],
    )


@app.command()
def create(
    name: str,
    bucket: str = typer.Option(..., "--bucket"),
    endpoint: str = typer.Option(
        ..., "--endpoint", help="The S3 endpoint URL, e.g. https://s3.eu-west-1.amazonaws.com"
    ),
    region: str | None = typer.Option(None, "--region"),
    path_style: bool = typer.Option(False, "--path-style", help="Path-style requests (MinIO, moto, Ceph)."),
    access_key: str = ACCESS_KEY,
    secret_key: str = SECRET_KEY,
    json_out: bool = JSON_OPTION,
) -> None:
    """Register a bucket as a disk (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)."""
    with api_errors(), client() as sdk:
        disk = sdk.disks.create(
            name,
            bucket=bucket,
            endpoint=endpoint,
            access_key=access_key,
            secret_key=secret_key,
            region=region,
            use_path_style=path_style,
        )
    emit(disk, json_out, show)


@app.command("ls")
def list_disks(json_out: bool = JSON_OPTION) -> None:
    """List your disks (never their credentials)."""
    with api_errors(), client() as sdk:
        disks = sdk.disks.list()
    emit(
        disks,
        json_out,
        lambda items: print_table(
            ["ID", "NAME", "BUCKET", "ENDPOINT", "CREATED"],
            [[d.id, d.name, d.config.get("bucket"), d.config.get("endpoint"), d.created_at] for d in items],
        ),
    )


@app.command()
def get(disk: str, json_out: bool = JSON_OPTION) -> None:
    """Show a disk, by id or name."""
    with api_errors(), client() as sdk:
        found = sdk.disks.get(disk)
    emit(found, json_out, show)


@app.command()
def rotate(
    disk: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY, json_out: bool = JSON_OPTION
) -> None:
    """Replace a disk's credentials (used by later mounts)."""
    with api_errors(), client() as sdk:
        found = sdk.disks.rotate_credentials(disk, access_key=access_key, secret_key=secret_key)
    emit(found, json_out, show)


@app.command("rm")
def delete(disk: str, json_out: bool = JSON_OPTION) -> None:
    """Delete a disk (refused while a sandbox holds it); the bucket's contents stay."""
    with api_errors(), client() as sdk:
        sdk.disks.delete(disk)
    emit({"id": disk, "deleted": True}, json_out, lambda _: typer.echo(f"deleted {disk}"))


@app.command()
def attach(
    sandbox: str,
    disk: str,
    mount_path: str,
    sub_path: str | None = typer.Option(None, "--sub-path", help="Mount only this folder of the bucket."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Mount DISK (id or name) at MOUNT_PATH in a running SANDBOX (id or name); waits until mounted or
    failed, and exits 1 with the reason when the mount failed."""
    with api_errors(), client() as sdk:
        mounted = resolve(sdk, sandbox).disks.attach(disk, mount_path, sub_path=sub_path)
    emit(mounted, json_out, lambda m: show_mounts([m]))
    if mounted.mount_status != "mounted":
        raise typer.Exit(1)


@app.command()
def mounts(sandbox: str, json_out: bool = JSON_OPTION) -> None:
    """The disks mounted in SANDBOX, with their status."""
    with api_errors(), client() as sdk:
        items = resolve(sdk, sandbox).disks.list()
    emit(items, json_out, show_mounts)


@app.command()
def detach(sandbox: str, disk_id: str, mount_path: str, json_out: bool = JSON_OPTION) -> None:
    """Unmount DISK_ID (the disk_… id) from MOUNT_PATH in SANDBOX."""
    with api_errors(), client() as sdk:
        found = resolve(sdk, sandbox)
        found.disks.detach(disk_id, mount_path)
    emit(
        {"sandbox_id": found.id, "disk_id": disk_id, "mount_path": mount_path, "detached": True},
        json_out,
        lambda _: typer.echo(f"detached {disk_id} from {mount_path}"),
    )
