"""Issue #36's goals beside their floors, from one ``bench.run`` results dict: the report's wave-3 table.

Each goal is one row: what the run measured, its floor from the same run (the raw runtime, the peer
engine, the small fleet, the count of 1: whatever the row's module measures beside it), their ratio,
whether the goal is met, and the box's load (1-minute average) when the row ran. A section that did not
run leaves its rows in the table as "not run" (or "failed" when it broke), never out of it: the table
always says which goals this run holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import fleet_sim, pools_bench
from bench.fork_after_write import BIG_MIB, FRESH_FILES, FRESH_MIB, SETTLED_MIB, SMALL_MIB

TITLE = "## Wave 3 (#36): goals beside their floors"
#: bench/run.py's sections whose rows this table holds.
SECTIONS = (
    "fork_after_write",
    "pools",
    "density",
    "vm",
    "desktop",
    "templates",
    "pg_mode",
    "fleet",
    "heartbeat",
)
FORK_GOAL_MS = 50.0
FORK_RATIO_GOAL = 1.5
CREATE_GOAL_MS = 15.0
SUSTAINED_GOAL_PER_S = 100.0
VM_GOAL_MS = 1000.0
SCREENSHOT_GOAL_MS = 100.0
CLICK_GOAL_MS = 250.0
BUILD_RATIO_GOAL = 1.2
CACHED_GOAL_S = 2.0
PG_GET_GOAL = 4000.0
PG_BURST_GOAL = 1000.0
PG_P99_GOAL_MS = 20.0
PG_CREATES_GOAL = 100.0
GROWTH_P50_GOAL = 1.3
GROWTH_P90_GOAL = 2.0
FLEET_GOAL = 1.5


@dataclass(frozen=True)
class Cells:
    value: str
    floor: str = "–"
    ratio: str = "–"
    met: str = "–"
    load: str = "–"


#: A goal's label and how its cells are read from its section's results (and the whole run's).
Goal = tuple[str, Callable[[Any, dict[str, Any]], Cells]]


def _n(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.{digits}f}"


def _x(value: float, floor: float) -> str:
    return f"{value / floor:.2f}×" if floor else "–"


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _load(value: Any) -> str:
    """A load average (a list of the 1/5/15-minute ones, or one number) as its 1-minute figure."""
    if isinstance(value, list | tuple):
        return _n(float(value[0]), 1) if value else "–"
    return _n(float(value), 1) if value is not None else "–"


def _loads(*values: Any) -> str:
    shown = [_load(value) for value in values if value is not None]
    return " → ".join(dict.fromkeys(shown)) if shown else "–"


def _section_load(results: dict[str, Any], name: str) -> str:
    loads = results.get("section_load", {}).get(name) or {}
    return _loads(loads.get("start"), loads.get("end"))


# -- the first fork after a write (bench/fork_after_write.py), without and with a neighbour writing --------


def _boot_floor(results: dict[str, Any]) -> tuple[str, float] | None:
    """The raw runtime's create → running from this run's lifecycle section (what any new container
    costs here: the fork rows' floor in wave 2), as (runtime, p50 ms); None when it did not run."""
    life = (results.get("sections") or {}).get("lifecycle") or {}
    runtime = (results.get("machine") or {}).get("paddock_runtime") or "runc"
    name = runtime if runtime in life else "runc"
    create = life.get(name, {}).get("create") or {}
    return (name, create["p50"]) if create.get("n") else None


def _fork_goals(variant: str, suffix: str) -> list[Goal]:
    def fork_row(case: str) -> Callable[[Any, dict[str, Any]], Cells]:
        def cells(data: Any, results: dict[str, Any]) -> Cells:
            run = data[variant]
            forks = run["forks"]
            stats, floor = forks[case], forks[f"floor_clone_{BIG_MIB}"]
            synced = forks.get(f"floor_sync_clone_{BIG_MIB}", {}).get("p50")
            clone = f"`FICLONE` of {BIG_MIB:,} MiB just written {_n(floor['p50'])} ms (after `sync -f` {_n(synced)})"
            boot = _boot_floor(results)
            return Cells(
                f"{_n(stats['p50'])} ms (p90 {_n(stats['p90'])}, n={stats['n']})",
                f"raw {boot[0]} create → running {_n(boot[1])} ms; {clone}" if boot else clone,
                f"{_x(stats['p50'], boot[1])} {boot[0]}"
                if boot
                else f"{_x(stats['p50'], floor['p50'])} FICLONE",
                _met(stats["p50"] <= FORK_GOAL_MS),
                _loads(run.get("load_average_start"), run.get("load_average_end")),
            )

        return cells

    def ratio_row(data: Any, results: dict[str, Any]) -> Cells:
        run = data[variant]
        big, small = run["forks"][f"synced_{BIG_MIB}"], run["forks"][f"synced_{SMALL_MIB}"]
        ratio = big["p50"] / small["p50"]
        return Cells(
            f"{ratio:.2f}× ({_n(big['p50'])} / {_n(small['p50'])} ms)",
            f"fork after {SMALL_MIB} MiB synced {_n(small['p50'])} ms",
            f"{ratio:.2f}×",
            _met(ratio <= FORK_RATIO_GOAL),
            _loads(run.get("load_average_start"), run.get("load_average_end")),
        )

    goal = f"fork p50 ≤ {FORK_GOAL_MS:.0f} ms"
    return [
        (
            f"{goal}, source just wrote and synced {BIG_MIB // 1024} GiB{suffix}",
            fork_row(f"synced_{BIG_MIB}"),
        ),
        (f"{goal}, source just wrote {FRESH_MIB} MiB unsynced{suffix}", fork_row(f"fresh_{FRESH_MIB}")),
        (f"{goal}, source just created {FRESH_FILES:,} files{suffix}", fork_row(f"files_{FRESH_FILES}")),
        *(
            (f"{goal}, settled source of {size:,} MiB{suffix}", fork_row(f"settled_{size}"))
            for size in SETTLED_MIB
        ),
        (f"fork({BIG_MIB // 1024} GiB) ÷ fork({SMALL_MIB} MiB) ≤ {FORK_RATIO_GOAL}×{suffix}", ratio_row),
    ]


# -- every image warm, sustained creates, the pools' memory (bench/pools_bench.py) -------------------------


def _pool_create(label: str) -> Callable[[Any, dict[str, Any]], Cells]:
    def cells(data: Any, results: dict[str, Any]) -> Cells:
        row = next(row for row in data["creates"] if row["case"] == label)
        return Cells(
            f"{_n(row['p50'])} ms (p90 {_n(row['p90'])}; {row['claimed']}/{row['rounds']} claimed parked)",
            f"`crun run -d` {_n(row['floor']['p50'])} ms",
            _x(row["p50"], row["floor"]["p50"]),
            _met(row["p50"] <= CREATE_GOAL_MS),
            _load(row.get("load")),
        )

    return cells


def _pool_memory(data: Any, results: dict[str, Any]) -> Cells:
    held, budget = data["pool_memory_bytes"] / 2**20, data["pool_memory_budget_bytes"] / 2**20
    return Cells(
        f"{_n(held)} MiB ({_n(data['parked_slots'], 0)} parked)",
        f"budget {_n(budget)} MiB",
        _x(held, budget),
        _met(held <= budget),
        _loads(data.get("load_before_sustained")),
    )


def _sustained(name: str) -> Callable[[Any, dict[str, Any]], Cells]:
    def cells(data: Any, results: dict[str, Any]) -> Cells:
        row, floor = data[name], data["sustained_floor"]
        cpu = (
            f"; agent CPU {_n(row['agent_cpu_ms_per_create'])} ms per create + delete against crun's "
            f"{_n(floor['crun_cpu_ms_per_create'])}"
            if row.get("agent_cpu_ms_per_create")
            else ""
        )
        return Cells(
            f"{_n(row['per_s'])}/s ({row['creates']} in {_n(row['seconds'])} s, {row['errors']} errors{cpu})",
            f"`crun run -d` + `delete -f` {_n(floor['per_s'])}/s",
            _x(row["per_s"], floor["per_s"]),
            _met(row["per_s"] >= SUSTAINED_GOAL_PER_S),
            _loads(data.get("load_before_sustained"), data.get("load_after")),
        )

    return cells


def _first_command(data: Any, results: dict[str, Any]) -> Cells:
    row, floor = data["sustained"], data["sustained_floor"]
    return Cells(
        f"{_n(row['p50'])} / {_n(row['p99'])} ms (Daytona publishes 110 ms)",
        f"`crun run -d` {_n(floor['p50'])} / {_n(floor['p99'])} ms",
        _x(row["p50"], floor["p50"]),
        "reported",
        _loads(data.get("load_before_sustained"), data.get("load_after")),
    )


POOL_GOALS: list[Goal] = [
    (f"create → running p50 ≤ {CREATE_GOAL_MS:.0f} ms: {label}", _pool_create(label))
    for label, _, _ in pools_bench.cases("template")
] + [
    ("host memory the pools hold, bounded by host memory", _pool_memory),
    (
        f"creates ≥ {SUSTAINED_GOAL_PER_S:.0f}/s sustained, concurrency 20, through the SDK",
        _sustained("sustained"),
    ),
    (
        f"creates ≥ {SUSTAINED_GOAL_PER_S:.0f}/s sustained, concurrency 20, on the host agent",
        _sustained("sustained_agent"),
    ),
    ("sustained create → first command, p50 / p99 (SDK)", _first_command),
]


# -- growth at 1,000 live (bench/density.py) ---------------------------------------------------------------


def _growth(what: str, quantile: str, goal: float) -> Callable[[Any, dict[str, Any]], Cells]:
    def cells(data: Any, results: dict[str, Any]) -> Cells:
        count = data["created"]
        if what == "create":
            one, many = data["create_spaced_at_live"]["1"], data["create_spaced_at_live"][str(count)]
        else:
            one, many = (
                data["timings"]["exec `true` at 1 live"],
                data["timings"][f"exec `true` at {count} live"],
            )
        loads = data.get("load_at_live", {})
        return Cells(
            f"{_n(many[quantile])} ms at {count:,} live",
            f"{_n(one[quantile])} ms at 1 live",
            _x(many[quantile], one[quantile]),
            _met(many[quantile] <= goal * one[quantile])
            + ("" if count >= 1000 else f" (at {count:,}, not 1,000)"),
            _loads(loads.get("1"), loads.get(str(count))),
        )

    return cells


GROWTH_GOALS: list[Goal] = [
    (f"create p50 at 1,000 live ≤ {GROWTH_P50_GOAL}× at 1 live", _growth("create", "p50", GROWTH_P50_GOAL)),
    (
        f"create p90 at 1,000 live ≤ {GROWTH_P90_GOAL:.0f}× at 1 live",
        _growth("create", "p90", GROWTH_P90_GOAL),
    ),
    (f"exec p50 at 1,000 live ≤ {GROWTH_P50_GOAL}× at 1 live", _growth("exec", "p50", GROWTH_P50_GOAL)),
    (f"exec p90 at 1,000 live ≤ {GROWTH_P90_GOAL:.0f}× at 1 live", _growth("exec", "p90", GROWTH_P90_GOAL)),
]


# -- the VM tier (bench/vm_bench.py) and computer use (bench/desktop_bench.py) -----------------------------


def _vm_create(data: Any, results: dict[str, Any]) -> Cells:
    ops = data["ops"]
    restored, boot = ops["create → running (from saved state)"], ops["qemu boot (floor)"]
    cold, read = ops["create → running (cold boot)"], ops.get("memory.state read (floor)", {})
    return Cells(
        f"{_n(restored['p50'])} ms (p90 {_n(restored['p90'])}; cold boot {_n(cold['p50'])} ms), {data['accel']}",
        f"QEMU boot alone {_n(boot['p50'])} ms; reading the memory file {_n(read.get('p50'))} ms",
        _x(restored["p50"], boot["p50"]),
        _met(restored["p50"] <= VM_GOAL_MS),
        _section_load(results, "vm"),
    )


def _desktop(op: str, goal: float) -> Callable[[Any, dict[str, Any]], Cells]:
    def cells(data: Any, results: dict[str, Any]) -> Cells:
        ops = data["ops"]
        row, grab, exec_true = ops[op], ops["grab in sandbox"], ops["exec true"]
        return Cells(
            f"{_n(row['p50'])} ms (p99 {_n(row['p99'])})",
            f"Pillow grab in the sandbox {_n(grab['p50'])} ms; `exec true` {_n(exec_true['p50'])} ms",
            _x(row["p50"], grab["p50"]),
            _met(row["p50"] <= goal),
            _section_load(results, "desktop"),
        )

    return cells


# -- templates (bench/templates_bench.py) ------------------------------------------------------------------


def _p50(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _build(data: Any, results: dict[str, Any]) -> Cells:
    build, podman = _p50(data["build"]), _p50(data["podman"])
    return Cells(
        f"{build:.2f} s (n={len(data['build'])})",
        f"`podman build`, same Dockerfile {podman:.2f} s",
        _x(build, podman),
        _met(build <= BUILD_RATIO_GOAL * podman),
        _section_load(results, "templates"),
    )


def _cached(data: Any, results: dict[str, Any]) -> Cells:
    cached, podman = _p50(data["cached"]), _p50(data["podman"])
    return Cells(
        f"{cached:.2f} s (n={len(data['cached'])})",
        f"`podman build` (uncached) {podman:.2f} s",
        _x(cached, podman),
        _met(cached <= CACHED_GOAL_S),
        _section_load(results, "templates"),
    )


# -- PostgreSQL mode (bench/pg_mode.py): two control planes on one PostgreSQL, beside SQLite -----------------


def _pg(
    pick: Callable[[dict[str, Any]], tuple[float, Any]], unit: str, ok: Callable[[float], bool]
) -> Callable[[Any, dict[str, Any]], Cells]:
    def cells(data: Any, results: dict[str, Any]) -> Cells:
        value, load = pick(data["postgresql"])
        try:
            floor, floor_load = pick(data["sqlite"])
        except (KeyError, TypeError):
            return Cells(f"{_n(value)} {unit}", met=_met(ok(value)), load=_load(load))
        return Cells(
            f"{_n(value)} {unit}",
            f"SQLite, same run: {_n(floor)} {unit} (load {_load(floor_load)})",
            _x(value, floor),
            _met(ok(value)),
            _load(load),
        )

    return cells


PG_GOALS: list[Goal] = [
    (
        f"PostgreSQL mode: GET ≥ {PG_GET_GOAL:,.0f} req/s",
        _pg(lambda r: (r["get"]["rps"], r["get"]["load"]), "req/s", lambda v: v >= PG_GET_GOAL),
    ),
    (
        f"PostgreSQL mode: webhooks ≥ {PG_BURST_GOAL:,.0f}/s burst",
        _pg(
            lambda r: (r["webhooks"]["burst"]["rate"], r["webhooks"]["load"]),
            "/s",
            lambda v: v >= PG_BURST_GOAL,
        ),
    ),
    (
        f"PostgreSQL mode: webhook delivery p99 ≤ {PG_P99_GOAL_MS:.0f} ms (100/s)",
        _pg(
            lambda r: (r["webhooks"]["steady 100/s"]["p99"], r["webhooks"]["load"]),
            "ms",
            lambda v: v <= PG_P99_GOAL_MS,
        ),
    ),
    (
        f"PostgreSQL mode: creates ≥ {PG_CREATES_GOAL:.0f}/s (stand-in agents)",
        _pg(lambda r: (r["creates"]["per_s"], r["creates"]["load"]), "/s", lambda v: v >= PG_CREATES_GOAL),
    ),
]


# -- the fleet by simulation (bench/fleet_sim.py): the large fleet against the small one, same run ---------


def _fleet(pick: Callable[[dict[str, Any]], float], unit: str) -> Callable[[Any, dict[str, Any]], Cells]:
    def cells(data: Any, results: dict[str, Any]) -> Cells:
        small, large = data["small"], data["large"]
        a, b = pick(small), pick(large)
        growth = a / b if unit == "/s" else b / a  # a rate that falls is a cost that grows
        return Cells(
            f"{_n(b, 2)} {unit} at {large['fleet']['hosts']} hosts, {large['fleet']['sandboxes']:,} sandboxes",
            f"{_n(a, 2)} {unit} at {small['fleet']['hosts']} hosts, {small['fleet']['sandboxes']:,}",
            f"{growth:.2f}×",
            _met(growth <= FLEET_GOAL),
            _loads(small.get("load_before"), large.get("load_after")),
        )

    return cells


FLEET_GOALS: list[Goal] = [
    (f"fleet: {label} ≤ {FLEET_GOAL}× the small fleet's", _fleet(pick, unit))
    for label, pick, unit in fleet_sim.ROWS
]


# -- one heartbeat of a dense host (bench/heartbeat_cost.py): no goal of its own; the growth work's -------


def _beat_list(data: Any, results: dict[str, Any]) -> Cells:
    agent = data["results"]["agent"]
    now, before = agent["after_the_read_ms"], agent["reads_on_the_loop_ms"]
    return Cells(
        f"{_n(now['p50'])} ms (p90 {_n(now['p90'])}) of the agent's loop",
        f"the reads on the loop, as before f02c3a3: {_n(before['p50'])} ms",
        _x(now["p50"], before["p50"]),
        "– (no goal)",
        _loads(data["meta"].get("load_before"), data["meta"].get("load_after")),
    )


def _fold(engine: str) -> Callable[[Any, dict[str, Any]], Cells]:
    def cells(data: Any, results: dict[str, Any]) -> Cells:
        numbers = data["results"]["fold"][engine]
        folded, floor = numbers["fold_ms"], numbers["floor_read_rows_ms"]
        return Cells(
            f"{_n(folded['p50'])} ms (p90 {_n(folded['p90'])})",
            f"its read of the host's rows alone {_n(floor['p50'])} ms",
            _x(folded["p50"], floor["p50"]),
            "– (no goal)",
            _loads(data["meta"].get("load_before"), data["meta"].get("load_after")),
        )

    return cells


HEARTBEAT_GOALS: list[Goal] = [
    ("a heartbeat's list of 1,000 sandboxes, on the agent", _beat_list),
    ("the control plane's fold of that beat, SQLite", _fold("sqlite")),
    ("the control plane's fold of that beat, PostgreSQL", _fold("postgresql")),
]


#: Every section's goals, in the order of the table.
GOALS: list[tuple[str, list[Goal]]] = [
    ("fork_after_write", _fork_goals("quiet", "") + _fork_goals("neighbour", ", a neighbour writing")),
    ("pools", POOL_GOALS),
    ("density", GROWTH_GOALS),
    ("vm", [(f"VM create p50 ≤ {VM_GOAL_MS / 1000:.0f} s from a saved state (TCG)", _vm_create)]),
    (
        "desktop",
        [
            (
                f"screenshot p50 ≤ {SCREENSHOT_GOAL_MS:.0f} ms at 1280×800",
                _desktop("screenshot", SCREENSHOT_GOAL_MS),
            ),
            (
                f"click → changed screenshot ≤ {CLICK_GOAL_MS:.0f} ms",
                _desktop("click → changed", CLICK_GOAL_MS),
            ),
        ],
    ),
    (
        "templates",
        [
            (f"template build ≤ {BUILD_RATIO_GOAL}× `podman build`", _build),
            (f"cached rebuild ≤ {CACHED_GOAL_S:.0f} s", _cached),
        ],
    ),
    ("pg_mode", PG_GOALS),
    ("fleet", FLEET_GOALS),
    ("heartbeat", HEARTBEAT_GOALS),
]


def rows(results: dict[str, Any]) -> list[tuple[str, str, Cells]]:
    """(section, goal, cells) for every goal, whether or not its section ran."""
    sections, errors = results.get("sections") or {}, results.get("errors") or {}
    out = []
    for section, goals in GOALS:
        data = sections.get(section)
        for label, read in goals:
            if data is None:
                cells = Cells("failed (see below)" if section in errors else "not run")
            else:
                try:
                    cells = read(data, results)
                except (KeyError, IndexError, TypeError, StopIteration, ZeroDivisionError):
                    cells = Cells("not in this run's results")
            out.append((section, label, cells))
    return out


def markdown(results: dict[str, Any]) -> str:
    lines = [
        TITLE,
        "",
        "Each goal of issue #36 beside its floor, measured in this run. The ratio is the row's value ÷ its "
        "floor (for a rate, the share of the floor's rate it reached); for the fleet, how much the large "
        "fleet's cost grew over the small one's. Load is the box's 1-minute load average when the row ran "
        "(start → end). A section this run did not hold shows as not run.",
        "",
        "| goal | measured | floor, same run | ratio | met | load | section |",
        "|---|---|---|---|---|---|---|",
    ]
    for section, label, cells in rows(results):
        lines.append(
            f"| {label} | {cells.value} | {cells.floor} | {cells.ratio} | {cells.met} | {cells.load} | `{section}` |"
        )
    return "\n".join(lines) + "\n"
