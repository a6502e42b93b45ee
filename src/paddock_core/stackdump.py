"""What a running service is doing, on demand, for a stop or a request that hangs.

- ``kill -USR1 <pid>``: every thread's Python stack, written to stderr by ``faulthandler`` from the
  signal handler itself, so it works while the event loop is stuck in a blocking call;
- ``kill -USR2 <pid>``: every asyncio task's stack (what each one awaits), written from the event
  loop, so it needs the loop to be running; at most ``MAX_TASKS`` of them.

The tests' harness sends both to a host agent that did not stop in time, before it kills it, so a
hang leaves its cause in the agent's log.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import signal
import sys

#: Tasks written per dump: an agent runs a few per sandbox, and the dump must stay readable.
MAX_TASKS = 500
#: Frames written per task (innermost last, as tracebacks read).
FRAMES = 16


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Both signals' handlers, for the process whose event loop is ``loop`` (its main thread)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    loop.add_signal_handler(signal.SIGUSR2, dump_tasks)


def dump_tasks() -> None:
    tasks = list(asyncio.all_tasks())
    out = io.StringIO()
    out.write(f"--- {len(tasks)} asyncio tasks ---\n")
    for task in tasks[:MAX_TASKS]:
        task.print_stack(limit=FRAMES, file=out)
    if len(tasks) > MAX_TASKS:
        out.write(f"--- {len(tasks) - MAX_TASKS} more not shown ---\n")
    sys.stderr.write(out.getvalue())
    sys.stderr.flush()
