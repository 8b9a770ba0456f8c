"""``sparkring job start``, ``stop``, ``restart``, ``run``, ``runs``, ``backfill`` and
``delete``: the commands of a job's life, and the ``--wait`` of those that take it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import typer

from scheduler import audit, job_views, jobs
from server.cli import console, schedules
from sql import states
from sql.states import JobKind, RunState


def _command(ctx: typer.Context, name: str, action) -> None:
    engine = console.engine(ctx)
    with engine.begin() as conn:
        outcome = action(conn, name, actor=audit.cli_actor())
    console.out.print(f"job {name}: {outcome}")


# How long `job start` waits for the coordinator's decision before it returns, seconds:
# long enough for a live coordinator (job commands are debounced by 0.05 s), short
# enough not to hold a script when none is elected.
START_DECISION_WAIT_S = 5.0


# `--wait`: how often the job's state is read again, seconds, and the exit codes of a
# wait that did not end in the state asked for (124 as timeout(1) exits).
WAIT_POLL_S = 0.2
WAIT_FAILED = 1
WAIT_TIMED_OUT = 124
WAIT_HELP = "Wait until the job reaches {what}; exit 1 if it fails, 124 after --timeout seconds."
TIMEOUT_HELP = "Seconds --wait waits at most."


def start(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Streaming: wait until the driver runs, exit 1 if the job fails. Batch: wait "
        "for the run to end (a scheduled job: its next run), exit 0 finished, 1 failed. "
        "Exit 124 after --timeout seconds.",
    ),
    timeout: float = typer.Option(300.0, "--timeout", min=0, help=TIMEOUT_HELP),
) -> None:
    """Run the job (idempotent: a job already running is left alone). A scheduled job:
    switch its schedule on (the next fire is computed from now); nothing runs before.

    A new job never evicts a running one: when every slot is taken it waits pending,
    first come first served, and this command says so ("pending: cluster full ...").
    """
    from scheduler import runs

    engine = console.engine(ctx)
    with engine.begin() as conn:
        job_id = job_views.job_id_of(conn, name)
        before = runs.last(conn, job_id)
        outcome = jobs.start(conn, name, actor=audit.cli_actor())
    if outcome.startswith("schedule"):
        console.out.print(f"job {name}: {outcome}")
        if wait:
            started = time.monotonic()
            run_id = schedules.next_run(
                engine, job_id, before["run_id"] if before else None, timeout
            )
            if run_id is None:
                raise console.fail(
                    f"job {name}: no run started within {timeout:g} s", WAIT_TIMED_OUT
                )
            schedules.wait_run(engine, name, run_id, timeout - (time.monotonic() - started))
        return
    if outcome == "already running" and not wait:
        console.out.print(f"job {name}: {outcome}")
        return
    deadline = time.monotonic() + START_DECISION_WAIT_S
    with engine.connect() as conn:
        job = job_views.show(conn, name)
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            job = job_views.show(conn, name)
        if job.target or job.pending_reason or job.state != "pending":
            break
        time.sleep(0.1)
    if job.pending_reason and not job.target:
        console.out.print(f"job {name}: {outcome}; pending: {job.pending_reason}")
    else:
        console.out.print(f"job {name}: {outcome}")
    if wait and job.kind == JobKind.BATCH:
        with engine.connect() as conn:
            last = runs.last(conn, job_id)
        if last is None:  # a run started by a release without runs rows
            _wait(engine, name, lambda j: j.state == RunState.FINISHED, timeout, "finished")
            return
        schedules.wait_run(engine, name, int(last["run_id"]), timeout)
    elif wait:
        _wait(engine, name, lambda j: j.state == RunState.RUNNING, timeout, "running")


def _wait(
    engine: Any,
    name: str,
    reached: Callable[[job_views.JobView], bool],
    timeout: float,
    what: str,
    *,
    failed_is_done: bool = False,
) -> None:
    """Read the job until ``reached``; print its state. A job that failed ends the wait
    with exit 1 (unless ``failed_is_done``: a stop is done when nothing runs), one that
    has not reached it after ``timeout`` seconds with exit 124, naming where it is."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            job = job_views.show(conn, name)
        if reached(job) or (failed_is_done and job.state == RunState.FAILED):
            console.out.print(f"job {name}: {job.state}")
            return
        if job.state == RunState.FAILED:
            raise console.fail(
                f"job {name} failed: {job.last_error or 'no error recorded'}", WAIT_FAILED
            )
        if time.monotonic() >= deadline:
            where = f"{job.state}"
            if job.owner:
                where += f" on {job.owner}"
            if job.pending_reason:
                where += f" ({job.pending_reason})"
            raise console.fail(
                f"job {name} not {what} after {timeout:g} s: {where}", WAIT_TIMED_OUT
            )
        time.sleep(WAIT_POLL_S)


