"""``job create/update --schedule``, ``job start/stop/run/runs/backfill`` of scheduled
and batch jobs as a user meets them: the real CLI (``python -m server``) against this
test's own database, stdout a pipe. No server runs: runs stay pending."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import sqlalchemy as sa

from testing import cli_runner, factories


@pytest.fixture
def run(stack_env: dict[str, str], database_url: str, engine: sa.Engine):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    env = {**base, **stack_env, "SPARKRING_DATABASE_URL": database_url}
    with engine.begin() as conn:
        factories.resource(conn, "app")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_runner.run(args, env=env, timeout=60)

    return cli


def _error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout.strip()


CREATE = ("job", "create", "nightly", "--resource", "app")


def test_bad_schedules_are_refused_in_one_line_and_nothing_is_written(run) -> None:
    for args, expected in [
        (("--kind", "batch", "--schedule", "61 * * * *"), "not a valid cron expression"),
        (("--kind", "batch", "--schedule", "@every 0s"), "1s or more"),
        (("--kind", "batch", "--schedule", "@daily", "--timezone", "Mars/Base"), "unknown"),
        (("--kind", "batch", "--schedule", "@daily", "--misfire", "often"), "--misfire"),
        (("--kind", "batch", "--schedule", "@daily", "--misfire-grace", "1y"), "duration"),
        (("--kind", "batch", "--schedule", "@daily", "--concurrency", "allow"), "forbid"),
        (("--kind", "streaming", "--schedule", "@daily"), "for batch jobs"),
        (("--kind", "batch", "--timezone", "UTC"), "--timezone needs --schedule"),
    ]:
        assert expected in _error(run(*CREATE, *args)), args
    assert json.loads(_ok(run("job", "list", "--json"))) == []


def test_a_scheduled_job_is_switched_on_by_start_and_off_by_stop(run) -> None:
    created = _ok(
        run(*CREATE, "--kind", "batch", "--schedule", "0 3 * * *", "--timezone", "Europe/Berlin")
    )
    assert "schedule 0 3 * * *" in created and "switch its schedule on" in created
    started = _ok(run("job", "start", "nightly"))
    assert started.startswith("job nightly: schedule on (next fire ")
    shown = json.loads(_ok(run("job", "show", "nightly", "--json")))
    assert shown["schedule"]["active"] and shown["schedule"]["next_fire"].endswith(":00:00Z")
    assert shown["state"] == "stopped"  # nothing runs before the first fire
    assert "0 3 * * * (Europe/Berlin), on, next fire" in _ok(run("job", "show", "nightly"))
    assert "0 3 * * * Europe/Berlin, next" in _ok(run("job", "list"))
    assert _ok(run("job", "start", "nightly")) == "job nightly: schedule already on"
    assert _ok(run("job", "stop", "nightly")) == "job nightly: stopped"
    shown = json.loads(_ok(run("job", "show", "nightly", "--json")))
    assert not shown["schedule"]["active"] and shown["schedule"]["next_fire"] is None


def test_update_changes_policies_as_a_revision_and_no_schedule_removes_it(run) -> None:
    _ok(run(*CREATE, "--kind", "batch", "--schedule", "@hourly"))
    done = _ok(run("job", "update", "nightly", "--concurrency", "replace"))
    assert "revision 2 (schedule changed)" in done
    schedule = json.loads(_ok(run("job", "show", "nightly", "--json")))["schedule"]
    assert (schedule["spec"], schedule["concurrency"]) == ("@hourly", "replace")
    assert "exclude" in _error(
        run("job", "update", "nightly", "--no-schedule", "--misfire", "skip")
    )
    assert "revision 3" in _ok(run("job", "update", "nightly", "--no-schedule"))
    assert json.loads(_ok(run("job", "show", "nightly", "--json")))["schedule"] is None


def test_run_runs_and_backfill(run) -> None:
    _ok(run(*CREATE, "--kind", "batch", "--schedule", "0 * * * *"))
    assert _ok(run("job", "run", "nightly")).startswith("job nightly: run ")
    assert "run in progress" in _error(run("job", "run", "nightly"))
    (manual,) = json.loads(_ok(run("job", "runs", "nightly", "--json")))
    assert (manual["trigger"], manual["state"], manual["scheduled_time"]) == (
        "manual",
        "pending",
        None,
    )
    assert set(manual) >= {
        "run_id", "scheduled_time", "trigger", "state", "reason", "started_at", "ended_at",
        "exit_code", "server", "epoch", "attempts",
    }  # fmt: skip
    dry = _ok(
        run(
            "job", "backfill", "nightly", "--from", "2026-01-01T00:00Z", "--to",
            "2026-01-01T02:30Z", "--dry-run",
        )
    )  # fmt: skip
    assert dry.splitlines() == [
        "job nightly: would queue 3 fire times",
        "  2026-01-01T00:00:00Z",
        "  2026-01-01T01:00:00Z",
        "  2026-01-01T02:00:00Z",
    ]
    _ok(
        run(
            "job", "backfill", "nightly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T02:30Z"
        )
    )
    queued = json.loads(_ok(run("job", "runs", "nightly", "--json", "--state", "queued")))
    assert [r["scheduled_time"] for r in queued] == [
        "2026-01-01T02:00:00Z",
        "2026-01-01T01:00:00Z",
        "2026-01-01T00:00:00Z",
    ]
    # Recorded like every operator command: a job event naming who asked (a dry run
    # writes nothing, and neither does a backfill that queued nothing).
    backfills = [
        e["detail"]
        for e in json.loads(_ok(run("job", "events", "nightly", "--json")))
        if e["detail"].get("trigger") == "backfill"
    ]
    assert len(backfills) == 1, backfills
    assert backfills[0]["by"].startswith("cli") and backfills[0]["queued"] == 3
    assert (backfills[0]["first"], backfills[0]["last"]) == (
        "2026-01-01T00:00:00Z",
        "2026-01-01T02:00:00Z",
    )
    _ok(
        run(
            "job", "backfill", "nightly", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T01:00Z"
        )
    )
    assert (
        sum(
            e["detail"].get("trigger") == "backfill"
            for e in json.loads(_ok(run("job", "events", "nightly", "--json")))
        )
        == 1
    )
    assert len(json.loads(_ok(run("job", "runs", "nightly", "--json", "--limit", "2")))) == 2
    assert "--state 'bogus'" in _error(run("job", "runs", "nightly", "--state", "bogus"))
    assert "--to is before --from" in _error(
        run("job", "backfill", "nightly", "--from", "2026-01-02", "--to", "2026-01-01")
    )


def test_run_wait_times_out_with_124_when_no_server_runs_it(run) -> None:
    _ok(run(*CREATE, "--kind", "batch"))
    result = run("job", "run", "nightly", "--wait", "--timeout", "0.5")
    assert "not ended after 0.5 s: pending" in _error(result, 124)
