"""``sparkring job create``, ``update``, ``rollback`` and ``history``: a job's definition
and its revisions (``scheduler/jobs.py``, ``scheduler/job_revisions.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from scheduler import audit, health_policy, job_revisions, job_spec, job_views, jobs
from server.cli import console, schedules
from server.cli import resource as cli_resource
from sql.states import JobKind

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
            actor=audit.cli_actor(),
        )
    noun = "retries" if kind == JobKind.BATCH else "restarts"
    on = f", schedule {the_schedule['spec']}" if the_schedule else ""
    start_it = "switch its schedule on" if the_schedule else "start it"
    console.out.print(
        f"job {name} created ({kind.value}, {main.reference}, {noun} {budget}{on}); "
        f"{start_it} with 'sparkring job start {name}'"
    )


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
            actor=audit.cli_actor(),
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
        revised = job_revisions.rollback(conn, name, to, restart=restart, actor=audit.cli_actor())
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
