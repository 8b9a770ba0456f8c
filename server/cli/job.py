"""``sparkring job``: define, start, stop and inspect jobs (all through SQL).

``job logs`` also reads ZooKeeper (the owner's address) and S3 (shipped logs); their
libraries are imported there only, so ``job list`` starts in a fraction of the time.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from scheduler import audit, health_policy, job_events, job_revisions, job_spec, job_views, jobs, tokens
from server import clients
from server.cli import console, schedules
from server.cli import resource as cli_resource
from sql import states
from sql.states import JobKind, RunState

app = typer.Typer(no_args_is_help=True, help="Define, start, stop and inspect jobs.")


# The schedule options of `job create` and `job update` (docs/schedules.md).
SCHEDULE_OPTION = typer.Option(
    None,
    "--schedule",
    help="Batch jobs: run on this schedule: a 5-field cron expression, a 6-field one "
    "(seconds first), '@every DURATION' (1s or more) or @hourly, @daily, @weekly, "
    "@monthly. 'job start' switches it on; 'job update' keeps the policies not given.",
)
TIMEZONE_OPTION = typer.Option(
    None, "--timezone", help="IANA zone of the cron fields (default UTC)."
)
MISFIRE_OPTION = typer.Option(
    None,
    "--misfire",
    help="run-once (default): the latest missed fire within --misfire-grace runs, late; "
    "skip: every missed fire is recorded skipped.",
)
MISFIRE_GRACE_OPTION = typer.Option(
    None, "--misfire-grace", help="How late a missed fire may still run (default 1h)."
)
RESTART_WINDOW_OPTION = typer.Option(
    None,
    "--restart-window",
    help="Streaming jobs: only crashes inside a window this long count against "
    "--max-restarts (e.g. 1h, 30m, 1d; 0: every crash since the last start). "
    "Default: 1h.",
    show_default=False,
)
ENV_HELP = (
    "Environment variable of the driver, KEY=VALUE; repeatable. Stored and shown by "
    "'job show': a credential goes in --secret-env."
)
REQUIREMENTS_HELP = (
    "A pip requirements file: the packages the job imports, built once (pip install "
    "--target with the servers' Python) into a deps artifact, given to the driver and "
    "its executors (docs/dependencies.md). A failed build changes nothing."
)
SECRET_ENV_HELP = (
    "Environment variable whose value is a secret's, KEY=SECRET_NAME (see 'sparkring "
    "secret'); repeatable. Only the job's driver gets the value, read when it starts."
)
HEALTHY_WITHIN_OPTION = typer.Option(
    None,
    "--healthy-within",
    metavar="DURATION",
    help="Auto-rollback: how long an update is watched, e.g. 5m, 90s, 1h (default 5m; "
    "stored with the setting). Healthy: by then the new revision's driver is running "
    "and has completed a micro-batch.",
    show_default=False,
)
CONCURRENCY_OPTION = typer.Option(
    None,
    "--concurrency",
    help="forbid (default): a fire while the previous run runs is recorded skipped; "
    "replace: that run is stopped and the fire's run starts.",
)


@app.command()
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Unique job name."),
    resource: str = typer.Option(
        ...,
        "--resource",
        help="Main artifact as NAME (latest version, pinned now) or NAME:VERSION.",
    ),
    kind: JobKind = typer.Option(JobKind.STREAMING, "--kind", help="streaming or batch."),
    py_files: list[str] = typer.Option(
        [], "--py-files", help="Extra artifact for --py-files (NAME[:VERSION]); repeatable."
    ),
    conf: list[str] = typer.Option([], "--conf", help="Spark conf KEY=VALUE; repeatable."),
    arg: list[str] = typer.Option([], "--arg", help="Argument passed to the job; repeatable."),
    env: list[str] = typer.Option([], "--env", help=ENV_HELP),
    secret_env: list[str] = typer.Option([], "--secret-env", help=SECRET_ENV_HELP),
    requirements: Path | None = typer.Option(None, "--requirements", help=REQUIREMENTS_HELP),
    master: str | None = typer.Option(
        None, "--master", help="Spark master for this job (default: SPARKRING_SPARK_MASTER)."
    ),
    max_restarts: int | None = typer.Option(
        None,
        "--max-restarts",
        min=0,
        help="Restarts after the driver fails (exits nonzero) before the job is FAILED, "
        "each after a backoff. Default: 3 for streaming, 0 for batch.",
        show_default=False,
    ),
    max_retries: int | None = typer.Option(
        None,
        "--max-retries",
        min=0,
        help="Batch jobs: runs again after the driver fails (exits nonzero) before the "
        "job is FAILED, each after a backoff (the same budget as --max-restarts). "
        "Default: 0.",
        show_default=False,
    ),
    restart_window: str | None = RESTART_WINDOW_OPTION,
    restart_on_stall: bool = typer.Option(
        False,
        "--restart-on-stall",
        help="Restart the job when its streaming query is flagged stalled (no new batch "
        "for the stall timeout). Default: flag only (docs/drivers.md, 'Health').",
    ),
    auto_rollback: bool = typer.Option(
        False,
        "--auto-rollback",
        help="Streaming jobs: watch every later update that rolls the running job, and "
        "roll it back to the revision before it if the new revision crashes, stalls or "
        "is not healthy within --healthy-within (docs/jobs.md). Default: off.",
    ),
    healthy_within: str | None = HEALTHY_WITHIN_OPTION,
    schedule: str | None = SCHEDULE_OPTION,
    timezone: str | None = TIMEZONE_OPTION,
    misfire: str | None = MISFIRE_OPTION,
    misfire_grace: str | None = MISFIRE_GRACE_OPTION,
    concurrency: str | None = CONCURRENCY_OPTION,
) -> None:
    """Define a job (stopped). Artifact versions are pinned at creation."""
    from resource_center import catalog

    if schedule is not None and kind != JobKind.BATCH:
        raise console.fail("--schedule is for batch jobs; a streaming job runs until stopped")
    the_schedule = schedules.parse(
        schedule,
        timezone=timezone,
        misfire=misfire,
        misfire_grace=misfire_grace,
        concurrency=concurrency,
    )
    conf_map = job_spec.parse_conf(conf)
    if restart_on_stall:
        conf_map[health_policy.RESTART_ON_STALL] = "true"
    budget = job_spec.restart_budget(kind, max_restarts, max_retries)
    engine = console.engine(ctx)
    main = catalog.resolve(engine, resource)
    extra = [catalog.resolve(engine, ref) for ref in py_files]
    env_map = job_spec.parse_env(env, "--env")
    secret_map = job_spec.parse_env(secret_env, "--secret-env")
    deps = cli_resource.deps_artifact(ctx, requirements) if requirements else None
    with engine.begin() as conn:
        jobs.create(
            conn,
            job_spec.JobSpec(
                name=name,
                kind=kind,
                resource_id=main.id,
                py_file_ids=[r.id for r in extra],
                conf=conf_map,
                args=arg,
                env=env_map,
                secret_env=secret_map,
                deps_id=deps.id if deps else None,
                spark_master=master,
                max_restarts=budget,
                restart_window_s=_window(restart_window),
                schedule=the_schedule,
                auto_rollback=auto_rollback,
                healthy_within_s=_healthy_within(healthy_within),
            ),
            actor=_actor(),
        )
    noun = "retries" if kind == JobKind.BATCH else "restarts"
    on = f", schedule {the_schedule['spec']}" if the_schedule else ""
    start_it = "switch its schedule on" if the_schedule else "start it"
    console.out.print(
        f"job {name} created ({kind.value}, {main.reference}, {noun} {budget}{on}); "
        f"{start_it} with 'sparkring job start {name}'"
    )


@app.command()
def update(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The job to revise."),
    resource: str | None = typer.Option(
        None,
        "--resource",
        help="New main artifact: NAME (latest version, pinned now) or NAME:VERSION.",
    ),
    py_files: list[str] = typer.Option(
        [],
        "--py-files",
        help="Extra artifact NAME[:VERSION]; repeatable; replaces the whole list.",
    ),
    no_py_files: bool = typer.Option(False, "--no-py-files", help="Remove every --py-files."),
    conf: list[str] = typer.Option(
        [], "--conf", help="Set Spark conf KEY=VALUE (other keys kept); repeatable."
    ),
    unset_conf: list[str] = typer.Option(
        [], "--unset-conf", help="Remove a Spark conf KEY; repeatable."
    ),
    arg: list[str] = typer.Option(
        [], "--arg", help="Argument passed to the job; repeatable; replaces every argument."
    ),
    no_args: bool = typer.Option(False, "--no-args", help="Remove every argument."),
    env: list[str] = typer.Option(
        [], "--env", help="Set a driver variable KEY=VALUE (others kept); repeatable."
    ),
    unset_env: list[str] = typer.Option(
        [], "--unset-env", help="Remove a driver variable KEY; repeatable."
    ),
    secret_env: list[str] = typer.Option(
        [],
        "--secret-env",
        help="Set a variable from a secret, KEY=SECRET_NAME (others kept); repeatable.",
    ),
    unset_secret_env: list[str] = typer.Option(
        [], "--unset-secret-env", help="Remove a secret variable KEY; repeatable."
    ),
    requirements: Path | None = typer.Option(
        None, "--requirements", help="New requirements file (built as for job create)."
    ),
    no_requirements: bool = typer.Option(
        False, "--no-requirements", help="Remove the job's dependencies."
    ),
    master: str | None = typer.Option(
        None,
        "--master",
        help="Spark master for this job ('' = back to SPARKRING_SPARK_MASTER).",
    ),
    max_restarts: int | None = typer.Option(
        None, "--max-restarts", min=0, help="Crash restarts before the job is FAILED."
    ),
    restart_window: str | None = RESTART_WINDOW_OPTION,
    restart: bool = typer.Option(
        False,
        "--restart",
        help="Also restart a running batch job now with the new revision "
        "(a running streaming job always rolls to it).",
    ),
    restart_on_stall: bool | None = typer.Option(
        None,
        "--restart-on-stall/--no-restart-on-stall",
        help="Restart the job when it is flagged stalled, or only flag it. A change of "
        "the conf like any other (a new revision). Default: kept as it is.",
        show_default=False,
    ),
    schedule: str | None = SCHEDULE_OPTION,
    timezone: str | None = TIMEZONE_OPTION,
    misfire: str | None = MISFIRE_OPTION,
    misfire_grace: str | None = MISFIRE_GRACE_OPTION,
    concurrency: str | None = CONCURRENCY_OPTION,
    no_schedule: bool = typer.Option(
        False, "--no-schedule", help="Remove the schedule (switches it off)."
    ),
    auto_rollback: bool | None = typer.Option(
        None,
        "--auto-rollback/--no-auto-rollback",
        help="Streaming jobs: turn the job's auto-rollback setting on (this update and "
        "every later one that rolls the running job is watched; back to the revision "
        "before it if it crashes, stalls or is not healthy within --healthy-within) or "
        "off (also ends a watch in progress). Makes no revision by itself. Default: "
        "kept as it is.",
        show_default=False,
    ),
    healthy_within: str | None = HEALTHY_WITHIN_OPTION,
) -> None:
    """Make a new revision of the job: the options given change it, the rest is kept.

    A running streaming job rolls to the new revision at once: its driver is stopped,
    then started again from the new revision with the same checkpoint (one move, fenced
    like a restart). A running batch job keeps its revision until its next run unless
    --restart. A job at rest uses it at its next start. Nothing changed: no revision.
    Artifact versions are pinned per revision: see 'job history' and 'job rollback'.
    """
    from resource_center import catalog

    if py_files and no_py_files:
        raise console.fail("--py-files and --no-py-files exclude each other")
    if arg and no_args:
        raise console.fail("--arg and --no-args exclude each other")
    conf_map = job_spec.parse_conf(conf)
    if restart_on_stall is not None:
        conf_map[health_policy.RESTART_ON_STALL] = "true" if restart_on_stall else "false"
    engine = console.engine(ctx)
    policies = (timezone, misfire, misfire_grace, concurrency)
    new_schedule = None
    if no_schedule and (schedule is not None or any(p is not None for p in policies)):
        raise console.fail("--no-schedule excludes --schedule and its policies")
    if schedule is not None or any(p is not None for p in policies):
        with engine.connect() as conn:
            current = job_views.show(conn, name).schedule
        new_schedule = schedules.parse(
            schedule,
            timezone=timezone,
            misfire=misfire,
            misfire_grace=misfire_grace,
            concurrency=concurrency,
            current={k: v for k, v in (current or {}).items() if k not in ("active", "next_fire")},
        )
    main = catalog.resolve(engine, resource) if resource is not None else None
    extra = [catalog.resolve(engine, ref) for ref in py_files]
    if requirements is not None and no_requirements:
        raise console.fail("--requirements and --no-requirements exclude each other")
    deps = cli_resource.deps_artifact(ctx, requirements) if requirements else None
    change = job_spec.Change(
        resource_id=main.id if main is not None else None,
        py_file_ids=[r.id for r in extra] if py_files else (() if no_py_files else None),
        conf=conf_map,
        unset_conf=unset_conf,
        args=arg if arg else (() if no_args else None),
        env=job_spec.parse_env(env, "--env"),
        unset_env=unset_env,
        secret_env=job_spec.parse_env(secret_env, "--secret-env"),
        unset_secret_env=unset_secret_env,
        deps_id=deps.id if deps else None,
        clear_deps=no_requirements,
        spark_master=master,
        max_restarts=max_restarts,
        restart_window_s=_window(restart_window),
        schedule=new_schedule,
        clear_schedule=no_schedule,
    )
    with engine.begin() as conn:
        revised = job_revisions.update(
            conn,
            name,
            change,
            restart=restart,
            actor=_actor(),
            auto_rollback=auto_rollback,
            healthy_within_s=_healthy_within(healthy_within),
        )
    setting = _setting_message(auto_rollback, healthy_within)
    console.out.print(_revised_message(name, revised) + setting)


def _setting_message(enabled: bool | None, healthy_within: str | None) -> str:
    """What an update said of the auto-rollback setting, appended to its line."""
    if enabled is False:
        return "; auto-rollback off"
    if enabled or healthy_within is not None:
        return "; auto-rollback setting saved"
    return ""


def _healthy_within(text: str | None) -> float | None:
    """``--healthy-within``: a duration (``5m``); None: not given."""
    return _duration(text, "--healthy-within", job_spec.parse_healthy_within)


def _window(text: str | None) -> float | None:
    """``--restart-window``: a duration (``1h``), or 0 for none; None: not given."""
    return _duration(text, "--restart-window", job_spec.parse_window)


def _duration(text: str | None, option: str, parse: Callable[[str], float]) -> float | None:
    """An option's duration parsed (None: not given); a bad one fails by the option's name."""
    if text is None:
        return None
    try:
        return parse(text)
    except job_spec.JobError as exc:
        raise console.fail(f"{option}: {exc}") from None


@app.command()
def rollback(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The job to roll back."),
    to: int | None = typer.Option(
        None, "--to", min=1, help="Revision to restore (default: the one before the current)."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="Also restart a running batch job now with it."
    ),
) -> None:
    """Make an earlier revision current again, as a new revision (history only grows).

    Applied to a running job as 'job update' is: a streaming job rolls to it, a batch
    run keeps its revision unless --restart.
    """
    engine = console.engine(ctx)
    with engine.begin() as conn:
        revised = job_revisions.rollback(conn, name, to, restart=restart, actor=_actor())
    console.out.print(_revised_message(name, revised))


def _revised_message(name: str, revised: job_revisions.Revised) -> str:
    """What ``update``/``rollback`` did and what happens to the run next, in one line."""
    if revised.effect is job_revisions.Effect.UNCHANGED:
        return f"job {name}: no change (still revision {revised.revision})"
    head = f"job {name}: revision {revised.revision} ({', '.join(revised.changed)} changed)"
    effect = {
        job_revisions.Effect.ROLLING: "rolling the running driver to it (stop, then start from the "
        "same checkpoint)",
        job_revisions.Effect.NEXT_CLAIM: "the job starts from it when it is next claimed",
        job_revisions.Effect.KEPT: f"the running batch run keeps revision {revised.run_revision}; "
        "the next run uses the new one (--restart to restart it now)",
        job_revisions.Effect.AT_REST: f"used at the next 'sparkring job start {name}'",
    }[revised.effect]
    if revised.watched_until is not None:
        until = console.text(revised.watched_until)
        effect += f"; auto-rollback watches it until {until} (back to {revised.previous})"
    return f"{head}; {effect}"


@app.command()
def history(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The job's revisions, oldest first, with what each changed (current and running
    ones marked)."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        rows = job_revisions.history(conn, name)
    if as_json:
        console.emit_json(rows)
        return
    console.table(
        ["revision", "created_at", "by", "resource", "changes"],
        [
            [
                str(r["revision"])
                + (" current" if r["current"] else "")
                + (" running" if r["running"] else ""),
                r["created_at"],
                r["created_by"],
                f"{r['resource']['name']}:{r['resource']['version']}",
                _changes(r),
            ]
            for r in rows
        ],
    )


def _changes(revision: dict[str, Any]) -> str:
    if revision["revision"] == 1 and not revision["diff"]:
        return "created"
    lines = list(revision["diff"])
    if revision["rollback_of"] is not None:
        lines.insert(0, f"rollback to revision {revision['rollback_of']}")
    return "; ".join(lines) or "-"


def _actor() -> str:
    """How job events name a CLI user (``detail.by``), as claimed; API writes name their
    token."""
    return audit.cli_actor()


def _command(ctx: typer.Context, name: str, action) -> None:
    engine = console.engine(ctx)
    with engine.begin() as conn:
        outcome = action(conn, name, actor=_actor())
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


@app.command()
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
        outcome = jobs.start(conn, name, actor=_actor())
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


@app.command()
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


@app.command()
def restart(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Stop the current driver and run the job again (a new generation)."""
    _command(ctx, name, jobs.restart)


