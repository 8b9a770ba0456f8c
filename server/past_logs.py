"""Past driver logs: the log of one epoch's driver, and of a batch run's K-th attempt.

Every claim of a job takes the next epoch and starts at most one driver. Its log is
``driver.log`` on the owner while it runs and, once it ended, the object
``log_shipping.log_key(name, id, epoch)`` in the bucket, kept under history retention
(server/retention.py). So any earlier driver's log is read by its epoch: from the
owner if that epoch is the live one, else from the bucket.

A batch run's attempts are its claims: a retry after its driver failed, and a run
again after its owner was lost, each take a new epoch; a run is never retried in the
same epoch. While a run is unended nothing else claims its job, so its attempts are
consecutive epochs, and its ``runs`` row keeps the epoch of the last and their count
(``attempts``, written by the trigger ``distribution_runs_follow``): attempt K ran as
epoch ``epoch - attempts + K`` (:func:`attempt_epoch`).

The CLI (``job logs --epoch``, ``--run --attempt``) and the API (``/jobs/{name}/logs?
epoch=``, ``/jobs/{name}/runs/{run_id}/logs?attempt=``) read through :func:`epoch_log`
and say the same one line (:class:`Missing`) when a log is not there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from scheduler import job_views

# Why an ended driver's log may not be in the bucket.
NOT_KEPT_WHY = (
    "history retention (SPARKRING_HISTORY_RETENTION, 30d by default) may have pruned it, "
    "or it was never shipped (no driver started, or the upload failed)"
)


class Missing(Exception):
    """No such log, in one line: which log, and why it may be missing."""


def attempt_epoch(run: Mapping[str, Any], attempt: int) -> int:
    """The epoch the run's ``attempt``-th attempt (from 1) ran as."""
    return run["epoch"] - run["attempts"] + attempt


def attempt_label(run_id: int, attempt: int, epoch: int) -> str:
    return f"run {run_id} attempt {attempt} (epoch {epoch})"


def run_attempt(
    job: job_views.JobView, run_id: int, run: Mapping[str, Any] | None, attempt: int | None
) -> tuple[int, int]:
    """The run's ``attempt`` (None: its last) and the epoch it ran as. ``run`` is the
    job's row of ``run_id`` (``scheduler.runs.view``), None if it has none."""
    name = job.name
    if run is None:
        if job.kind == "streaming":
            raise Missing(
                f"job {name} is a streaming job, which has no runs: "
                "read one of its drivers' logs by its epoch"
            )
        raise Missing(
            f"job {name} has no run {run_id} ('job runs' lists them; history retention "
            "prunes runs that ended before its cutoff)"
        )
    if not run["attempts"] or run["epoch"] is None:
        raise Missing(f"job {name}: run {run_id} ({run['state']}) started no driver")
    if attempt is None:
        return run["attempts"], run["epoch"]
    if not 1 <= attempt <= run["attempts"]:
        made = run["attempts"]
        raise Missing(
            f"job {name}: run {run_id} made {made} attempt{'s' if made != 1 else ''}, "
            f"there is no attempt {attempt}"
        )
    return attempt, attempt_epoch(run, attempt)


def is_live(job: job_views.JobView, epoch: int) -> bool:
    """Whether ``epoch`` is the job's current run (its log is on its owner)."""
    return job.owner is not None and epoch == job.epoch


def epoch_log(
    job: job_views.JobView,
    epoch: int,
    *,
    live: Callable[[], str | None],
    shipped: Callable[[int], str | None],
    what: str | None = None,
) -> str:
    """The tail of the log of the job's driver of ``epoch``: ``live()`` (its owner's
    answer) when that is the current run, else (or when the owner did not answer)
    ``shipped(epoch)``, the copy in the bucket. ``what`` names the log in the message
    of :class:`Missing` (default ``epoch N``)."""
    name, what = job.name, what or f"epoch {epoch}"
    if epoch > job.epoch:
        latest = job.epoch
        since = f"its latest is {latest}" if latest else "it has never run"
        raise Missing(f"job {name} has no epoch {epoch}: {since}")
    current = is_live(job, epoch)
    text = live() if current else None
    if text is None:
        text = shipped(epoch)
    if text is not None:
        return text
    if current:
        raise Missing(
            f"job {name}: {what} is the current run, on {job.owner}, which did not serve "
            "its log (not answering, or its driver has not started); a driver's log is "
            "shipped to S3 when it ends"
        )
    raise Missing(f"job {name}: no log of {what} is kept: {NOT_KEPT_WHY}")
