"""``sparkring job list``, ``show`` and ``events``: a job's listing
(``scheduler/job_views.py``) and its history, as a person reads them or as JSON."""

from __future__ import annotations

import shlex
from typing import Any

import typer

from scheduler import job_events, job_revisions, job_views
from server.cli import console, schedules
from sql.states import JobKind, RunState


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
