"""What the job commands need of schedules and runs: options to a checked schedule,
waiting for a run's end, and the one-line texts of a schedule and a run.

``job create/update --schedule ...`` parse here (``scheduler/schedule.py`` checks;
every problem is one line naming it); ``job start/run --wait`` on a batch job wait
here for the run to end: exit 0 finished, 1 failed (or stopped, replaced), 124 when
``--timeout`` passed first.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from scheduler import runs, schedule
from server.cli import console

# Exit codes of a wait for a run (as `job start --wait`): 124 as timeout(1) exits.
RUN_FINISHED = 0
RUN_FAILED = 1
RUN_TIMED_OUT = 124
# How often a waited-for run is read again, seconds.
RUN_POLL_S = 0.2


def parse(
    spec: str | None,
    *,
    timezone: str | None,
    misfire: str | None,
    misfire_grace: str | None,
    concurrency: str | None,
    current: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The schedule the options give (``schedule.from_options``); a problem ends the
    command with its one line."""
    try:
        return schedule.from_options(
            spec,
            timezone=timezone,
            misfire=misfire,
            misfire_grace=misfire_grace,
            concurrency=concurrency,
            current=current,
        )
    except schedule.ScheduleError as exc:
        raise console.fail(str(exc)) from None


def parse_time(text: str, timezone: str, option: str) -> datetime:
    """``--from``/``--to``: ISO-8601; without an offset, a local time of ``timezone``."""
    from zoneinfo import ZoneInfo

    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise console.fail(
            f"{option} {text!r} is not an ISO-8601 time (e.g. 2026-11-25T02:00 or ...Z)"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=ZoneInfo(timezone))


def iso(at: datetime) -> str:
    return schedule.iso(at)


def describe_schedule(value: dict[str, Any] | None) -> str:
    """``job show``: the schedule in one line."""
    if value is None:
        return "-"
    state = f"on, next fire {value['next_fire']}" if value.get("active") else "off"
    grace = schedule.format_duration(float(value["misfire_grace_s"]))
    return (
        f"{value['spec']} ({value['timezone']}), {state}; misfire {value['misfire']} "
        f"(grace {grace}), concurrency {value['concurrency']}"
    )


def short_schedule(value: dict[str, Any] | None) -> str:
    """``job list``: the schedule column."""
    if value is None:
        return "-"
    zone = "" if value["timezone"] == "UTC" else f" {value['timezone']}"
    state = f"next {value['next_fire']}" if value.get("active") else "off"
    return f"{value['spec']}{zone}, {state}"


def describe_run(value: dict[str, Any] | None) -> str:
    """The last run's outcome in one line."""
    if value is None:
        return "-"
    text = f"run {value['run_id']} ({value['trigger']}) {value['state']}"
    if value.get("exit_code") is not None:
        text += f", exit {value['exit_code']}"
    return text


def wait_run(engine: sa.Engine, name: str, run_id: int, timeout: float) -> None:
    """Read run ``run_id`` until it ends; print how, and exit 0 (finished), 1 (failed,
    stopped, replaced, skipped) or 124 (not ended after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            run = runs.get(conn, run_id)
        if run is None:
            raise console.fail(f"job {name}: run {run_id} is gone (the job was deleted)")
        if run["state"] == "finished":
            console.out.print(f"job {name}: run {run_id} finished (exit code 0)")
            return
        if run["state"] in runs.ENDED:
            # As `job start --wait` of a failing job always said: the job, then the error.
            reason = run["reason"] or "no error recorded"
            raise console.fail(f"job {name} {run['state']}: {reason} (run {run_id})", RUN_FAILED)
        if time.monotonic() >= deadline:
            raise console.fail(
                f"job {name}: run {run_id} not ended after {timeout:g} s: {run['state']}",
                RUN_TIMED_OUT,
            )
        time.sleep(RUN_POLL_S)


def next_run(engine: sa.Engine, job_id: int, after: int | None, timeout: float) -> int | None:
    """The id of the job's first run (not skipped) newer than run ``after``, waiting up
    to ``timeout`` seconds for it (a scheduled job's next fire); None if none came."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            last = runs.last(conn, job_id)
        if last is not None and (after is None or last["run_id"] > after):
            return int(last["run_id"])
        if time.monotonic() >= deadline:
            return None
        time.sleep(RUN_POLL_S)
