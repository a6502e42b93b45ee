"""E2B's sandbox log entries made from Paddock's boot log (``edge/e2b/sandbox_logs.py``): each line's own
UTC time when it starts with one, else the line before's (the creation for the first), in order; and
the pages E2B's routes ask for (from a cursor, backward, by level, by a search, bounded)."""

from __future__ import annotations

import datetime as dt
import json

from paddock_controlplane.edge.e2b import sandbox_logs
from paddock_controlplane.records.audit import AuditEvent

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


def _event(kind: str, at_s: float, detail: dict[str, object], actor: str | None = None) -> AuditEvent:
    at = CREATED + dt.timedelta(seconds=at_s)
    return AuditEvent(sandbox_id="sb-1", user_id="u-1", at=at, kind=kind, actor=actor, detail=detail)


TRAIL = [
    _event(
        "api",
        1.5,
        {
            "method": "POST",
            "route": "/process.Process/Start",
            "status": 200,
            "duration_ms": 4.2,
            "input_sha256": "f00d",
        },
        "envd",
    ),
    _event("process", 1.6, {"argv": ["/bin/bash", "-l", "-c", "echo hi there"], "process_id": "p-1"}, "envd"),
    _event("command", 2, {"argv": ["ls", "-la"], "exit_code": 2, "truncated": True}, "key_1"),
    _event("file", 3, {"path": "/tmp/notes.txt", "bytes": 12, "direction": "write"}, "envd"),
    _event("egress", 4, {"verdict": "refused", "address": "10.9.0.3", "protocol": "tcp", "port": 443}),
    _event(
        "api",
        5,
        {"method": "DELETE", "route": "/sandboxes/{sandbox_id}", "status": 404, "duration_ms": 1.0},
        "key_1",
    ),
    _event("api", 6, {"method": "GET", "route": "/files", "status": 503, "duration_ms": 2.5}, "envd"),
    _event("dropped", 7, {"dropped": 12, "reason": "queue full"}),
]


def test_the_trails_events_say_what_happened_at_their_level() -> None:
    made = sandbox_logs.from_events(TRAIL)
    assert [(entry.message, entry.level) for entry in made] == [
        ("POST /process.Process/Start answered 200 in 4.2 ms", "info"),
        ("process p-1 started: /bin/bash -l -c 'echo hi there'", "info"),
        ("command exited 2: ls -la …", "info"),
        ("file written: /tmp/notes.txt (12 bytes)", "info"),
        ("egress refused: tcp 10.9.0.3:443", "warn"),
        ("DELETE /sandboxes/{sandbox_id} answered 404 in 1.0 ms", "warn"),
        ("GET /files answered 503 in 2.5 ms", "error"),
        ("12 events not recorded: queue full", "warn"),
    ]
    assert [entry.at for entry in made] == [event.at for event in TRAIL]
    start = made[1]
    assert start.structured()["fields"] == {"logger": "paddock-audit", "kind": "process", "actor": "envd"}
    assert json.loads(start.v1()["line"]) == {
        "level": "info",
        "logger": "paddock-audit",
        "kind": "process",
        "actor": "envd",
        "message": start.message,
    }
    assert made[4].structured()["fields"] == {"logger": "paddock-audit", "kind": "egress"}  # no one's call
    assert "f00d" not in json.dumps([entry.structured() for entry in made])  # no input digest


def test_the_boot_log_and_the_trail_page_as_one_log() -> None:
    boot = sandbox_logs.entries(LINES, CREATED)
    found = sandbox_logs.merged(boot, sandbox_logs.from_events(TRAIL))
    assert [entry.at for entry in found] == sorted(entry.at for entry in found)
    assert [entry.fields["logger"] for entry in found[:6]] == [
        "paddock-boot",  # 0 s
        "paddock-boot",  # 1 s
        "paddock-boot",  # 1 s
        "paddock-boot",  # 1.412 s
        "paddock-boot",  # 1.412 s
        "paddock-audit",  # 1.5 s
    ]
    warned = sandbox_logs.page(found, since_ms=None, limit=100, level="warn")
    assert [entry.level for entry in warned] == ["warn", "warn", "error", "warn"]
    newest = sandbox_logs.page(found, since_ms=None, limit=2, backward=True)
    assert [entry.message for entry in newest] == [
        "12 events not recorded: queue full",
        "GET /files answered 503 in 2.5 ms",
    ]
