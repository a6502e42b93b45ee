"""Client commands for what the API has and the first CLI left out: ``whoami``, ``shapes``, ``rootfs``,
and on a sandbox ``egress``, ``resize``, ``set`` (ingress, auto-pause) and ``ps``/``kill`` (managed
processes). Every one takes ``--json``; options may come before or after the sandbox's name."""

from __future__ import annotations

from typing import Any

import typer

from paddock_cli import sandbox
from paddock_cli.output import JSON_OPTION, api_errors, client, emit, print_fields, print_table


def whoami(json_out: bool = JSON_OPTION) -> None:
    """Who the API key belongs to, what runs, and the credits left."""
    with api_errors(), client() as sdk:
        data = sdk.whoami()
    emit(data, json_out, lambda d: print_fields([(k, v) for k, v in d.items()]))


def shapes(json_out: bool = JSON_OPTION) -> None:
    """The sandbox shapes (vCPU, memory, default disk, price)."""
    with api_errors(), client() as sdk:
        items = sdk.shapes()

    def table(rows: list[dict[str, Any]]) -> None:
        columns = [
            c
            for c in ("id", "vcpu", "mem_mib", "default_disk_mib", "price_per_hour")
            if rows and c in rows[0]
        ]
        print_table(columns, [[row.get(c) for c in columns] for row in rows])

    emit(items, json_out, table)


def rootfs(json_out: bool = JSON_OPTION) -> None:
    """The root images a sandbox can boot, and the default."""
    with api_errors(), client() as sdk:
        data = sdk.rootfs()
    emit(data, json_out, lambda d: print_fields([(k, v) for k, v in d.items()]))


def egress(
    ref: str,
    rules: list[str] = typer.Argument(None, help="New rules (domain, IP or CIDR, optionally :port)."),
    clear: bool = typer.Option(False, "--clear", help="Remove every rule (no egress)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Show the sandbox's egress allowlist, or replace it with RULES."""
    with api_errors(), client() as sdk:
        sb = sandbox.resolve(sdk, ref)
        now = sb.set_egress(rules or []) if (rules or clear) else sb.egress()
    emit(now, json_out, lambda items: typer.echo("\n".join(items) or "(none)"))


def resize(
    ref: str,
    disk_mib: int = typer.Argument(..., help="The new disk size in MiB."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Grow the sandbox's disk."""
    with api_errors(), client() as sdk:
        size = sandbox.resolve(sdk, ref).resize(disk_mib)
    emit({"disk_mib": size}, json_out, lambda d: typer.echo(f"disk_mib {d['disk_mib']}"))


def set_settings(
    ref: str,
    ingress: bool = typer.Option(None, "--ingress/--no-ingress", help="Turn the ingress URL on or off."),
    auto_pause: int = typer.Option(None, "--auto-pause", help="Pause after this many idle seconds."),
    no_auto_pause: bool = typer.Option(False, "--no-auto-pause", help="Never pause for idleness."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Change a sandbox's settings (PATCH): ingress and auto-pause."""
    with api_errors(), client() as sdk:
        info = sandbox.resolve(sdk, ref).patch(
            ingress_enabled=ingress,
            auto_pause_after_seconds=auto_pause,
            disable_auto_pause=True if no_auto_pause else None,
        )
    emit(info, json_out, sandbox.show)


def _process_rows(items: list[Any]) -> None:
    print_table(["id", "kind", "pid", "state"], [[p.process_id, p.kind, p.pid, p.state] for p in items])


def processes(ref: str, json_out: bool = JSON_OPTION) -> None:
    """The sandbox's managed processes."""
    with api_errors(), client() as sdk:
        items = sandbox.resolve(sdk, ref).processes.list()
    emit(items, json_out, _process_rows)


def kill_process(ref: str, process_id: str, json_out: bool = JSON_OPTION) -> None:
    """Kill a managed process (TERM, then KILL after 5 s)."""
    with api_errors(), client() as sdk:
        proc = sandbox.resolve(sdk, ref).processes.kill(process_id)
    emit(proc, json_out, lambda p: _process_rows([p]))


# ``paddock sandbox``'s commands from this module, after sandbox.py's own: main.py imports this module to
# run ``paddock sandbox …``, and ``whoami``, ``shapes`` and ``rootfs`` from here by name.
sandbox.app.command()(egress)
sandbox.app.command()(resize)
sandbox.app.command("set")(set_settings)
sandbox.app.command("ps")(processes)
sandbox.app.command("kill")(kill_process)
