"""``paddock template …``: build a Dockerfile into an image sandboxes boot (§11.13).

``build`` submits the Dockerfile and follows the build log as it runs: buildah's own lines, each
prefixed by its attempt, and a one-line progress display (``STEP n/m``) on a terminal. It exits 0 when
the template is ready and 5 when the build failed, so scripts can chain ``paddock sandbox create
--rootfs NAME``. ``--context DIR`` sends DIR's regular files (a gzip'd tar) for ``COPY``/``ADD``.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tarfile
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
    print_json,
    print_table,
)

app = typer.Typer(no_args_is_help=True, help=LAZY_GROUPS["template"].help)
STEP = re.compile(r"^STEP (\d+)/(\d+): (.*)$")


def mib(size_bytes: int) -> str:
    """A size in MiB, one decimal (``1536.0``): bytes were unreadable at a glance."""
    return f"{size_bytes / 1048576:.1f}" if size_bytes else "-"


def _short(error: str | None) -> str:
    """A failure on one line of a table: its first line, at most 80 characters (``get`` shows it whole)."""
    if not error:
        return ""
    line = error.strip().splitlines()[0] if error.strip() else ""
    return line[:77] + "..." if len(line) > 80 else line


def show(template: Any) -> None:
    print_fields(
        [
            ("id", template.id),
            ("name", template.name),
            ("base", template.base),
            ("status", template.status),
            ("size_mib", mib(template.ext4_size_bytes)),
            ("created_at", template.created_at),
            ("built_at", template.built_at),
            ("error", template.error),
        ]
    )
    if template.dockerfile:
        typer.echo("\n" + template.dockerfile.rstrip("\n"))


def _follow(sdk: Any, ref: str, attempt: int | None, json_out: bool) -> str | None:
    """Prints the log as it comes; returns the build's final status (None if the stream ended first)."""
    progress = sys.stderr.isatty() and not json_out
    final: str | None = None
    for frame in sdk.templates.logs(ref, attempt=attempt, follow=True):
        if json_out:
            print_json({k: v for k, v in vars(frame).items() if v not in (None, False, {})})
        elif frame.final:
            final = frame.status
            continue
        else:
            line = frame.line or ""
            step = STEP.match(line)
            if progress and step:
                # The progress display: which step of how many, on stderr, overwritten in place.
                sys.stderr.write(f"\r\x1b[K[{step.group(1)}/{step.group(2)}] {step.group(3)[:70]}\n")
            else:
                typer.echo(f"#{frame.attempt} {line}")
        if frame.final:
            final = frame.status
    return final


def context_tar(directory: Path) -> bytes:
    """``directory``'s regular files and directories as a gzip'd tar, paths relative to it (links and
    special files are left out: the platform accepts neither)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for root, dirs, files in os.walk(directory):  # never follows links into other directories
            dirs.sort()
            for entry in [*dirs, *sorted(files)]:
                path = Path(root) / entry
                if path.is_symlink() or not (path.is_file() or path.is_dir()):
                    continue
                archive.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    return buffer.getvalue()


@app.command()
def build(
    file: Path = typer.Option(Path("Dockerfile"), "-f", "--file", help="The Dockerfile ('-' reads stdin)."),
    name: str = typer.Option(..., "--name", help="The template's name (sandboxes boot it by this name)."),
    base: str | None = typer.Option(None, "--base", help="The catalog image FROM base means."),
    context: Path | None = typer.Option(
        None, "--context", help="A directory whose files COPY/ADD read (sent as a tar).", file_okay=False
    ),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Stream the build log until it ends."),
    rebuild: bool = typer.Option(
        False, "--rebuild", help="Build an existing template's name again; the old image boots until ready."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Submit a Dockerfile and follow its build; exit 0 once ready, 5 if it failed."""
    try:
        dockerfile = sys.stdin.read() if str(file) == "-" else file.read_text()
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc.strerror}", ExitCode.USAGE) from exc
    try:
        archive = context_tar(context) if context is not None else None
    except OSError as exc:
        raise fail(f"cannot read {context}: {exc.strerror}", ExitCode.USAGE) from exc
    with api_errors(), client() as sdk:
        template = sdk.templates.create(name, dockerfile, base=base, context=archive, rebuild=rebuild)
        if not follow:
            emit(template, json_out, show)
            return
        if not json_out:
            typer.echo(f"building {template.name} ({template.id}) from {template.base}", err=True)
        final = _follow(sdk, template.id, None, json_out)
        template = sdk.templates.get(template.id)
    if not json_out:
        typer.echo(f"{template.name}: {template.status}", err=True)
    if (final or template.status) != "ready":
        raise typer.Exit(ExitCode.FAILED)


@app.command("ls")
def list_templates(json_out: bool = JSON_OPTION) -> None:
    """List your templates."""
    with api_errors(), client() as sdk:
        items = sdk.templates.list()
    emit(
        items,
        json_out,
        lambda rows: print_table(
            ["ID", "NAME", "BASE", "STATUS", "SIZE_MIB", "BUILT", "ERROR"],
            [
                [t.id, t.name, t.base, t.status, mib(t.ext4_size_bytes), t.built_at, _short(t.error)]
                for t in rows
            ],
        ),
    )


@app.command()
def get(
    ref: str = typer.Argument(..., help="Template id or name."),
    dockerfile: bool = typer.Option(False, "--dockerfile", help="Also print the Dockerfile."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Show one template."""
    with api_errors(), client() as sdk:
        template = sdk.templates.get(ref, include_dockerfile=dockerfile)
    emit(template, json_out, show)


@app.command()
def rm(ref: str = typer.Argument(..., help="Template id or name."), json_out: bool = JSON_OPTION) -> None:
    """Delete a template (a running build is cancelled; sandboxes booted from it keep running)."""
    with api_errors(), client() as sdk:
        sdk.templates.delete(ref)
    emit({"id": ref, "deleted": True}, json_out, lambda _: typer.echo(f"deleted {ref}", err=True))


@app.command()
def logs(
    ref: str = typer.Argument(..., help="Template id or name."),
    attempt: int | None = typer.Option(None, "--attempt", min=1, help="Only this attempt."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep streaming until the build ends."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Print the build log (every attempt unless --attempt)."""
    with api_errors(), client() as sdk:
        if follow:
            final = _follow(sdk, ref, attempt, json_out)
            if final and not json_out:
                typer.echo(f"build {final}", err=True)
            return
        for frame in sdk.templates.logs(ref, attempt=attempt):
            if json_out:
                print_json({k: v for k, v in vars(frame).items() if v not in (None, False, {})})
            elif frame.final:
                typer.echo(f"build {frame.status}", err=True)
            else:
                typer.echo(f"#{frame.attempt} {frame.line}")
