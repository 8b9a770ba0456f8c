"""History retention on the real PostgreSQL and S3: what a prune deletes and keeps, its
batches, the dry run, shipped driver logs, the CLI, and the servers' pass (advisory lock,
a side thread that outlives failures)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import store
from scheduler import job_spec, jobs
from server import clients, log_shipping, retention
from server import settings as settings_module
from sql import database
from sql.states import JobKind
from testing import cli_runner, factories, services, waiting

DAY = 86400.0
GONE_JOB_ID = 987654  # events outlive their job: no jobs row has this id


def _old(engine: sa.Engine, *, days: float, where: str = "TRUE") -> None:
    """Move events back in time (an event's ``at`` is PostgreSQL's now() when written)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE job_events SET at = now() - make_interval(days => :d) WHERE {where}"),
            {"d": days},
        )


def _events_of_a_gone_job(engine: sa.Engine, count: int, *, days: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO job_events (job_id, job_name, kind, at) "
                "SELECT :id, 'gone', 'claimed', now() - make_interval(days => :d) "
                "FROM generate_series(1, :n)"
            ),
            {"id": GONE_JOB_ID, "d": days, "n": count},
        )


def _kinds(engine: sa.Engine) -> dict[str, list[str]]:
    """Remaining events: kinds by job name, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT job_name, kind FROM job_events ORDER BY id")).all()
    kinds: dict[str, list[str]] = {}
    for name, kind in rows:
        kinds.setdefault(name, []).append(kind)
    return kinds


def _prune(
    engine: sa.Engine,
    older_than: float,
    *,
    batch_size: int = 1000,
    dry_run: bool = False,
    keep_going: Callable[[], bool] = lambda: True,
) -> retention.Pruned:
    with engine.connect() as conn:
        return retention.prune(
            conn,
            None,
            retention.cutoff(conn, older_than),
            batch_size=batch_size,
            dry_run=dry_run,
            keep_going=keep_going,
        )


# --------------------------------------------------------------------------- events


def test_old_events_go_recent_stay_and_each_live_jobs_newest_is_kept(engine: sa.Engine) -> None:
    factories.job(engine, "old")  # created, start_requested
    factories.job(engine, "fresh")
    _old(engine, days=40, where="job_name = 'old'")
    _events_of_a_gone_job(engine, 3, days=40)
    _events_of_a_gone_job(engine, 1, days=1)

    pruned = _prune(engine, 30 * DAY)

    # old: only its newest event stays (it still exists); gone: its old events go by age.
    assert _kinds(engine) == {
        "old": ["start_requested"],
        "fresh": ["created", "start_requested"],
        "gone": ["claimed"],
    }
    assert (pruned.events, pruned.event_batches, pruned.logs) == (4, 1, None)
    # A second prune finds nothing: the kept newest event is not deleted later either.
    assert _prune(engine, 30 * DAY).events == 0


class _YearAhead(datetime):
    """This host's clock, a year ahead of PostgreSQL's."""

    @classmethod
    def now(cls, tz=None):  # type: ignore[no-untyped-def]
        return datetime.now(tz) + timedelta(days=365)


def test_the_cutoff_is_postgresqls_clock_so_a_server_clock_ahead_deletes_nothing_recent(
    engine: sa.Engine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events' ``at`` is PostgreSQL's now(); a server whose clock runs a year ahead (NTP
    gone, a bad step) must not count a minute-old event as a year old."""
    _events_of_a_gone_job(engine, 2, days=3)
    _events_of_a_gone_job(engine, 3, days=0)
    monkeypatch.setattr(retention, "datetime", _YearAhead)
    pass_engine = database.create_engine(database_url, pool_size=1)
    try:
        pruned = retention.run_pass(pass_engine, None, DAY, batch_size=10)
    finally:
        pass_engine.dispose()
    assert pruned is not None and pruned.events == 2
    assert _kinds(engine) == {"gone": ["claimed"] * 3}
    with engine.connect() as conn:
        db_now = conn.execute(sa.select(sa.func.now())).scalar_one()
        assert abs((db_now - timedelta(days=1) - pruned.cutoff).total_seconds()) < 60
        assert retention.cutoff(conn, 0) >= db_now  # and it left conn ready for prune
        assert retention.prune(conn, None, retention.cutoff(conn, DAY), batch_size=10).events == 0


def test_a_deleted_jobs_events_all_go_by_age(engine: sa.Engine) -> None:
    from scheduler import jobs

    factories.job(engine, "doomed", start=False)
    with engine.begin() as conn:
        jobs.delete(conn, "doomed")
    _old(engine, days=2)
    assert _prune(engine, DAY).events == 2  # created, deleted: none kept
    assert _kinds(engine) == {}


