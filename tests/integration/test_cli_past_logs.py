"""``job logs --epoch N`` and ``--run ID --attempt K`` as a user meets them: the real CLI
against this test's own database and bucket (no server: every past log is read from S3),
each missing log or bad combination one line on stderr, exit 1, never a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler import distribution, runs
from server import clients, log_shipping
from server import settings as settings_module
from sql.states import JobKind
from testing import cli_runner, factories

OWNER = distribution.Owner("s1", "inc-1")


@pytest.fixture
def env(
    stack_env: dict[str, str], database_url: str, settings: settings_module.Settings
) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    # No registry: a live owner cannot be asked, so every log comes from the bucket.
    return {
        **base,
        **stack_env,
        "SPARKRING_DATABASE_URL": database_url,
        "SPARKRING_S3_BUCKET": settings.s3_bucket,
        "SPARKRING_ZK_HOSTS": "127.0.0.1:1",
    }


def _logs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_runner.run(("job", "logs", *args), env=env, timeout=60)


def _ship(
    settings: settings_module.Settings, tmp_path: Path, job: str, job_id: int, epoch: int
) -> str:
    """Ship a log for the epoch, as the runner does when its driver ended; its text."""
    text = f"the driver of epoch {epoch}\n"
    log = tmp_path / f"{epoch}.log"
    log.write_text(text)
    bucket = clients.bucket(settings)
    bucket.ensure_bucket()
    bucket.put(log_shipping.log_key(job, job_id, epoch), log, log.stat().st_size)
    return text


def _set_epoch(engine: sa.Engine, job_id: int, epoch: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET epoch = :e WHERE job_id = :id"),
            {"e": epoch, "id": job_id},
        )


def test_epoch_prints_that_drivers_log_and_says_which_is_missing(
    env: dict[str, str], engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    job_id = factories.job(engine, "talker", start=False)
    _set_epoch(engine, job_id, 3)
    first = _ship(settings, tmp_path, "talker", job_id, 1)
    last = _ship(settings, tmp_path, "talker", job_id, 3)
    assert _logs(env, "talker", "--epoch", "1").stdout == first
    assert _logs(env, "talker", "--epoch", "3").stdout == last
    assert _logs(env, "talker").stdout == last  # unchanged: the last run's
    cli_runner.one_line_error(
        _logs(env, "talker", "--epoch", "2"),
        "job talker: no log of epoch 2 is kept",
        "history retention",
    )
    cli_runner.one_line_error(
        _logs(env, "talker", "--epoch", "4"), "job talker has no epoch 4", "latest is 3"
    )


def test_epoch_with_run_or_follow_and_attempt_without_run_are_refused_by_name(
    env: dict[str, str], engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    job_id = factories.job(engine, "talker", start=False)
    _set_epoch(engine, job_id, 2)
    _ship(settings, tmp_path, "talker", job_id, 1)
    cli_runner.one_line_error(
        _logs(env, "talker", "--epoch", "1", "--run", "1"), "--epoch", "--run", "--attempt"
    )
    cli_runner.one_line_error(_logs(env, "talker", "--attempt", "1"), "--attempt", "--run")
    # Only the live driver can be followed: epoch 1 ended (and no run is live now).
    cli_runner.one_line_error(
        _logs(env, "talker", "--epoch", "1", "--follow"), "--follow", "epoch 1"
    )
    cli_runner.one_line_error(_logs(env, "talker", "--run", "1"), "streaming job")


def _run_with_two_attempts(engine: sa.Engine) -> tuple[int, dict]:
    """A batch job whose run crashed once, then finished on its retry (the epochs and the
    run row as the owner and the trigger write them)."""
    job_id = factories.job(engine, "nightly", kind=JobKind.BATCH, max_restarts=1)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, OWNER, ttl=30)
        distribution.mark_running(conn, job_id, OWNER, claim.epoch, pid=1)
        distribution.record_crash(
            conn, job_id, OWNER, claim.epoch, "driver exited with exit code 3",
            retry=True, backoff_base=0, backoff_max=0,
        )  # fmt: skip
        claim = distribution.claim(conn, job_id, OWNER, ttl=30)
        distribution.mark_running(conn, job_id, OWNER, claim.epoch, pid=2)
        distribution.finish(conn, job_id, OWNER, claim.epoch)
    with engine.connect() as conn:
        (run,) = runs.list_runs(conn, job_id)
    assert (run["attempts"], run["epoch"]) == (2, claim.epoch)
    return job_id, run


def test_run_attempt_prints_that_attempts_log(
    env: dict[str, str], engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    job_id, run = _run_with_two_attempts(engine)
    run_id = str(run["run_id"])
    failed = _ship(settings, tmp_path, "nightly", job_id, run["epoch"] - 1)
    finished = _ship(settings, tmp_path, "nightly", job_id, run["epoch"])
    assert _logs(env, "nightly", "--run", run_id, "--attempt", "1").stdout == failed
    assert _logs(env, "nightly", "--run", run_id, "--attempt", "2").stdout == finished
    assert _logs(env, "nightly", "--run", run_id).stdout == finished  # its last attempt
    cli_runner.one_line_error(
        _logs(env, "nightly", "--run", run_id, "--attempt", "3"),
        f"job nightly: run {run_id} made 2 attempts",
        "no attempt 3",
    )
    cli_runner.one_line_error(
        _logs(env, "nightly", "--run", "999999"), "job nightly has no run 999999"
    )


def test_a_run_attempts_log_not_kept_names_the_run_the_attempt_and_its_epoch(
    env: dict[str, str], engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    job_id, run = _run_with_two_attempts(engine)
    _ship(settings, tmp_path, "nightly", job_id, run["epoch"])
    epoch = run["epoch"] - 1
    cli_runner.one_line_error(
        _logs(env, "nightly", "--run", str(run["run_id"]), "--attempt", "1"),
        f"job nightly: no log of run {run['run_id']} attempt 1 (epoch {epoch}) is kept",
        "history retention",
    )


def test_the_help_names_the_new_options() -> None:
    shown = cli_runner.run(("job", "logs", "--help"), env=dict(os.environ), timeout=60).stdout
    text = " ".join(word for word in shown.split() if word != "│")  # the panels' borders
    for option in ("--epoch", "--run", "--attempt", "history retention"):
        assert option in text, text
