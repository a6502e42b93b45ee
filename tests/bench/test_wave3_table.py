"""The report's wave-3 table (bench/wave3.py) holds every goal of issue #36 from a run's results: each
beside its floor when its section ran, "not run" or "failed" when it did not. No sandboxes: the results
are a fixture shaped like a full run's JSON (bench/run.py), and the report is written to a temp dir."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from bench.fork_after_write import BIG_MIB, FRESH_FILES, FRESH_MIB, SETTLED_MIB, SMALL_MIB
from bench.pools_bench import cases

from bench import run, templates_bench, wave3


def stats(p50: float, n: int = 10) -> dict[str, Any]:
    return {"n": n, "p50": p50, "p90": p50 * 1.5, "p99": p50 * 2, "mean": p50, "min": p50 / 2, "max": p50 * 2}


def fork_run(neighbour: bool) -> dict[str, Any]:
    forks = {
        f"synced_{BIG_MIB}": stats(195.0),
        f"synced_{SMALL_MIB}": stats(81.0),
        f"fresh_{FRESH_MIB}": stats(138.0),
        f"files_{FRESH_FILES}": stats(232.0),
        **{f"settled_{size}": stats(40.0 + size / 1000) for size in SETTLED_MIB},
        f"floor_clone_{BIG_MIB}": stats(298.0),
        f"floor_sync_clone_{BIG_MIB}": stats(230.0),
    }
    return {
        "started_at": "2026-12-03T20:00:00Z",
        "git": "abc123",
        "runs": 10,
        "neighbour": neighbour,
        "load_average_start": [4.2, 3.0, 2.0],
        "load_average_end": [6.1, 3.5, 2.2],
        "forks": forks,
        "phases_p50": {f"synced_{BIG_MIB}": {"clone": 110.8, "boot": 20.0}},
    }


def sustained(per_s: float, agent: bool) -> dict[str, Any]:
    return {
        "seconds": 30.5,
        "concurrency": 20,
        "creates": int(per_s * 30),
        "per_s": per_s,
        "errors": 0,
        "first_errors": [],
        "box_cpu_ms_per_create": 300.0,
        "agent_cpu_ms_per_create": 46.0 if agent else None,
        **stats(1900.0, 100),
    }


def fleet_phase(hosts: int, sandboxes: int, scale: float) -> dict[str, Any]:
    return {
        "load_before": [3.0, 2.0, 1.0],
        "load_after": [5.6, 3.0, 2.0],
        "fleet": {"hosts": hosts, "sandboxes": sandboxes},
        "scheduler_ms": stats(3.6 * scale),
        "heartbeat_small_hosts": {
            "beats_per_s": 115.8 / scale,
            "beat_ms": stats(31.8 * scale),
            "cp_cpu_ms_per_beat": 9.7,
        },
        "reconciler": {"round_ms": stats(25.6 * scale), "passes_ms": {"idle_pass": stats(1.8 * scale)}},
        "billing_pass": {"ms": 120.0 * scale, "create_during_ms": stats(30.0)},
        "get_ms": stats(5.5),
        "list_ms": stats(10.8),
        "create_ms": stats(27.6 * scale),
        "cp_cpu_ms_per_get_and_list": 12.2,
        "cp_cpu_ms_per_create": 15.3 * scale,
    }


def pg_engine(get_rps: float, per_s: float, burst: float, p99: float) -> dict[str, Any]:
    return {
        "get": {"load": 4.4, "rps": get_rps, "latency_ms": {"p50": 1.4, "p99": 9.0}, "connections": 8},
        "freshness": {"load": 4.4, "seen_after_ms": stats(13.1), "max_ms": 28.6, "gets": stats(1.0)},
        "creates": {
            "load": 4.9,
            "creates": int(per_s * 10),
            "per_s": per_s,
            "create_ms": stats(1500.0),
            "cp_cpu_ms_per_create": 22.4,
            "cp_idle_cpu_ms_per_s": 200.0,
            "cp_cpu_ms_per_create_net_of_idle": 1.9,
            "failures": 0,
            "first_failure": None,
            "concurrency": 20,
        },
        "webhooks": {
            "load": 5.0,
            "burst": {"n": 2000, "rate": burst},
            "steady 100/s": {"n": 500, "rate": 93.0, "p50": 18.7, "p99": p99},
        },
    }


def full_run() -> dict[str, Any]:
    """A full run's results, every wave-3 section in it (the shapes their modules return)."""
    templates: dict[str, list[float]] = {
        "build": [12.07, 12.2],
        "podman": [12.1, 12.0],
        "cached": [2.1, 1.95],
    }
    templates |= {"boot_tpl": [18.9], "boot_debian": [13.2]}
    for name, _ in templates_bench.PHASES:
        templates[f"phase {name}"] = [1.0, 1.1]
        templates[f"cached phase {name}"] = [0.3, 0.4]
    pools = {
        "load_before": [2.5, 2.0, 1.0],
        "creates": [
            {
                "case": label,
                **stats(14.3 if image == "devbox:1" else 20.3, 8),
                "claimed": 8,
                "rounds": 8,
                "floor": stats(27.0, 5),
                "image": image,
                "before_ms": None,
                "load": [3.7, 3.0, 2.0],
            }
            for label, image, _ in cases("tpl_abc")
        ],
        "pool_memory_bytes": 6.5 * 2**20,
        "pool_memory_budget_bytes": 1205 * 2**20,
        "parked_slots": 13.0,
        "load_before_sustained": [13.0, 10.0, 8.0],
        "sustained": sustained(4.5, agent=False),
        "sustained_agent": sustained(7.3, agent=True),
        "sustained_floor": {
            **sustained(27.2, agent=False),
            "crun_cpu_ms_per_create": 10.4,
            **stats(342.0, 833),
        },
        "load_after": [31.0, 20.0, 10.0],
    }
    density = {  # what the report's own density table reads, and the growth rows
        "created": 1000,
        "stop_reason": "cap of 1000 reached (time budget)",
        "host_mib_per_sandbox": 1.9,
        "kernel_mib_per_sandbox": 0.8,
        "mem_available_fall_mib_per_sandbox": 2.1,
        "controlplane_mib_per_sandbox": 0.1,
        "hostagent_mib_per_sandbox": 0.2,
        "controlplane_rss_mib": {"start": 120.0, "end": 200.0},
        "hostagent_rss_mib": {"start": 90.0, "end": 290.0},
        "cgroup_usage_mib": stats(0.9, 1000),
        "cgroup_rss_mib": stats(0.5, 1000),
        "guest_agent_rss_mib": stats(3.0, 1000),
        "fit_by_memory_extrapolated": 11_000,
        "fit_by_scheduler": 1500,
        "host_total_mib": 384_000,
        "create_spaced_at_live": {"1": stats(22.1), "1000": stats(71.1)},
        "timings": {
            "create (back to back)": stats(60.0, 1000),
            "exec `true` at 1 live": stats(3.5, 30),
            "exec `true` at 1000 live": stats(4.4, 30),
            "destroy": stats(20.0, 1000),
        },
        "load_at_live": {"1": [4.8, 4.0, 3.0], "1000": [9.8, 7.0, 5.0]},
    }
    vm = {
        "accel": "tcg",
        "shape": {"vcpu": 1, "mem_mib": 512},
        "ops": {
            "qemu boot (floor)": stats(5931.0, 3),
            "create → running (cold boot)": stats(7154.0, 3),
            "memory.state read (floor)": stats(28.0, 3),
            "create → running (from saved state)": stats(607.0, 3),
        },
    }
    desktop = {
        "shape": "s-2vcpu-2gb",
        "screen": "1280x800",
        "ops": {
            "screenshot": stats(45.8, 30),
            "click → changed": stats(158.7, 30),
            "exec true": stats(5.4, 30),
            "grab in sandbox": stats(20.0, 30),
        },
    }
    heartbeat = {
        "meta": {
            "at": "20261203T200000Z",
            "sandboxes": 1000,
            "beats": 20,
            "load_before": [5.2, 5.0, 3.2],
            "load_after": [5.6, 5.1, 3.3],
        },
        "results": {
            "agent": {
                "reads_on_the_loop_ms": stats(215.6),
                "after_the_read_ms": stats(22.5),
                "the_read_in_its_thread_ms": stats(170.5),
            },
            "fold": {
                engine: {"fold_ms": stats(fold), "floor_read_rows_ms": stats(floor)}
                for engine, fold, floor in (("sqlite", 64.4, 26.1), ("postgresql", 48.9, 20.1))
            },
        },
    }
    return {
        "started_at": "2026-12-03T20:00:00Z",
        "mode": "full",
        "runs": 30,
        "warmup": 3,
        "errors": {},
        "machine": {"paddock_runtime": "crun"},
        "section_load": {name: {"start": [7.0, 6.0, 5.0], "end": [9.0, 7.0, 6.0]} for name in wave3.SECTIONS},
        "sections": {
            "lifecycle": {"crun": {"create": stats(25.0, 30)}},
            "fork_after_write": {"quiet": fork_run(False), "neighbour": fork_run(True)},
            "pools": pools,
            "density": density,
            "vm": vm,
            "desktop": desktop,
            "templates": templates,
            "pg_mode": {
                "sqlite": pg_engine(2786.0, 52.8, 697.0, 58.7),
                "postgresql": pg_engine(4181.0, 18.6, 429.0, 63.5),
            },
            "fleet": {
                "small": fleet_phase(3, 100, 1.0),
                "large": fleet_phase(200, 100_000, 2.0),
                "hosts_by_status": {"active": 200},
            },
            "heartbeat": heartbeat,
        },
    }


