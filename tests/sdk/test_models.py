"""The SDK's models read what the API sends."""

from __future__ import annotations

import paddock


def test_a_buffered_exec_says_when_its_output_was_cut() -> None:
    cut = paddock.ExecResult.from_api(
        {
            "result": {"stdout": "x" * 10, "stderr": "", "exit_code": 0, "stdout_truncated": True},
            "exec_ms": 3.0,
        }
    )
    assert cut.ok and cut.stdout_truncated and not cut.stderr_truncated
    whole = paddock.ExecResult.from_api(
        {"result": {"stdout": "x", "stderr": "", "exit_code": 0}, "exec_ms": 1}
    )
    assert not whole.stdout_truncated and not whole.stderr_truncated