@pytest.mark.parametrize(("rows", "batches"), [(5, 3), (4, 2), (1, 1), (0, 0)])
def test_events_go_in_batches_of_batch_size(engine: sa.Engine, rows: int, batches: int) -> None:
    _events_of_a_gone_job(engine, rows, days=10)
    _events_of_a_gone_job(engine, 2, days=1)  # recent: kept
    pruned = _prune(engine, 5 * DAY, batch_size=2)
    assert (pruned.events, pruned.event_batches) == (rows, batches)
    assert pruned.longest_batch_s >= 0
    assert _kinds(engine) == {"gone": ["claimed", "claimed"]}


def test_a_prune_stops_between_batches_when_asked(engine: sa.Engine) -> None:
    _events_of_a_gone_job(engine, 5, days=10)
    calls = []

    def keep_going() -> bool:
        calls.append(1)
        return len(calls) <= 2  # two batches, then stop

    pruned = _prune(engine, DAY, batch_size=2, keep_going=keep_going)
    assert (pruned.events, pruned.event_batches) == (4, 2)
    assert len(_kinds(engine)["gone"]) == 1


def test_dry_run_deletes_nothing_and_counts_what_a_prune_deletes(engine: sa.Engine) -> None:
    factories.job(engine, "old")
    _old(engine, days=40)
    _events_of_a_gone_job(engine, 5, days=40)
    before = _kinds(engine)

    dry = _prune(engine, 30 * DAY, batch_size=2, dry_run=True)
    assert _kinds(engine) == before
    real = _prune(engine, 30 * DAY, batch_size=2)
    assert (dry.dry_run, real.dry_run) == (True, False)
    assert (dry.events, dry.event_batches) == (real.events, real.event_batches) == (6, 3)


# ------------------------------------------------------------------------- driver logs


def _bucket(settings: settings_module.Settings) -> store.Store:
    bucket = clients.bucket(settings)
    bucket.ensure_bucket()
    return bucket


def _ship(bucket: store.Store, tmp_path: Path, key: str) -> str:
    log = tmp_path / "driver.log"
    log.write_text(f"the log shipped to {key}\n")
    bucket.put(key, log, log.stat().st_size)
    return key