GOAL_COUNT = sum(len(goals) for _, goals in wave3.GOALS)


def table_rows(text: str) -> dict[str, list[str]]:
    """The wave-3 table's rows by goal: measured, floor, ratio, met, load, section."""
    body = text.split(wave3.TITLE, 1)[1].split("\n\n#", 1)[0]
    rows = [
        [cell.strip() for cell in line.strip("|").split(" | ")]
        for line in body.splitlines()
        if line.startswith("| ")
    ]
    return {cells[0]: cells[1:] for cells in rows[1:]}  # past the header


def test_every_goal_renders_beside_its_floor() -> None:
    rows = table_rows(wave3.markdown(full_run()))
    assert len(rows) == GOAL_COUNT
    for goal, (measured, floor, ratio, met, load, _) in rows.items():
        assert measured not in ("not run", "not in this run's results"), goal
        assert load != "–", goal
        if not met.startswith("–"):  # the heartbeat's rows have no goal of their own
            assert floor != "–" and ratio != "–", goal
    assert rows["PostgreSQL mode: GET ≥ 4,000 req/s"][:4] == [
        "4,181 req/s",
        "SQLite, same run: 2,786 req/s (load 4.4)",
        "1.50×",
        "yes",
    ]
    assert rows["VM create p50 ≤ 1 s from a saved state (TCG)"][3] == "yes"
    synced = rows["fork p50 ≤ 50 ms, source just wrote and synced 1 GiB"]
    assert synced[1].startswith("raw crun create → running 25.0 ms; `FICLONE`") and synced[2:4] == [
        "7.80× crun",
        "**no**",
    ]
    assert rows["fork(1 GiB) ÷ fork(10 MiB) ≤ 1.5×, a neighbour writing"][3] == "**no**"  # 195 / 81 = 2.41
    sustained = rows["creates ≥ 100/s sustained, concurrency 20, through the SDK"]
    assert sustained[2:4] == ["0.17×", "**no**"]
    assert rows["exec p50 at 1,000 live ≤ 1.3× at 1 live"][2:5] == ["1.26×", "yes", "4.8 → 9.8"]
    assert rows["fleet: scheduler's decision (`pick_host`) ≤ 1.5× the small fleet's"][2:4] == [
        "2.00×",
        "**no**",
    ]


