"""The Markdown table written next to the JSON: the headline ratios first, then the absolute (noisy) numbers."""

from __future__ import annotations

import math
from typing import Any

from bench import desktop_bench, isolation_bench

OP_LABELS = {
    "create": "create → running",
    "first_exec": "first exec `true` of a new sandbox",
    "exec": "exec `true` round trip",
    "first_frame": "first stream frame (`echo`)",
    "file_1mb": "file write + read, 1 MB",
    "file_big": "file write + read, {big} MB",
    "pause": "pause",
    "resume": "resume",
    "fork": "fork (source holds {big} MB)",
    "destroy": "destroy → destroyed",
    "destroy_answer": "destroy, until the API answers `destroying`",
}


def num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def spread(stats: dict[str, Any] | None) -> str:
    if not stats or not stats.get("n"):
        return "–"
    return f"{num(stats['p50'])} / {num(stats['p90'])} / {num(stats['p99'])} (n={stats['n']})"


def ratio(cost: float | None, floor: float | None) -> str:
    if not cost or not floor or math.isnan(cost) or math.isnan(floor):
        return "–"
    return f"{cost / floor:.1f}×"


def p50(stats: dict[str, Any] | None) -> float | None:
    return stats.get("p50") if stats and stats.get("n") else None


def fork_labels(forks: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The fork section's rows in order: settled sources by size, then the fresh-write and fresh-files
    ones."""
    if not forks:
        return []
    rows = [
        (f"fork_settled_{size}", f"fork, source holds {size:,} MB (settled)") for size in forks["sizes_mib"]
    ]
    rows.append(
        (f"fork_fresh_{forks['fresh_mib']}", f"fork right after writing {forks['fresh_mib']} MB (fresh)")
    )
    if forks.get("fresh_files"):
        files = forks["fresh_files"]
        rows.append((f"fork_files_{files}", f"fork right after creating {files:,} files (fresh)"))
    return [(op, label) for op, label in rows if forks.get(op)]


def first_stop(dens: dict[str, Any]) -> str:
    memory, scheduler = dens.get("fit_by_memory_extrapolated"), dens.get("fit_by_scheduler")
    if not memory or not scheduler:
        return "–"
    if scheduler <= memory:
        return (
            f"the scheduler's memory reservation, at {scheduler} sandboxes; memory itself would allow "
            f"~{memory:,} (extrapolated; other limits, such as the addresses in the host's subnet, come first)"
        )
    return f"memory, at ~{memory} sandboxes (the scheduler would allow {scheduler})"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    sections = results.get("sections", {})
    runtime = m.get("paddock_runtime") or "runc"
    agent_ran = f"Paddock's host agent ran on **{m['paddock_runtime']}**." if m.get("paddock_runtime") else ""
    life = sections.get("lifecycle", {})
    big = results.get("big_file_mib", 100)
    labels = {op: label.format(big=big) for op, label in OP_LABELS.items()}
    floor_name = runtime if runtime in life else "runc"
    out = [
        f"# Paddock benchmark, {results['started_at']} ({results['mode']})",
        "",
        f"- Machine: {m['cpu']} × {m['cpus']} CPUs, {m['mem_total_mib']:,} MiB RAM, kernel {m['kernel']}, "
        f"{m.get('os') or '?'}, Python {m['python']}",
        f"- Runtimes: {m.get('runc') or 'runc missing'}; {m.get('crun') or 'crun missing'}; "
        f"{m.get('podman') or 'podman missing'}; {m.get('wrk') or 'wrk missing'}. {agent_ran}",
        f"- Git: `{m['git_sha']}`. Load average at start {m['load_average_start']}, "
        f"at end {m.get('load_average_end')}.",
        f"- {results['runs']} recorded runs per operation after {results['warmup']} warm-up rounds "
        f"(exec: the first command of each new sandbox apart, then {results.get('execs_per_round', 3)} per "
        "round); times in ms as p50 / p90 / p99.",
        "- **Absolute numbers are noisy**: a shared 2-vCPU VM where other work may run at the same time. "
        "The headline is the ratio against the floor measured in the same run.",
        "",
        "## Headline: Paddock against the floor, same run",
        "",
        "`× floor` is Paddock's cost per operation divided by the floor's (for rates: the floor's rate "
        "divided by Paddock's); 1.0× is the floor.",
        "",
        "| measurement | Paddock | floor | × floor |",
        "|---|---|---|---|",
    ]
    paddock_life, floor_life = life.get("paddock", {}), life.get(floor_name, {})
    for op, label in labels.items():
        a, b = p50(paddock_life.get(op)), p50(floor_life.get(op))
        if a is None or b is None:
            continue
        out.append(
            f"| {label} (p50) | {num(a)} ms | {num(b)} ms (raw {floor_name} + overlay) | {ratio(a, b)} |"
        )
    thr = sections.get("throughput")
    if thr:
        a, b = thr["paddock"]["rps"], thr["floor"]["rps"]
        out.append(
            f"| `GET /v1/sandboxes/{{id}}` | {num(a)} req/s | {num(b)} req/s (bare Starlette) | {ratio(b, a)} |"
        )
    hooks = sections.get("webhooks")
    if hooks:
        a, b = hooks["burst"]["rate"], hooks["floor_lanes"]["rate"]
        out.append(
            f"| webhook deliveries (burst) | {num(a)} /s | {num(b)} /s (bare POSTs, "
            f"{hooks['concurrency']} lanes) | {ratio(b, a)} |"
        )
        a, b = hooks["steady"].get("p99"), hooks["floor_1_lane"].get("p99")
        out.append(
            f"| webhook event → 2xx (p99) | {num(a)} ms | {num(b)} ms (one bare POST) | {ratio(a, b)} |"
        )
    gw = sections.get("gateway")
    if gw:
        a, b = gw["quote"]["paddock"]["p50"], gw["quote"]["floor"]["p50"]
        out.append(
            f"| gateway quote (p50) | {num(a)} ms | {num(b)} ms (bare endpoint, same 402) | {ratio(a, b)} |"
        )
        a, b = gw["verify"]["paddock"]["per_second"], gw["verify"]["floor"]["per_second"]
        out.append(
            f"| signed-request verifications per core | {num(a)} /s | {num(b)} /s (raw ecrecover, "
            f"{gw['verify']['backend']}) | {ratio(b, a)} |"
        )
    forks = sections.get("fork")
    boot_floor = p50(floor_life.get("create"))
    for op, label in fork_labels(forks):
        a = p50(forks.get(op))
        out.append(
            f"| {label} (p50) | {num(a)} ms | {num(boot_floor)} ms (raw {floor_name} create, no copy) | "
            f"{ratio(a, boot_floor)} |"
        )
    dens = sections.get("density")
    if dens:
        out.append(
            f"| host memory per idle sandbox (accounted) | {num(dens['host_mib_per_sandbox'], 2)} MiB | – | – |"
        )

    if life:
        systems = [s for s in ("paddock", "hostagent", "runc", "crun", "podman") if s in life]
        names = {
            "paddock": "Paddock (API)",
            "hostagent": "host agent alone",
            "runc": "raw runc",
            "crun": "raw crun",
            "podman": "podman --rootfs",
        }
        out += [
            "",
            "## Sandbox lifecycle (ms, p50 / p90 / p99)",
            "",
            "| operation | "
            + " | ".join(names[s] for s in systems)
            + f" | Paddock × {floor_name} | host agent × {floor_name} | podman × {floor_name} |",
            "|---|" + "---|" * (len(systems) + 3),
        ]
        for op, label in labels.items():
            cells = [spread(life[s].get(op)) for s in systems]
            floor_p50 = p50(floor_life.get(op))
            ratios = [
                ratio(p50(life.get(s, {}).get(op)), floor_p50) for s in ("paddock", "hostagent", "podman")
            ]
            out.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
        split = [
            f"{names[s]} {num(p50(life[s].get('file_big_write')))} / {num(p50(life[s].get('file_big_read')))}"
            for s in systems
            if life[s].get("file_big_write")
        ]
        if split:
            out += ["", f"{big} MB file, write / read separately (p50 ms): " + "; ".join(split) + "."]
        out += [
            "",
            "Paddock: the SDK against a control plane + host agent on loopback (shape s-1vcpu-256mb, 2 GiB disk "
            "from the warm pool, which refills untimed between creates and forks); includes auth, the database, "
            "scheduling, the host agent's netns/veth/nft, the overlay disk on a loop device and the guest agent. "
            "Host agent alone: the same round on the agent's internal API (what the control plane calls); "
            "Paddock minus this column is the control plane's share. "
            "Floor: `runc`/`crun` with an overlay mount of the same image and `run -d`, `exec`, `pause`, `resume`, "
            "`delete -f`; files via `exec sh -c 'cat > F'` / `exec cat F`; fork = pause, copy the upper dir, "
            "resume, mount and `run -d` the copy. podman: `run -d --rootfs IMAGE:O --network none`; no live fork "
            "without CRIU. Destroy rows count both the sandbox and its fork.",
        ]
    if forks:
        out += [
            "",
            "## Fork against what the source holds (ms, p50 / p90 / p99)",
            "",
            f"| fork → running through the API | Paddock | floor: raw {floor_name} create → running | × floor |",
            "|---|---|---|---|",
        ]
        for op, label in fork_labels(forks):
            a = p50(forks.get(op))
            out.append(f"| {label} | {spread(forks.get(op))} | {num(boot_floor)} | {ratio(a, boot_floor)} |")
        out += [
            "",
            "Settled: the source's data was written, synced and the source forked once, all untimed, so "
            "the host had written it back, as the kernel does by itself within ~30 s of a write. Every "
            f"source has the same disk ({forks.get('disk_mib', '?')} MiB) and the timed forks alternate "
            "between them. Fresh: a new file written right before each fork, still "
            "dirty in the page cache, so that fork also pays writing it to the host disk. The disk image is "
            "cloned (FICLONE), never copied; the floor is what booting any new container costs here.",
        ]
    if dens:
        out += [
            "",
            "## Density (idle sandboxes, s-1vcpu-256mb, 2 GiB disk)",
            "",
            "| measurement | value |",
            "|---|---|",
            f"| sandboxes created | {dens['created']} (stopped by: {dens['stop_reason']}) |",
            f"| host memory per sandbox, accounted (cgroup + kernel + control plane + host agent) | "
            f"{num(dens['host_mib_per_sandbox'], 2)} MiB |",
            f"| unreclaimable kernel memory growth per sandbox (slab, page tables, stacks) | "
            f"{num(dens.get('kernel_mib_per_sandbox'), 2)} MiB |",
            f"| cross-check: MemAvailable fall ÷ count (noisy: the whole machine moves it) | "
            f"{num(dens.get('mem_available_fall_mib_per_sandbox'), 2)} MiB |",
            f"| control plane RSS growth per sandbox | {num(dens['controlplane_mib_per_sandbox'], 2)} MiB "
            f"({num(dens['controlplane_rss_mib']['start'])} → {num(dens['controlplane_rss_mib']['end'])} MiB) |",
            f"| host agent RSS growth per sandbox | {num(dens['hostagent_mib_per_sandbox'], 2)} MiB "
            f"({num(dens['hostagent_rss_mib']['start'])} → {num(dens['hostagent_rss_mib']['end'])} MiB) |",
            f"| sandbox memory cgroup usage (p50 / p90 / p99) | {spread(dens['cgroup_usage_mib'])} MiB |",
            f"| of which anonymous (rss) | {spread(dens['cgroup_rss_mib'])} MiB |",
            f"| guest agent RSS | {spread(dens['guest_agent_rss_mib'])} MiB |",
            f"| would fit by memory (MemAvailable at start ÷ accounted per sandbox, extrapolated) | "
            f"{num(dens['fit_by_memory_extrapolated'])} |",
            f"| would fit by the scheduler (host schedulable {num(dens['host_total_mib'])} MiB ÷ 256 MiB) | "
            f"{num(dens['fit_by_scheduler'])} |",
            f"| first stop | {first_stop(dens)} |",
            f"| create, back to back (warm pool drained) | {spread(dens['timings'].get('create (back to back)'))} ms |",
            f"| destroy, until the API answers (reclaim goes on in the background) | "
            f"{spread(dens['timings'].get('destroy'))} ms |",
        ]
        if "reclaim_all_s" in dens:
            out.append(
                f"| all {dens['created']:,} destroyed, until the host holds none | {dens['reclaim_all_s']:.1f} s |"
            )
        for mark, stats in dens.get("create_at_live", {}).items():
            how = "created and destroyed beside the first" if int(mark) == 1 else "the creates just before"
            out.append(f"| create at {int(mark):,} live ({how}) | {spread(stats)} ms |")
        for mark, stats in dens.get("create_spaced_at_live", {}).items():
            out.append(
                f"| create at {int(mark):,} live, one at a time, pools refilled between | {spread(stats)} ms |"
            )
        for label, stats in dens["timings"].items():
            if label.startswith("exec"):
                out.append(f"| {label} | {spread(stats)} ms |")
        if "hostagent_fds" in dens:
            fds, loops = dens["hostagent_fds"], dens["loop_devices"]
            out.append(f"| host agent open fds, start → end | {fds['start']:,} → {fds['end']:,} |")
            out.append(f"| loop devices on the host, start → end | {loops['start']:,} → {loops['end']:,} |")
            out.append(
                f"| overcommit of the bench's host agent, memory / disk | {dens.get('overcommit', 1)}× / "
                f"{dens.get('disk_overcommit', 1)}× |"
            )
    if thr:
        out += [
            "",
            f"## Control plane throughput (wrk, 1 thread, {thr['paddock']['connections']} connections, "
            f"{thr['paddock']['seconds']} s)",
            "",
            "| target | req/s | latency p50 / p90 / p99 (ms) |",
            "|---|---|---|",
        ]
        for name, row in (
            ("Paddock `GET /v1/sandboxes/{id}` (key auth, database read)", thr["paddock"]),
            (
                "Paddock `GET /healthz` (same process: FastAPI, middleware, request log; no auth, no database)",
                thr.get("controlplane_healthz"),
            ),
            ("floor: bare Starlette, same response bytes", thr["floor"]),
        ):
            if row is None:
                continue
            lat = row["latency_ms"]
            out.append(
                f"| {name} | {num(row['rps'])} | {num(lat.get('p50'), 2)} / {num(lat.get('p90'), 2)} / "
                f"{num(lat.get('p99'), 2)} |"
            )
    if hooks:
        out += [
            "",
            f"## Webhook delivery to a loopback receiver (SQLite outbox, {hooks['concurrency']} in flight)",
            "",
            "| scenario | n | deliveries/s | p50 ms | p99 ms |",
            "|---|---|---|---|---|",
        ]
        for name, row in (
            ("floor: bare aiohttp POST, 1 lane", hooks["floor_1_lane"]),
            (f"floor: bare aiohttp POST, {hooks['concurrency']} lanes", hooks["floor_lanes"]),
            ("Paddock burst (emitted first, then drained)", hooks["burst"]),
            (
                f"Paddock steady {num(hooks['steady_rate'])}/s (event committed → 2xx recorded)",
                hooks["steady"],
            ),
        ):
            out.append(
                f"| {name} | {row['n']} | {num(row['rate'])} | {num(row.get('p50'))} | {num(row.get('p99'))} |"
            )
    if gw:
        q, v = gw["quote"], gw["verify"]
        out += [
            "",
            "## Gateway",
            "",
            "| measurement | Paddock | floor |",
            "|---|---|---|",
            f"| quote: `POST /agent/deploy` unpaid → 402 (ms p50 / p90 / p99) | {spread(q['paddock'])} | "
            f"{spread(q['floor'])} |",
            f"| verifications per second, one core | {num(v['paddock']['per_second'])} "
            f"({num(v['paddock']['ms']['p50'], 2)} ms each) | {num(v['floor']['per_second'])} "
            f"({num(v['floor']['ms']['p50'], 2)} ms each) |",
            "",
            f"Quote: a real `paddock gateway` process (SQLite), signed wallet headers made before the clock starts; "
            f"the path checks the signature, burns the nonce, checks the name and prices. Verification: "
            f"`verify_headers` (syntax, window, EIP-191 recover) against recovering the key from the same hash; "
            f"eth_keys backend: {v['backend']}.",
        ]
    vm = sections.get("vm")
    if vm:  # bench/vm_bench.py: floors and the tier's operations, one table
        out += [
            "",
            f"## VM tier (QEMU, {vm['accel']}; {vm['shape']['vcpu']} vCPU, {vm['shape']['mem_mib']} MiB)",
            "",
            "| operation | n | p50 ms | p90 ms | max ms |",
            "|---|---|---|---|---|",
        ]
        for op, row in vm["ops"].items():
            out.append(f"| {op} | {row['n']} | {num(row['p50'])} | {num(row['p90'])} | {num(row['max'])} |")
    isolation = sections.get("isolation")
    if isolation:  # bench/isolation_bench.py: each tier against its raw runtime
        out += ["", *isolation_bench.markdown(isolation).rstrip("\n").splitlines()]
    desktop = sections.get("desktop")
    if desktop:  # bench/desktop_bench.py: computer use against its exec and in-sandbox floors
        out += ["", *desktop_bench.table(desktop).splitlines()]
    if results.get("errors"):
        out += ["", "## Sections that failed", ""]
        for name, text in results["errors"].items():
            out += [f"- **{name}**:", "", "```", text.strip(), "```"]
    return "\n".join(out) + "\n"
