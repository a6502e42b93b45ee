"""Client commands for what the API has and the first CLI left out: ``whoami``, ``shapes``, ``rootfs``,
``hosts``, ``metrics``, and on a sandbox ``egress``, ``resize``, ``set`` (ingress, auto-pause),
``bandwidth``, ``metrics``, ``boot-log``, ``audit``, ``link``, ``ssh-key`` and
``ps``/``logs``/``wait``/``kill`` (managed processes, which ``exec -d`` starts). Every one takes
``--json``; options may come before or after the sandbox's name."""

from __future__ import annotations

import signal
import sys
import time
from contextlib import closing
from itertools import islice
from typing import Any

import typer

from paddock_cli import sandbox
from paddock_cli.output import (
    JSON_OPTION,
    ExitCode,
    api_errors,
    client,
    emit,
    fail,
    plain,
    print_fields,
    print_json,
    print_table,
)


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
    rules: list[str] = typer.Argument(
        None, help="New rules (domain, IP or CIDR, optionally :port; '!IP' or '!CIDR' denies it)."
    ),
    clear: bool = typer.Option(False, "--clear", help="Remove every rule (everything allowed)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Show the sandbox's egress rules, or replace them with RULES."""
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
    on_idle: str = typer.Option(
        None, "--on-idle", help="What the idle pause does: pause (frozen) or hibernate (only the disk kept)."
    ),
    ingress_host_header: str = typer.Option(
        None, "--ingress-host-header", help='The Host its apps get (${PORT}: the port; "" clears it).'
    ),
    ingress_https_port: list[int] = typer.Option(
        None, "--ingress-https-port", help="A port whose app serves HTTPS itself (repeat; replaces the list)."
    ),
    no_ingress_https_ports: bool = typer.Option(
        False, "--no-ingress-https-ports", help="Reach every port in plain HTTP again."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Change a sandbox's settings (PATCH): ingress, the Host its apps get and its HTTPS ports,
    auto-pause and what it does."""
    with api_errors(), client() as sdk:
        info = sandbox.resolve(sdk, ref).patch(
            ingress_enabled=ingress,
            auto_pause_after_seconds=auto_pause,
            disable_auto_pause=True if no_auto_pause else None,
            on_idle=on_idle,
            ingress_host_header=ingress_host_header,
            ingress_https_ports=[] if no_ingress_https_ports else (ingress_https_port or None),
        )
    emit(info, json_out, sandbox.show)


def _process_rows(items: list[Any]) -> None:
    print_table(["id", "kind", "pid", "state"], [[p.process_id, p.kind, p.pid, p.state] for p in items])


def processes(ref: str, json_out: bool = JSON_OPTION) -> None:
    """The sandbox's managed processes."""
    with api_errors(), client() as sdk:
        items = sandbox.resolve(sdk, ref).processes.list()
    emit(items, json_out, _process_rows)


def kill_process(
    ref: str,
    process_id: str,
    signal_name: str = typer.Option(
        None, "--signal", "-s", help="Send this signal only (SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGUSR1 …)."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Kill a managed process (TERM, then KILL after 5 s), or send it one --signal."""
    with api_errors(), client() as sdk:
        processes = sandbox.resolve(sdk, ref).processes
        if signal_name:
            name = signal_name.upper()
            proc = processes.signal(process_id, name if name.startswith("SIG") else f"SIG{name}")
        else:
            proc = processes.kill(process_id)
    emit(proc, json_out, lambda p: _process_rows([p]))


def exit_code_of(proc: Any) -> int:
    """A finished process's exit status as a shell gives it: its code, or 128 + the signal's number."""
    if proc.exit_code is not None:
        return int(proc.exit_code) if 0 <= proc.exit_code <= 255 else 255
    try:
        return 128 + signal.Signals[proc.signal].value
    except (KeyError, TypeError):
        return 1


def wait_process(
    ref: str,
    process_id: str,
    timeout_s: float = typer.Option(None, "--timeout", help="Give up after this many seconds (exit 5)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Wait until a managed process has exited; exits with its exit code (128 + N after signal N)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with api_errors(), client() as sdk:
        processes = sandbox.resolve(sdk, ref).processes
        while True:
            left = 30.0 if deadline is None else min(30.0, deadline - time.monotonic())
            proc = processes.wait(process_id, timeout_ms=max(0, int(left * 1000)))
            if proc.leader_exited:
                break
            if deadline is not None and time.monotonic() >= deadline:
                emit(proc, json_out, lambda p: _process_rows([p]))
                raise fail(f"process {process_id} still running after {timeout_s:g} s", ExitCode.FAILED)
    emit(proc, json_out, lambda p: _process_rows([p]))
    raise typer.Exit(exit_code_of(proc))


def logs(
    ref: str,
    process_id: str,
    follow: bool = typer.Option(False, "--follow", "-f", help="Then follow the output until it exits."),
    json_out: bool = typer.Option(
        False,
        "--json",
        help="Print {process_id, stdout, stderr, exit_code} as JSON (after it exits with -f).",
    ),
) -> None:
    """A managed process's output the sandbox still holds: stdout here, stderr on stderr."""
    held: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    with api_errors(), client() as sdk:
        processes = sandbox.resolve(sdk, ref).processes
        proc = processes.get(process_id)
        exit_code = proc.exit_code if proc.leader_exited else None
        newest = int(proc.output.get("newest_seq") or 0)
        if follow or newest > 0:
            with closing(processes.connect(process_id)) as frames:
                for frame in frames:
                    if frame.get("type") == "data":
                        stream = "stderr" if frame.get("stream") == "stderr" else "stdout"
                        if json_out:
                            held[stream].append(frame["data"])
                        else:
                            out = sys.stderr if stream == "stderr" else sys.stdout
                            out.buffer.write(frame["data"])
                            out.flush()
                        if not follow and int(frame.get("seq") or 0) >= newest:
                            break
                    elif frame.get("type") == "exit":
                        exit_code = frame.get("exit_code")
                        break
                    elif frame.get("type") == "heartbeat" and not follow:
                        break  # the held output is replayed before any heartbeat
                    elif frame.get("type") == "error":
                        raise fail(str(frame.get("error")), ExitCode.API_ERROR)
    if json_out:
        text = {k: b"".join(v).decode("utf-8", "replace") for k, v in held.items()}
        print_json({"process_id": process_id, **text, "exit_code": exit_code})


def bandwidth(
    ref: str,
    recharge: int = typer.Option(None, "--recharge", min=1, help="Add this many bytes to the quota."),
    json_out: bool = JSON_OPTION,
) -> None:
    """The sandbox's egress bandwidth: quota, used and remaining bytes (-1: unmetered)."""
    with api_errors(), client() as sdk:
        found = sandbox.resolve(sdk, ref)
        now = found.recharge_bandwidth(recharge) if recharge else found.bandwidth()
    emit(now, json_out, lambda b: print_fields([(k, v) for k, v in plain(b).items()]))


def _mib(value: int) -> str:
    return f"{value / (1 << 20):.0f}"


def sandbox_metrics(
    ref: str,
    window: int = typer.Option(
        300, "--window", min=1, max=86400, help="Seconds back (raw samples up to an hour, then minutes)."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """The sandbox's CPU, memory, disk and network use, one sample a line, oldest first."""
    with api_errors(), client() as sdk:
        found = sandbox.resolve(sdk, ref).metrics(window_s=window)

    def show(data: Any) -> None:
        if not data.samples:
            typer.echo(f"no samples in the last {window} s (one is taken every {data.interval_s:g} s)")
            return
        print_table(
            ["AT", "CPU %", "MEM MIB", "MEM LIMIT", "DISK MIB", "DISK LIMIT", "RX BYTES", "TX BYTES"],
            [
                [
                    sample.at,
                    f"{sample.cpu_pct:.1f}",
                    _mib(sample.mem_used_bytes),
                    _mib(sample.mem_limit_bytes),
                    _mib(sample.disk_used_bytes),
                    _mib(sample.disk_limit_bytes),
                    sample.net_rx_bytes,
                    sample.net_tx_bytes,
                ]
                for sample in data.samples
            ],
        )

    emit(found, json_out, show)


def boot_log(
    ref: str,
    source: str = typer.Option("boot", "--source", help="boot, or guest: a VM's console."),
    tail: int = typer.Option(100, "--tail", min=1, max=1000, help="The last N lines."),
    json_out: bool = JSON_OPTION,
) -> None:
    """The sandbox's boot log (or a VM's console with --source guest), its last lines."""
    with api_errors(), client() as sdk:
        found = sandbox.resolve(sdk, ref).logs(source=source, tail=tail)
    emit(found, json_out, lambda data: typer.echo("\n".join(data.lines)))


def audit(
    ref: str,
    kinds: list[str] = typer.Option(
        [],
        "--kind",
        help="Only these kinds (api, command, file, process, egress, dropped); repeat or comma-separate.",
    ),
    since: str | None = typer.Option(None, "--since", help="From this RFC 3339 time, with its zone."),
    tail: int = typer.Option(
        50, "--tail", min=1, max=100_000, help="The newest N events, shown oldest first."
    ),
    every: bool = typer.Option(
        False, "--all", help="Every event (from --since), instead of the newest --tail."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """The sandbox's audit trail: the calls on it, what ran in it, the files moved and its egress
    attempts, with who made each (docs/audit.md). Read by the account's key; kept after it is destroyed."""
    from paddock_core.audit_text import describe  # the table's words, shared with E2B's logs routes

    wanted = [kind for item in kinds for kind in item.split(",") if kind]
    with api_errors(), client() as sdk:
        found = sandbox.resolve(sdk, ref)
        if every:
            events = list(found.audit(kinds=wanted, since=since))
        else:
            newest = found.audit(kinds=wanted, since=since, newest_first=True, page_size=min(tail, 1000))
            events = list(islice(newest, tail))[::-1]

    def show(rows: list[Any]) -> None:
        if not rows:
            typer.echo("no events")
            return
        print_table(
            ["AT", "KIND", "ACTOR", "WHAT"],
            [[e.at, e.kind, e.actor or "–", describe(e.kind, e.detail)[0]] for e in rows],
        )

    emit(events, json_out, show)  # --json: each event as the API sends it (``plain`` folds ``extra`` in)


def link(
    ref: str,
    path: str = typer.Argument(..., help="An absolute path inside the sandbox."),
    write: bool = typer.Option(False, "--write", help="A link that writes (PUT) rather than reads (GET)."),
    expires_in: int = typer.Option(3600, "--expires-in", min=1, max=7 * 86400, help="Its life, in seconds."),
    json_out: bool = JSON_OPTION,
) -> None:
    """A link that reads (or with --write writes) one file of the sandbox without a key until it
    expires: `curl -o out "$(paddock sandbox link demo /root/out)"` (docs/files.md)."""
    with api_errors(), client() as sdk:
        files = sandbox.resolve(sdk, ref).files
        url = (files.upload_url if write else files.download_url)(path, expires_in_s=expires_in)
    emit({"url": url, "method": "PUT" if write else "GET"}, json_out, lambda d: typer.echo(d["url"]))


def account_metrics(json_out: bool = JSON_OPTION) -> None:
    """The account's use now, summed over its running sandboxes."""
    with api_errors(), client() as sdk:
        data = sdk.metrics()
    emit(data, json_out, lambda d: print_fields([(k, v) for k, v in plain(d).items()]))


def ssh_key(
    ref: str,
    keys: list[str] = typer.Argument(..., help="OpenSSH public keys (`ssh-ed25519 AAAA… comment`)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Add SSH public keys to the sandbox (for `ssh -p 2222 NAME@host`)."""
    with api_errors(), client() as sdk:
        count = sandbox.resolve(sdk, ref).add_ssh_keys(keys)
    emit({"count": count}, json_out, lambda d: typer.echo(f"{d['count']} keys"))


def hosts(json_out: bool = JSON_OPTION) -> None:
    """The hosts sandboxes are placed on: status, free memory, sandboxes and labels."""
    with api_errors(), client() as sdk:
        items = sdk.hosts()
    emit(
        items,
        json_out,
        lambda rows: print_table(
            ["ID", "STATUS", "FREE MIB", "SANDBOXES", "LABELS"],
            [
                [
                    h.id,
                    h.status,
                    h.free_mib,
                    h.vm_count,
                    ",".join(f"{k}={v}" for k, v in sorted(h.labels.items())),
                ]
                for h in rows
            ],
        ),
    )


# ``paddock sandbox``'s commands from this module, after sandbox.py's own: main.py imports this module to
# run ``paddock sandbox …``, and ``whoami``, ``shapes`` and ``rootfs`` from here by name.
sandbox.app.command()(egress)
sandbox.app.command()(resize)
sandbox.app.command("set")(set_settings)
sandbox.app.command("ps")(processes)
sandbox.app.command("kill")(kill_process)
sandbox.app.command("wait")(wait_process)
sandbox.app.command("logs")(logs)
sandbox.app.command()(bandwidth)
sandbox.app.command("metrics")(sandbox_metrics)
sandbox.app.command("boot-log")(boot_log)
sandbox.app.command("audit")(audit)
sandbox.app.command("link")(link)
sandbox.app.command("ssh-key")(ssh_key)
