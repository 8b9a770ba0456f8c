"""One server process per work directory: an exclusive lock held for the process's life.

The work directory holds the run directories of the drivers a server started. A
restarted server adopts the drivers its previous incarnation left running there
(``server/runner.py``), so two processes on one work directory would adopt the same
drivers. The lock is an ``flock`` on ``<work dir>/server.lock``: the kernel releases it
when the holding process dies (kill -9 included), so a crashed server never blocks its
successor, and a second live process is refused at once, naming the holder's pid.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

LOCK_FILE = "server.lock"
# How long a refused process waits for the holder's pid: the holder writes it just after
# it took the lock, and a loser of a race reads the file in between, seconds.
HOLDER_PID_WAIT_S = 1.0


class WorkDirInUse(Exception):
    """Another live sparkring process holds the work directory."""


def lock(work_dir: Path) -> IO[str]:
    """Take the work directory's lock; keep the returned file open while running."""
    work_dir.mkdir(parents=True, exist_ok=True)
    handle = open(work_dir / LOCK_FILE, "a+")  # held open for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        handle.close()
        raise WorkDirInUse(
            f"work directory {work_dir} is in use by another sparkring server (pid {holder}); "
            "give each server process its own SPARKRING_WORK_DIR"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _holder(handle: IO[str]) -> str:
    """The pid the lock's holder wrote, waited for up to HOLDER_PID_WAIT_S (a racing
    loser may read the file between the holder's flock and its write); "unknown" if it
    never comes (a holder of an older version, or one stopped in between)."""
    until = time.monotonic() + HOLDER_PID_WAIT_S
    while True:
        handle.seek(0)
        holder = handle.read().strip()
        if holder or time.monotonic() >= until:
            return holder or "unknown"
        time.sleep(0.02)