def test_a_missing_section_shows_as_not_run_and_a_failed_one_as_failed() -> None:
    results = copy.deepcopy(full_run())
    del results["sections"]["fleet"]
    del results["sections"]["pg_mode"]
    results["errors"]["pg_mode"] = "RuntimeError: no PostgreSQL"
    del results["sections"]["pools"]["sustained_agent"]  # a section that ran short
    rows = table_rows(wave3.markdown(results))
    assert len(rows) == GOAL_COUNT
    fleet = [cells for goal, cells in rows.items() if goal.startswith("fleet: ")]
    assert fleet and all(cells[0] == "not run" and cells[3] == "–" for cells in fleet)
    pg = [cells for goal, cells in rows.items() if goal.startswith("PostgreSQL mode")]
    assert len(pg) == 4 and all(cells[0] == "failed (see below)" for cells in pg)
    agent = rows["creates ≥ 100/s sustained, concurrency 20, on the host agent"]
    assert agent[0] == "not in this run's results"
    assert rows["template build ≤ 1.2× `podman build`"][3] == "yes"  # the others still render

    empty = table_rows(wave3.markdown({"sections": {}, "errors": {}}))
    assert len(empty) == GOAL_COUNT and {cells[0] for cells in empty.values()} == {"not run"}


@pytest.mark.parametrize(
    "only", ["pools,fleet", "fork_after_write,pools,templates,pg_mode,fleet,heartbeat,density,vm,desktop"]
)
def test_the_written_report_holds_the_table_and_each_sections_own(tmp_path: Path, only: str) -> None:
    bench = run.Run(run.parse_args(["--only", only, "--out", str(tmp_path)]))
    fixture = full_run()
    asked = only.split(",")
    bench.results |= {
        key: value for key, value in fixture.items() if key not in ("started_at", "mode", "machine")
    }
    bench.results["sections"] = {name: value for name, value in fixture["sections"].items() if name in asked}
    bench.write()
    [written] = tmp_path.glob("*.md")
    text = written.read_text()
    rows = table_rows(text)
    assert len(rows) == GOAL_COUNT
    ran = {cells[5].strip("`") for cells in rows.values() if cells[0] != "not run"}
    assert ran == set(asked)
    assert "## Every image warm; sustained creates (bench/pools_bench.py)" in text
    assert f"## Fleet simulation, {bench.results['started_at']}" in text
    assert ("## PostgreSQL mode beside SQLite" in text) == ("pg_mode" in asked)
    assert "could not be written" not in text
