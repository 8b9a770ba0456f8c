"""A stand-in for ``sparkring server run`` under the supervisor (tests/unit/test_supervisor.py).

    python testing/stand_in_server.py STATE_DIR STEP [STEP ...]

The n-th start of this script plays the n-th STEP (the last one repeats):

- ``crash``: dies by SIGKILL, as after kill -9 or the OOM killer;
- ``exit:N``: exits with code N;
- ``serve:N``: runs until SIGTERM or SIGINT, then exits with code N;
- ``serve:kill``: runs until SIGTERM or SIGINT, then dies by SIGKILL;
- ``orphan``: starts a "watchdog" in a session of its own (as the server starts its
  drivers' watchdogs), then dies by SIGKILL.

Every start appends its pid to ``STATE_DIR/starts`` once its signal handlers are in
place (so a test may signal as soon as it sees the line); every signal received is
appended to ``STATE_DIR/signals``; an orphan's pid goes to ``STATE_DIR/orphans``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The orphan: outlives its parent, as a driver's watchdog must, until the test kills it.
ORPHAN = "import time\nwhile True:\n    time.sleep(1)\n"


def _append(path: Path, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(line + "\n")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(state: Path, steps: list[str]) -> int:
    starts = state / "starts"
    count = len(starts.read_text().splitlines()) if starts.exists() else 0
    step = steps[min(count, len(steps) - 1)]
    received: list[int] = []

    def handle(signum: int, _frame: object) -> None:
        received.append(signum)
        _append(state / "signals", signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    _append(starts, str(os.getpid()))
    kind, _, value = step.partition(":")
    if kind == "crash":
        _die()
    if kind == "exit":
        return int(value)
    if kind == "orphan":
        orphan = subprocess.Popen([sys.executable, "-c", ORPHAN], start_new_session=True)
        _append(state / "orphans", str(orphan.pid))
        _die()
    if kind == "serve":
        while not received:
            time.sleep(0.02)  # a signal handler runs between these sleeps
        if value == "kill":
            _die()
        return int(value)
    raise SystemExit(f"unknown step {step!r}")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
