"""Run a command on a stepped clock whose libfaketime state every user can reach.

``python faketime_shared.py COMMAND [ARG...]``, with libfaketime preloaded
(``faults.SteppableClock.env``): the library, loaded into this process, creates its
semaphore and shared memory (or opens those an outer wrapper created) and names them in
``FAKETIME_SHARED``, which every descendant inherits and opens. It creates them mode
0600, so a driver run as another user (``SPARKRING_DRIVER_USER``) could not open them
and exited 1 before its first line ("sem_open failed"). This opens them to every user,
then replaces itself with ``COMMAND`` (same process, same environment): no descendant
can start before they are reachable.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHM_DIR = Path("/dev/shm")


def shared_files(value: str) -> list[Path]:
    """The files behind ``FAKETIME_SHARED`` ("/SEM_NAME /SHM_NAME"): glibc keeps a
    named semaphore as ``/dev/shm/sem.SEM_NAME`` and shared memory as ``/dev/shm/SHM_NAME``."""
    names = value.split()
    if len(names) != 2 or not all(n.startswith("/") and len(n) > 1 for n in names):
        raise ValueError(f"FAKETIME_SHARED is not '/SEM_NAME /SHM_NAME': {value!r}")
    sem, shm = (n[1:] for n in names)
    return [SHM_DIR / f"sem.{sem}", SHM_DIR / shm]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: faketime_shared.py COMMAND [ARG...]", file=sys.stderr)
        return 64
    value = os.environ.get("FAKETIME_SHARED")
    if value is None:
        print(
            "faketime_shared: FAKETIME_SHARED is unset: libfaketime is not preloaded",
            file=sys.stderr,
        )
        return 69
    for path in shared_files(value):
        path.chmod(0o666)
    os.execvp(argv[0], argv)
    return 70  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
