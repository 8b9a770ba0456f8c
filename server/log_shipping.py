"""Shipping a finished run's driver log to the bucket, and where it lands.

A run's ``driver.log`` (``rundir.LOG_FILE``) is uploaded once its driver has ended, by a
task of the runner (``server/runner.py``): under :func:`log_key`, below the job's name
and id. Logs shipped by the code before ids are read under :func:`legacy_log_key`.
A failed upload is logged and given up: the run's outcome never waits for its log.
"""

from __future__ import annotations

import logging

from resource_center import errors, store
from server import runs

log = logging.getLogger(__name__)


def log_key(job: str, job_id: int, epoch: int) -> str:
    """Where a finished run's driver log is shipped in the bucket: below the job's name
    (to browse) and id (a deleted namesake's logs are never the job's: hole H6)."""
    return f"logs/{job}/{job_id}/{epoch:010d}.log"


def legacy_log_key(job: str, epoch: int) -> str:
    """Where the code before :func:`log_key` shipped a run's log (name and epoch only)."""
    return f"logs/{job}/{epoch:010d}.log"


def ship(bucket: store.Store, run: runs.Run) -> None:
    """Upload ``run``'s driver log, if it has one."""
    if run.driver is None or not run.driver.log_file.exists():
        return
    path = run.driver.log_file
    try:
        bucket.put(log_key(run.name, run.job_id, run.epoch), path, path.stat().st_size)
    except errors.ResourceError as exc:
        log.warning(
            "could not ship the driver log",
            extra={"action": "ship_log", "job": run.name, "error": str(exc)},
        )
