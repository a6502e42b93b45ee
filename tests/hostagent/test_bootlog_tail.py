"""bootlog.read_tail, the reader behind the logs route: the last lines only, from a bounded window at the
file's end, never through a symbolic link, and no lines for a log never written (a quiet boot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paddock_hostagent.drivers.runtime.bootlog import MAX_READ_BYTES, BootLog, read_tail


def test_the_last_lines_and_whether_older_ones_were_left_out(tmp_path: Path) -> None:
    log = tmp_path / "runtime.log"
    log.write_text("".join(f"line {n}\n" for n in range(10)))
    assert read_tail(log, 3) == (["line 7", "line 8", "line 9"], True)
    assert read_tail(log, 10) == ([f"line {n}" for n in range(10)], False)
    assert read_tail(tmp_path / "never-written.log", 5) == ([], False)


def test_a_log_larger_than_the_window_is_read_from_its_end_only(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    line = "x" * 99 + "\n"
    log.write_text(line * (3 * MAX_READ_BYTES // len(line)) + "the end\n")
    lines, truncated = read_tail(log, 100_000)
    assert truncated and lines[-1] == "the end"
    assert sum(len(text) + 1 for text in lines) <= MAX_READ_BYTES
    assert all(text == "x" * 99 for text in lines[:-1])  # the cut first line of the window is dropped


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere"
    secret.write_text("not a log\n")
    (tmp_path / "runtime.log").symlink_to(secret)
    with pytest.raises(OSError):
        read_tail(tmp_path / "runtime.log", 10)


async def test_the_agents_own_lines_are_kept_within_the_bound(tmp_path: Path) -> None:
    boot = BootLog(tmp_path / "runtime.log")
    boot.note("starting the sandbox with crun")
    boot.limit_bytes = 200
    for n in range(50):
        boot.note(f"step {n}")
    boot.close()
    data = (tmp_path / "runtime.log").read_bytes()
    assert len(data) <= 200 and data.endswith(b"paddock: step 49\n")