def stop(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Wait until no driver of the job runs (stopped, or finished "
        "or failed at rest); exit 124 after --timeout seconds.",
    ),
    timeout: float = typer.Option(300.0, "--timeout", min=0, help=TIMEOUT_HELP),
) -> None:
    """Stop the job gracefully (idempotent). A scheduled job: its schedule is switched
    off too, and queued backfill runs are dropped (recorded skipped)."""
    _command(ctx, name, jobs.stop)
    if wait:
        _wait(
            console.engine(ctx),
            name,
            lambda j: j.owner is None and j.state in states.TERMINAL,
            timeout,
            "stopped",
            failed_is_done=True,
        )


def restart(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Stop the current driver and run the job again (a new generation)."""
    _command(ctx, name, jobs.restart)


def run(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    wait: bool = typer.Option(
        False, "--wait", help="Wait for the run to end: exit 0 finished, 1 failed."
    ),
    timeout: float = typer.Option(300.0, "--timeout", min=0, help=TIMEOUT_HELP),
) -> None:
    """Run a batch job once now, outside its schedule (refused while a run is in
    progress). Prints the run's id."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        run_id = jobs.run_now(conn, name, actor=audit.cli_actor())
    console.out.print(f"job {name}: run {run_id} pending")
    if wait:
        schedules.wait_run(engine, name, run_id, timeout)


def runs(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    limit: int = typer.Option(20, "--limit", min=1, help="Newest N runs."),
    state: str | None = typer.Option(
        None, "--state", help="Only runs in this state (finished, failed, skipped, ...)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The job's runs, newest first: fires of its schedule (skipped ones with their
    reason), manual runs and backfilled fire times. Times are UTC."""
    from scheduler import runs as run_rows

    if state is not None and state not in run_rows.STATES:
        raise console.fail(f"--state {state!r} is not one of {', '.join(run_rows.STATES)}")
    engine = console.engine(ctx)
    with engine.connect() as conn:
        rows = run_rows.list_runs(conn, job_views.job_id_of(conn, name), limit=limit, state=state)
    if as_json:
        console.emit_json(rows)
        return
    console.table(
        [
            "run_id", "scheduled_time", "trigger", "state", "started_at", "ended_at",
            "exit_code", "server", "epoch", "attempts", "reason",
        ],
        [
            [
                r["run_id"], r["scheduled_time"], r["trigger"], r["state"], r["started_at"],
                r["ended_at"], r["exit_code"], r["server"], r["epoch"], r["attempts"],
                r["reason"],
            ]
            for r in rows
        ],
    )  # fmt: skip


def backfill(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    from_: str = typer.Option(
        ..., "--from", help="First time (ISO-8601; no offset: the schedule's zone)."
    ),
    to: str = typer.Option(..., "--to", help="Last time, included (as --from)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the fire times only."),
) -> None:
    """Run each fire time of the job's schedule in [--from, --to] that never ran, oldest
    first, one at a time: those with no run and those recorded skipped (a fire time
    that already has a run is left out)."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        job = job_views.show(conn, name)
        if job.schedule is None:
            raise console.fail(f"job {name} has no schedule to backfill")
        zone = job.schedule["timezone"]
        start = schedules.parse_time(from_, zone, "--from")
        end = schedules.parse_time(to, zone, "--to")
        if end < start:
            raise console.fail("--to is before --from")
        try:
            queued, taken = jobs.backfill(
                conn, name, start, end, dry_run=dry_run, actor=audit.cli_actor()
            )
        except ValueError as exc:
            raise console.fail(str(exc)) from None
    verb = "would queue" if dry_run else "queued"
    console.out.print(
        f"job {name}: {verb} {len(queued)} fire times"
        + (f" ({len(taken)} already have a run)" if taken else "")
    )
    for at in queued:
        console.out.print(f"  {schedules.iso(at)}")


def delete(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Delete a stopped job (its events and checkpoints are kept)."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        jobs.delete(conn, name, actor=audit.cli_actor())
    console.out.print(f"job {name}: deleted")
