"""E2B's sandbox log entries made from Paddock's boot log (``edge/e2b/sandbox_logs.py``): each line's own
UTC time when it starts with one, else the line before's (the creation for the first), in order; and
the pages E2B's routes ask for (from a cursor, backward, by level, by a search, bounded)."""

from __future__ import annotations

import datetime as dt
import json

from paddock_controlplane.edge.e2b import sandbox_logs

CREATED = dt.datetime(2026, 12, 2, 7, 50, 0, tzinfo=dt.UTC)
LINES = [
    "crun: starting",  # the runtime's, no time of its own
    "2026-12-02T07:50:01Z paddock: starting the sandbox with crun",
    "init: mounted /proc",
    "2026-12-02T07:50:01.412Z paddock: the guest agent answered; booted in 412 ms",
    "2026-13-02T07:50:09Z shaped like a time, but none",
]


def _ms(at: dt.datetime) -> int:
    return int(at.timestamp() * 1000)


def test_each_line_keeps_its_own_time_or_the_one_before() -> None:
    made = sandbox_logs.entries(LINES, CREATED)
    assert [entry.at for entry in made] == [
        CREATED,
        CREATED + dt.timedelta(seconds=1),
        CREATED + dt.timedelta(seconds=1),
        CREATED + dt.timedelta(seconds=1, milliseconds=412),
        CREATED + dt.timedelta(seconds=1, milliseconds=412),
    ]
    assert [entry.message for entry in made] == [
        "crun: starting",
        "paddock: starting the sandbox with crun",
        "init: mounted /proc",
        "paddock: the guest agent answered; booted in 412 ms",
        "2026-13-02T07:50:09Z shaped like a time, but none",
    ]
    first = made[1]
    # E2B's lines are its envd's JSON records (its CLI parses them): level, logger and message
    assert first.v1() == {
        "timestamp": "2026-12-02T07:50:01.000Z",
        "line": json.dumps({"level": "info", "logger": "paddock-boot", "message": first.message}),
    }
    assert first.structured() == {
        "timestamp": "2026-12-02T07:50:01.000Z",
        "level": "info",
        "message": first.message,
        "fields": {"logger": "paddock-boot"},
    }


def test_pages_from_a_cursor_either_way_by_level_and_search() -> None:
    made = sandbox_logs.entries(LINES, CREATED)
    one_s = _ms(CREATED + dt.timedelta(seconds=1))
    assert sandbox_logs.page(made, since_ms=None, limit=2) == made[:2]
    assert sandbox_logs.page(made, since_ms=one_s, limit=100) == made[1:]
    assert sandbox_logs.page(made, since_ms=one_s, limit=100, backward=True) == [made[2], made[1], made[0]]
    assert sandbox_logs.page(made, since_ms=None, limit=100, search="paddock:") == [made[1], made[3]]
    assert sandbox_logs.page(made, since_ms=None, limit=100, level="info") == made
    assert sandbox_logs.page(made, since_ms=None, limit=100, level="warn") == []  # the boot log has no levels
    assert sandbox_logs.page(made, since_ms=None, limit=0) == []
