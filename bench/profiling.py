"""py-spy recordings of the platform's services while a bench measures them: where their Python goes.

py-spy is not installed by ``make`` (``pip install py-spy`` in a venv of its own); a bench records only
when given its path (``bench.agent_growth --py-spy PATH``, ``PADDOCK_BENCH_PY_SPY`` for the density
section of ``bench.run``).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

#: ``--gil``: only samples where a thread holds the interpreter's lock, i.e. the Python each service ran,
#: not its waits; collapsed stacks (``raw``), one file per process.
_OPTIONS = ("-d", "3600", "-r", "500", "-f", "raw", "--nonblocking", "--gil")


@contextlib.contextmanager
def py_spy_recording(py_spy: str | None, outputs: Mapping[int, Path]) -> Iterator[None]:
    """While the block runs, py-spy records each pid of ``outputs`` into its path; nothing when
    ``py_spy`` is None."""
    recorders = (
        []
        if py_spy is None
        else [
            subprocess.Popen(
                [py_spy, "record", "-p", str(pid), "-o", str(path), *_OPTIONS],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pid, path in outputs.items()
        ]
    )
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        for recorder in recorders:
            recorder.wait(30)
