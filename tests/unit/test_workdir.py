"""The work directory's lock (server/workdir.py): one server process per work dir, and a
refusal that names the holder."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from server import workdir


def test_a_second_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    held = workdir.lock(tmp_path)
    try:
        with pytest.raises(workdir.WorkDirInUse, match=f"pid {os.getpid()}"):
            workdir.lock(tmp_path)
    finally:
        held.close()
    workdir.lock(tmp_path).close()  # free again once the holder is gone


def test_a_refusal_in_the_moment_before_the_holder_wrote_its_pid_still_names_it(
    tmp_path: Path,
) -> None:
    """The chaos case "two successors race for one work dir" (2026-11-25, final main): the
    loser read the lock file between the winner's flock and its pid write and said
    "pid unknown". It waits a moment for the pid."""
    holder = open(tmp_path / workdir.LOCK_FILE, "a+")
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder.truncate(0)

    def write_pid_late() -> None:
        holder.write("4242")
        holder.flush()

    timer = threading.Timer(0.2, write_pid_late)
    timer.start()
    try:
        with pytest.raises(workdir.WorkDirInUse, match="pid 4242"):
            workdir.lock(tmp_path)
    finally:
        timer.join()
        holder.close()