@app.command()
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
        run_id = jobs.run_now(conn, name, actor=_actor())
    console.out.print(f"job {name}: run {run_id} pending")
    if wait:
        schedules.wait_run(engine, name, run_id, timeout)


@app.command()
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


@app.command()
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
            queued, taken = jobs.backfill(conn, name, start, end, dry_run=dry_run, actor=_actor())
        except ValueError as exc:
            raise console.fail(str(exc)) from None
    verb = "would queue" if dry_run else "queued"
    console.out.print(
        f"job {name}: {verb} {len(queued)} fire times"
        + (f" ({len(taken)} already have a run)" if taken else "")
    )
    for at in queued:
        console.out.print(f"  {schedules.iso(at)}")


@app.command()
def delete(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Delete a stopped job (its events and checkpoints are kept)."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        jobs.delete(conn, name, actor=_actor())
    console.out.print(f"job {name}: deleted")


@app.command("list")
def list_(
    ctx: typer.Context,
    state: RunState | None = typer.Option(
        None, "--state", help="Only jobs in this state (pending, running, failed...)."
    ),
    server: str | None = typer.Option(
        None, "--server", help="Only jobs this server owns or is the target of."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every job with its desired and actual state, owner and target."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        rows = job_views.list_jobs(conn)
    rows = [
        r
        for r in rows
        if (state is None or r.state == state) and (server is None or server in (r.owner, r.target))
    ]
    if as_json:
        console.emit_json([r.as_json() for r in rows])
        return
    console.table(
        [
            "name", "kind", "desired", "state", "owner", "target", "epoch", "restarts",
            "resource", "health", "schedule", "last run",
        ],
        [
            [
                r.name,
                r.kind,
                r.desired_text,
                r.state,
                r.owner,
                r.target,
                r.epoch,
                r.restarts_text,
                f"{r.resource['name']}:{r.resource['version']}",
                r.health_text,
                schedules.short_schedule(r.schedule),
                schedules.describe_run(r.last_run),
            ]
            for r in rows
        ],
    )  # fmt: skip


@app.command()
def show(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One job in full."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        job = job_views.show(conn, name)
    if as_json:
        console.emit_json(job.as_json())
        return
    shown = {**job.as_json(), "desired": job.desired_text, "restarts": job.restarts_text}
    shown.pop("crashes_in_window")
    window = (
        f"{job_revisions.window_text(job.restart_window_s)} "
        "(crashes in it count against max_restarts)"
        if job.restart_window_s
        else "none (every crash since the last start counts)"
    )
    shown = {
        ("restart_window" if key == "restart_window_s" else key): (
            window if key == "restart_window_s" else value
        )
        for key, value in shown.items()
    }
    shown.pop("health")
    shown["auto_rollback"] = _auto_rollback_text(job.auto_rollback)
    shown.update(_health_fields(job))
    console.fields((key, _shown(key, value)) for key, value in shown.items())


def _auto_rollback_text(setting: dict[str, Any]) -> str:
    """The ``auto_rollback`` line of ``job show``: the setting, and the watch if any."""
    within = job_revisions.window_text(setting["healthy_within_s"])
    text = f"on (healthy within {within})" if setting["enabled"] else "off"
    if (watch := setting["watch"]) is not None:
        text += (
            f"; watching revision {watch['revision']} until {watch['until']} "
            f"(back to {watch['fallback']} if not healthy)"
        )
    return text


def _health_fields(job: job_views.JobView) -> dict[str, Any]:
    """The health lines of ``job show``."""
    health = job.health
    if health is None:
        return {"health": "- (no report from the owner's health monitor)"}
    flag = job.flag
    app = health["app_id"] or "-"
    live = job.owner is not None
    if not live:
        # No live run (finished, failed, stopped, between runs): the owner's last report
        # is history, not the job's health now.
        line = "- (no live run)"
        app_state = f"ended with its run; last report at {console.text(health['checked_at'])}"
    else:
        line = f"{flag} since {console.text(health['flagged_at'])}" if flag else "ok"
        app_state = health["app_state"]
    fields: dict[str, Any] = {
        "health": line,
        "spark_app": f"{app} ({app_state})",
        "spark_ui": health["ui_url"] if live else None,
        "executors": (
            None
            if health["cores"] is None or not live
            else f"{health['executors']} ({health['cores']} cores)"
        ),
    }
    if job.kind == JobKind.STREAMING:
        batch = health["last_batch_id"]
        fields["last_batch"] = (
            None if batch is None else f"{batch} at {console.text(health['last_batch_at'])}"
        )
        rates = (health["input_rate"], health["processing_rate"])
        fields["rows_per_s"] = (
            None if None in rates else f"input {rates[0]:.1f}, processed {rates[1]:.1f}"
        )
    fields["health_checked_at"] = health["checked_at"]
    return fields


def _reference(resource: dict[str, Any]) -> str:
    return (
        f"{resource['name']}:{resource['version']} "
        f"(file {resource['filename']}, sha256 {resource['sha256']})"
    )


def _shown(key: str, value: Any) -> str:
    """A field of ``job show`` as text: artifacts by reference, never a Python repr."""
    if key == "resource":
        return _reference(value)
    if key == "py_files":
        return ", ".join(_reference(item) for item in value) or "-"
    if key == "args":
        return shlex.join(value) if value else "-"
    if key == "deps":
        return _reference(value) if value else "-"
    if key in ("env", "secret_env"):
        return console.text(value) if value else "-"
    if key == "schedule":
        return schedules.describe_schedule(value)
    if key == "last_run":
        return schedules.describe_run(value)
    return console.text(value)


@app.command()
def events(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    limit: int = typer.Option(50, "--limit", min=1, help="Newest N events."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The job's history: created, claimed, started, stopped, retargeted, reaped...

    One line per event, also when piped; a crash's error names the driver's first
    exception, a deferral its cause (e.g. cause=spark-master-unreachable)."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        rows = job_events.events(conn, name, limit)
    if as_json:
        console.emit_json(rows)
        return
    console.table(
        ["at", "kind", "server", "epoch", "detail"],
        [[r["at"], r["kind"], r["server"], r["epoch"], r["detail"]] for r in rows],
    )


# Exit code of a `job logs --follow` ended with Ctrl-C (128 + SIGINT, as a shell reports it).
FOLLOW_INTERRUPTED = 130
# `job logs --follow` across runs: how long it waits for the job's next run after one
# ended while the job is still wanted running (a restart, a roll, a failover), and how
# often it reads the job meanwhile, seconds; the exit code when no run came.
FOLLOW_NEXT_RUN_S = 120.0
FOLLOW_NEXT_POLL_S = 0.5
FOLLOW_NO_NEXT_RUN = 1
# The largest run id PostgreSQL's bigint holds (a larger --run would be a database error).
BIGINT_MAX = 2**63 - 1


@app.command()
def logs(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    lines: int = typer.Option(200, "--lines", "-n", min=1, help="Last N lines."),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Then keep printing what the driver writes. When a run ends and the job is "
        "still wanted running (a restart, a new revision, a failover), follow its next "
        "run; when the job is stopped, finished or failed, say so on stderr and exit 0; "
        f"exit {FOLLOW_NO_NEXT_RUN} if no next run starts within {FOLLOW_NEXT_RUN_S:g} s "
        "(Ctrl-C stops following). Without a live run: the last run's log. With --epoch "
        "of the live driver: that driver only, until it ends.",
    ),
    epoch: int | None = typer.Option(
        None,
        "--epoch",
        min=1,
        help="The log of this epoch's driver (each claim of the job is an epoch: 'job "
        "events' lists them), any job's: from its server while it runs, else from S3, "
        "kept under history retention (SPARKRING_HISTORY_RETENTION, 30d by default).",
    ),
    run_id: int | None = typer.Option(
        None,
        "--run",
        min=1,
        help="A batch job: the log of this run (see 'job runs'), of its last attempt "
        "unless --attempt; kept under history retention.",
    ),
    attempt: int | None = typer.Option(
        None,
        "--attempt",
        min=1,
        help="With --run: the log of the run's K-th attempt (1: its first driver). Each "
        "attempt (a retry, a run again after a lost server) is an epoch of its own.",
    ),
) -> None:
    """The driver log of the current run (from its server) or of the last run (from S3),
    as the driver wrote it (piped through unchanged; a follow's streams end with one
    '[sparkring] follow ended: ...' line saying why). An earlier driver's: --epoch N, or
    --run ID [--attempt K] for a batch run's."""
    _check_log_options(epoch, run_id, attempt, follow)
    settings = console.context(ctx).settings()
    engine = console.engine(ctx)
    with engine.begin() as conn:
        job = job_views.show(conn, name)
        secret = tokens.cluster_secret(conn)
    if run_id is not None:
        _run_log(engine, settings, job, run_id, attempt, lines, secret)
        return
    if epoch is not None:
        _epoch_log(engine, settings, job, epoch, lines, secret, follow)
        return
    if follow and job.owner:
        stream = _follow_live(settings, job, lines, secret)
        if stream is not None:
            try:
                _follow_runs(engine, settings, job, lines, secret, stream)
            except KeyboardInterrupt:
                raise typer.Exit(FOLLOW_INTERRUPTED) from None
            return
    text = _live_log(settings, job, lines, secret) if job.owner else None
    if text is None:
        text = _shipped_log(settings, job, lines)
    if text is None:
        raise console.fail(f"job {name} has no driver log yet")
    if follow:
        console.err.print(f"job {name} has no live run: the log of its last run", soft_wrap=True)
    console.write_raw(text)


def _check_log_options(
    epoch: int | None, run_id: int | None, attempt: int | None, follow: bool
) -> None:
    """``job logs``: the combinations of options that name no log, refused by name."""
    if epoch is not None and run_id is not None:
        raise console.fail(
            "--epoch and --run exclude each other (a run's attempt: --run ID --attempt K)"
        )
    if attempt is not None and run_id is None:
        raise console.fail("--attempt needs --run (the run whose attempt it is)")
    if run_id is not None and follow:
        raise console.fail("--run and --follow exclude each other")


def _epoch_log(
    engine: Any,
    settings: Any,
    job: job_views.JobView,
    epoch: int,
    lines: int,
    secret: str,
    follow: bool,
) -> None:
    """``job logs --epoch``: that driver's log (``past_logs.epoch_log``); with
    ``--follow``, the live driver's until it ends."""
    from server import past_logs

    if follow:
        if not past_logs.is_live(job, epoch):
            raise console.fail(
                f"--follow: the driver of epoch {epoch} of job {job.name} is not the live "
                "one, so its log is complete: drop --follow"
            )
        stream = _follow_live(settings, job, lines, secret)
        if stream is not None:
            try:
                _follow_runs(engine, settings, job, lines, secret, stream, this_run=True)
            except KeyboardInterrupt:
                raise typer.Exit(FOLLOW_INTERRUPTED) from None
            return
    _print_past_log(settings, job, epoch, lines, secret)


def _print_past_log(
    settings: Any,
    job: job_views.JobView,
    epoch: int,
    lines: int,
    secret: str,
    what: str | None = None,
) -> None:
    from server import past_logs

    try:
        text = past_logs.epoch_log(
            job,
            epoch,
            live=lambda: _live_log(settings, job, lines, secret),
            shipped=lambda e: _shipped_epoch(clients.bucket(settings), job, e, lines),
            what=what,
        )
    except past_logs.Missing as exc:
        raise console.fail(str(exc)) from None
    console.write_raw(text)


def _run_log(
    engine: Any,
    settings: Any,
    job: job_views.JobView,
    run_id: int,
    attempt: int | None,
    lines: int,
    secret: str,
) -> None:
    """``job logs --run [--attempt]``: the log of the run's attempt (its last by
    default), an epoch of its own: live from its owner while it runs, else from S3."""
    from scheduler import runs as run_rows
    from server import past_logs

    run = None
    if run_id <= BIGINT_MAX:  # a larger id is no run's (and no bigint)
        with engine.connect() as conn:
            run = run_rows.of_job(conn, job.id, run_id)
    try:
        attempt, epoch = past_logs.run_attempt(job, run_id, run, attempt)
    except past_logs.Missing as exc:
        raise console.fail(str(exc)) from None
    what = past_logs.attempt_label(run_id, attempt, epoch)
    _print_past_log(settings, job, epoch, lines, secret, what)


def _follow_runs(
    engine: Any,
    settings: Any,
    job: job_views.JobView,
    lines: int,
    secret: str,
    stream: Any,
    this_run: bool = False,
) -> None:
    """Print ``stream``; when it ends, follow the same run again (it went idle or hit
    its time limit) or the job's next run, until the job is no longer wanted running.
    ``this_run`` (``--epoch``): never the next run; say that this one ended."""
    from server.web import livelog

    name = job.name
    while True:
        tail = b""
        for chunk in stream:
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            tail = (tail + chunk)[-1024:]
        run_ended = livelog.ENDED + livelog.RUN_ENDED.encode() in tail
        deadline = time.monotonic() + FOLLOW_NEXT_RUN_S
        while True:
            with engine.connect() as conn:
                now = job_views.show(conn, name)
            new_run = now.epoch != job.epoch
            if this_run and (run_ended or new_run or not now.owner):
                console.err.print(
                    f"job {name}: the driver of epoch {job.epoch} ended", soft_wrap=True
                )
                return
            if now.desired != "running" or now.state in (
                RunState.FINISHED,
                RunState.FAILED,
            ):
                console.err.print(
                    f"job {name}: the run ended; the job is {now.state}", soft_wrap=True
                )
                return
            if now.owner and (new_run or not run_ended):
                stream = _follow_live(settings, now, lines if new_run else 0, secret)
                if stream is not None:
                    if new_run:
                        console.err.print(
                            f"job {name}: following its next run (epoch {now.epoch} on "
                            f"{now.owner})",
                            soft_wrap=True,
                        )
                    job = now
                    break
            if time.monotonic() >= deadline:
                raise console.fail(
                    f"job {name}: no run to follow within {FOLLOW_NEXT_RUN_S:g} s "
                    f"(state {now.state})",
                    FOLLOW_NO_NEXT_RUN,
                )
            time.sleep(FOLLOW_NEXT_POLL_S)


def _follow_live(settings: Any, job: job_views.JobView, lines: int, secret: str) -> Any:
    """The owner's live log, streamed (``livelog.follow_remote``), or None."""
    from server.web import livelog

    info = _owner(settings, job)
    if info is None:
        return None
    return livelog.follow_remote(
        info.health_url, job.name, lines, secret, verify=_peer_tls(settings)
    )


def _peer_tls(settings: Any) -> Any:
    """What the CLI verifies a server's HTTPS listener with (SPARKRING_TLS_CA)."""
    from server import tls

    try:
        return tls.client_context(settings.tls_ca)
    except tls.TlsError as exc:
        raise console.fail(str(exc)) from None


def _owner(settings: Any, job: job_views.JobView) -> Any:
    """The registry entry of the job's owner with an HTTP address, or None."""
    try:
        live = {info.id: info for info in clients.live_servers(settings)}
    except Exception:  # the registry is optional here: fall back to the shipped log
        return None
    info = live.get(job.owner)
    if info is None or not info.health_url:
        return None
    return info


def _live_log(settings: Any, job: job_views.JobView, lines: int, secret: str) -> str | None:
    from server.web import livelog

    info = _owner(settings, job)
    if info is None:
        return None
    # The owner serves logs only to token holders: the CLI presents the cluster credential.
    return livelog.fetch(info.health_url, job.name, lines, secret, verify=_peer_tls(settings))


def _shipped_log(
    settings: Any, job: job_views.JobView, lines: int, attempts: int = 3
) -> str | None:
    """The newest log shipped of the job's last ``attempts`` epochs, or None."""
    bucket = clients.bucket(settings)
    for epoch in range(job.epoch, max(job.epoch - attempts, 0), -1):
        text = _shipped_epoch(bucket, job, epoch, lines)
        if text is not None:
            return text
    return None


def _shipped_epoch(bucket: Any, job: job_views.JobView, epoch: int, lines: int) -> str | None:
    """The tail of the log the job's driver of ``epoch`` shipped to ``bucket``, or None."""
    from server import log_shipping
    from server.web import livelog

    return livelog.shipped_run(
        bucket,
        log_shipping.log_key(job.name, job.id, epoch),
        log_shipping.legacy_log_key(job.name, epoch),
        job.created_at,
        lines,
    )