def test_shipped_logs_older_than_the_cutoff_go_and_each_live_jobs_newest_stays(
    engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    bucket = _bucket(settings)
    live = factories.job(engine, "live")
    gone = live + 1000  # a deleted job's id
    keys = [
        _ship(bucket, tmp_path, log_shipping.log_key(name, job_id, epoch))
        for name, job_id in (("live", live), ("gone", gone))
        for epoch in (1, 2)
    ]
    # A deleted namesake of "live" (same name, another id) ran to a higher epoch: its
    # log is not live's newest, and goes by age (hole H6).
    keys.append(_ship(bucket, tmp_path, log_shipping.log_key("live", gone, 7)))
    artifact = tmp_path / "artifact"
    artifact.write_bytes(b"x")
    bucket.put(store.object_key("0" * 64), artifact, 1)  # not a log: never touched
    modified = dict(bucket.listed(retention.LOG_PREFIX))
    assert set(modified) == set(keys)

    # S3 sets LastModified itself, so the cutoff moves instead: a chosen time. A log
    # exactly as old as the cutoff is not older than it.
    with engine.connect() as conn:
        at_oldest = min(modified.values())
        kept_all = retention.prune(conn, bucket, at_oldest, batch_size=10, dry_run=False)
        assert kept_all.logs == 0
        after_all = max(modified.values()) + timedelta(milliseconds=1)
        dry = retention.prune(conn, bucket, after_all, batch_size=10, dry_run=True)
        assert dry.logs == 4 and set(dict(bucket.listed(retention.LOG_PREFIX))) == set(keys)
        pruned = retention.prune(conn, bucket, after_all, batch_size=10)
    assert pruned.logs == 4
    assert [key for key, _ in bucket.listed(retention.LOG_PREFIX)] == [
        log_shipping.log_key("live", live, 2)
    ]
    assert bucket.exists(store.object_key("0" * 64))


def test_a_bucket_never_created_holds_no_logs_to_prune(
    engine: sa.Engine, settings: settings_module.Settings
) -> None:
    """A new cluster's first pass: nothing was ever uploaded, so there is no bucket."""
    bucket = clients.bucket(settings)  # this test's bucket name, never created
    _events_of_a_gone_job(engine, 1, days=3)
    with engine.connect() as conn:
        pruned = retention.prune(conn, bucket, retention.cutoff(conn, DAY), batch_size=10)
    assert (pruned.events, pruned.logs) == (1, 0)


def test_which_logs_may_go() -> None:
    now = datetime(2026, 11, 24, tzinfo=UTC)
    old, new = now - timedelta(days=40), now - timedelta(days=1)
    listed = [
        ("logs/a/0000000001.log", old),
        ("logs/a/0000000010.log", old),  # a's newest: kept while a exists
        ("logs/b/0000000003.log", old),
        ("logs/c/0000000002.log", new),
    ]
    cutoff = now - timedelta(days=30)
    assert retention.prunable_logs(listed, cutoff, {"a", "c"}) == [
        "logs/a/0000000001.log",
        "logs/b/0000000003.log",
    ]
    assert retention.prunable_logs(listed, cutoff, set()) == [
        "logs/a/0000000001.log",
        "logs/a/0000000010.log",
        "logs/b/0000000003.log",
    ]


def test_which_logs_may_go_when_a_name_was_reused() -> None:
    """Job a (id 5) was deleted and created again (id 9); the older code's logs of a
    carry no id. Each existing job keeps its newest log; a deleted namesake's go by age."""
    now = datetime(2026, 11, 24, tzinfo=UTC)
    old = now - timedelta(days=40)
    listed = [
        ("logs/a/0000000004.log", old),  # the older code's: kept as a's newest by name
        (log_shipping.log_key("a", 5, 3), old),  # the deleted a's
        (log_shipping.log_key("a", 9, 1), old),  # the existing a's newest: kept
    ]
    existing = retention.log_owners([("a", 9)])
    assert retention.prunable_logs(listed, now - timedelta(days=30), existing) == [
        log_shipping.log_key("a", 5, 3)
    ]


# ----------------------------------------------------------------------------- CLI


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    return cli_runner.run(args, env={**base, **env}, timeout=60)


@pytest.fixture
def env(stack_env: dict[str, str], database_url: str) -> dict[str, str]:
    return {**stack_env, "SPARKRING_DATABASE_URL": database_url}


def test_cli_prunes_events_without_s3_settings_when_asked(
    env: dict[str, str], engine: sa.Engine
) -> None:
    _events_of_a_gone_job(engine, 3, days=3)
    _events_of_a_gone_job(engine, 1, days=1)
    db_only = {k: v for k, v in env.items() if not k.startswith("SPARKRING_S3_")}

    dry = _run(db_only, "events", "prune", "--older-than", "2d", "--events-only", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would delete 3 job events"), dry.stdout

    refused = _run(db_only, "events", "prune", "--older-than", "2d")
    assert refused.returncode == 78, refused.stderr  # the logs need S3: its settings named
    assert "SPARKRING_S3_ENDPOINT is not set" in refused.stderr

    done = _run(db_only, "events", "prune", "--older-than", "48h", "--events-only", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["events"], figures["event_batches"], figures["logs"]) == (3, 1, None)
    assert len(_kinds(engine)["gone"]) == 1


def test_cli_prunes_logs_too_and_takes_the_setting_as_default(
    env: dict[str, str], engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    bucket = _bucket(settings)
    _ship(bucket, tmp_path, log_shipping.log_key("gone", 10**9, 1))
    _events_of_a_gone_job(engine, 2, days=3)
    s3 = {**env, "SPARKRING_S3_BUCKET": settings.s3_bucket}
    # The setting (2 days) is the default age; the log is seconds old, so it stays.
    result = _run({**s3, "SPARKRING_HISTORY_RETENTION": "2d"}, "events", "prune", "--json")
    assert result.returncode == 0, result.stderr
    assert (json.loads(result.stdout)["events"], json.loads(result.stdout)["logs"]) == (2, 0)
    assert bucket.listed(retention.LOG_PREFIX)

    forever = _run({**s3, "SPARKRING_HISTORY_RETENTION": "0"}, "events", "prune")
    assert forever.returncode == 2 and "--older-than" in forever.stderr


@pytest.mark.parametrize("value", ["5x", "-1d", "1 week", ""])
def test_a_bad_duration_is_a_usage_error(env: dict[str, str], value: str) -> None:
    result = _run(env, "events", "prune", "--older-than", value, "--events-only")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Invalid value for '--older-than'" in result.stderr
    assert "must be a duration like 30d" in result.stderr


def test_a_bad_retention_setting_is_a_settings_error(env: dict[str, str]) -> None:
    result = _run({**env, "SPARKRING_HISTORY_RETENTION": "30 days"}, "job", "list")
    assert result.returncode == 78
    assert "SPARKRING_HISTORY_RETENTION: must be a duration" in result.stderr
    assert "30 days" not in result.stderr


# --------------------------------------------------------------------- server's pass


def test_the_server_pass_prunes_by_the_setting_unless_another_server_holds_the_lock(
    engine: sa.Engine, database_url: str
) -> None:
    _events_of_a_gone_job(engine, 3, days=3)
    pass_engine = database.create_engine(database_url, pool_size=1)
    try:
        assert retention.run_pass(pass_engine, None, 0, batch_size=10) is None  # forever
        with engine.connect() as holder:
            holder.execute(sa.select(sa.func.pg_advisory_lock(retention.LOCK_KEY)))
            holder.commit()
            assert retention.run_pass(pass_engine, None, DAY, batch_size=10) is None
            assert len(_kinds(engine)["gone"]) == 3  # the holder prunes, not us
            holder.execute(sa.select(sa.func.pg_advisory_unlock(retention.LOCK_KEY)))
            holder.commit()
        pruned = retention.run_pass(pass_engine, None, DAY, batch_size=2)
        assert pruned is not None and (pruned.events, pruned.event_batches) == (3, 2)
        # The lock is released after the pass: another server's next pass may take it.
        with engine.connect() as other:
            taken = other.execute(sa.select(sa.func.pg_try_advisory_lock(retention.LOCK_KEY)))
            assert taken.scalar_one() is True
    finally:
        pass_engine.dispose()


def test_the_pruner_thread_outlives_a_failing_s3_and_prunes_events_meanwhile(
    engine: sa.Engine, database_url: str, stack_env: dict[str, str]
) -> None:
    """S3 down (nothing listens on the port): every pass fails at the logs, after the
    events went; the thread logs it and tries again; stop() ends it."""
    _events_of_a_gone_job(engine, 3, days=3)
    unreachable = store.Store(
        endpoint=f"127.0.0.1:{services.free_port()}",
        access_key="x",
        secret_key="y",
        bucket="nowhere",
        connect_timeout=1,
    )
    pass_engine = database.create_engine(database_url, pool_size=1)
    failures: list[BaseException] = []

    def pass_(keep_going):  # type: ignore[no-untyped-def]
        try:
            return retention.run_pass(
                pass_engine, unreachable, DAY, batch_size=2, keep_going=keep_going
            )
        except Exception as exc:
            failures.append(exc)
            raise

    pruner = retention.Pruner(pass_, interval=0.05, first_delay=0, server="test-server")
    pruner.start()
    try:
        waiting.wait_until(lambda: len(failures) >= 2, 30, message="two failed passes")
        assert pruner.is_alive()
        assert "gone" not in _kinds(engine)
        assert all("S3" in str(exc) for exc in failures), failures
    finally:
        pruner.stop()
        pass_engine.dispose()
    assert not pruner.is_alive()
    pruner.stop()  # idempotent


def test_ended_runs_older_than_the_cutoff_go_but_each_jobs_newest_stays(
    engine: sa.Engine,
) -> None:
    job_id = factories.job(engine, "nightly", kind=JobKind.BATCH, start=False)
    with engine.begin() as conn:
        for age_days, state in ((40, "finished"), (40, "skipped"), (35, "failed"), (1, "finished")):
            conn.execute(
                sa.text(
                    "INSERT INTO runs (job_id, trigger, state, reason, created_at, ended_at) "
                    "VALUES (:j, 'manual', :s, 'r', now() - make_interval(days => :d), "
                    "now() - make_interval(days => :d))"
                ),
                {"j": job_id, "s": state, "d": age_days},
            )
        # The newest run of another job is kept however old.
        other = jobs.create(
            conn,
            job_spec.JobSpec(
                name="other", kind=JobKind.BATCH, resource_id=factories.resource(conn)
            ),
        )
        conn.execute(
            sa.text(
                "INSERT INTO runs (job_id, trigger, state, ended_at) "
                "VALUES (:j, 'manual', 'finished', now() - interval '90 days')"
            ),
            {"j": other},
        )
    assert _prune(engine, 30 * DAY).runs == 3
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT job_id, state FROM runs ORDER BY run_id")).all()
    assert [tuple(r) for r in left] == [(job_id, "finished"), (other, "finished")]


def test_sent_alert_deliveries_older_than_the_cutoff_go_and_pending_ones_stay(
    engine: sa.Engine,
) -> None:
    from scheduler import alerts

    with engine.begin() as conn:
        alerts.create(
            conn, "ops", "http://127.0.0.1:9/", kinds="failed", allow_networks=factories.LOOPBACK
        )
        for age_days, status in (
            (40, "delivered"),
            (40, "failed"),
            (40, "pending"),
            (1, "delivered"),
        ):
            conn.execute(
                sa.text(
                    "INSERT INTO alert_deliveries (alert_id, alert_name, kind, status, created_at) "
                    "SELECT id, name, 'test', :s, now() - make_interval(days => :d) FROM alerts"
                ),
                {"s": status, "d": age_days},
            )
    assert _prune(engine, 30 * DAY).deliveries == 2
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT status FROM alert_deliveries ORDER BY status")).all()
    assert [r.status for r in left] == ["delivered", "pending"]
