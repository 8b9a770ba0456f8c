"""The harness's own bookkeeping on the real PostgreSQL: what ``Trial`` keeps of the
history it prunes, so that the checker never reads less than what happened."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler import fires, jobs, placement, runs
from server import defaults, retention
from testing import factories
from testing.chaos import invariants
from testing.chaos.trial import FIRE_LATENESS_BOUND_S, Trial, name_placed_on
from testing.cluster import Cluster

pytestmark = pytest.mark.chaos

GONE_JOB_ID = 987654  # no jobs row: its events go by age alone


def _old_events(engine: sa.Engine, count: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO job_events (job_id, job_name, kind, at) "
                "SELECT :id, 'gone', 'claimed', now() - interval '1 hour' "
                "FROM generate_series(1, :n)"
            ),
            {"id": GONE_JOB_ID, "n": count},
        )


def test_two_harness_prunes_at_once_keep_every_event_and_report_nothing_unseen(
    engine: sa.Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The randomized mode's command threads prune concurrently. A second prune that
    ran between the first one's copy and its delete made the first one count "-97
    events pruned before the harness saw them" (CI, CHAOS_SEED=593937537) and fail a
    run in which nothing was unseen. Each prune now runs alone."""
    _old_events(engine, 40)
    trial = Trial("prune", 1, {}, database_url, "/unused", "unused", tmp_path)
    real_prune = retention.prune
    second: list[BaseException | str] = []
    inside_first = threading.Event()

    def second_prune() -> None:
        try:
            with engine.connect() as conn:
                second.append(trial.prune_history(conn, 60.0))
        except BaseException as exc:  # reported by the main thread
            second.append(exc)

    def prune_letting_another_in(conn, bucket, before, **kwargs):  # type: ignore[no-untyped-def]
        if not inside_first.is_set():
            inside_first.set()
            # The first prune has copied its events: a second prune now starts and is
            # given a second to run in this window (it may not, and then waits).
            other = threading.Thread(target=second_prune)
            other.start()
            other.join(timeout=1.0)
            result = real_prune(conn, bucket, before, **kwargs)
            threads.append(other)
            return result
        return real_prune(conn, bucket, before, **kwargs)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(retention, "prune", prune_letting_another_in)
    with engine.connect() as conn:
        first = trial.prune_history(conn, 60.0)
    for thread in threads:
        thread.join(timeout=30)
    assert second, "the second prune never finished"
    assert not isinstance(second[0], BaseException), second[0]
    assert (first, second[0]) == ("pruned 40", "pruned 0")
    assert trial.outcome.pruned == 40
    assert len(trial._pruned) == 40, "the harness lost pruned events"


def test_a_prune_whose_outcome_is_unknown_keeps_the_copies_of_what_it_deleted(
    engine: sa.Engine, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CHAOS_SEED=84460986 (pg_failover and pg_restart among the faults): a prune's delete
    committed, then its connection failed before the harness recorded what it deleted;
    the harness dropped its copies, and the checker, blind to 36 s of history, reported
    25 drivers started before any claim and ten fire times "missed (no run, not
    recorded)". Copies of rows that are gone are kept whatever the prune's answer."""
    _old_events(engine, 30)
    trial = Trial("prune", 1, {}, database_url, "/unused", "unused", tmp_path)
    trial._cluster = Cluster({}, database_url, "/unused", "unused", tmp_path)
    real_prune = retention.prune

    def prune_then_lose_the_answer(conn, bucket, before, **kwargs):  # type: ignore[no-untyped-def]
        real_prune(conn, bucket, before, **kwargs)
        raise sa.exc.OperationalError("COMMIT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(retention, "prune", prune_then_lose_the_answer)
    try:
        ((old,),) = trial.cluster.sql("SELECT count(*) FROM job_events WHERE job_name = 'gone'")
        with engine.connect() as conn, pytest.raises(sa.exc.OperationalError):
            trial.prune_history(conn, 60.0)
        ((left,),) = trial.cluster.sql("SELECT count(*) FROM job_events WHERE job_name = 'gone'")
        assert old >= 30 and left == 0, "the prune deleted nothing: the test shows nothing"
        kept = [e for e in trial.events() if e["job_name"] == "gone"]
        assert len(kept) == old, "the harness lost the events its prune deleted"
    finally:
        trial.cluster.engine.dispose()


def _ticker_with_history(engine: sa.Engine, trial: Trial, *, handled_ago: float) -> int:
    """A scheduled job ``ticker`` (@every 5s) switched on 60 s ago, each of its fire
    times up to ``handled_ago`` seconds ago handled by a short run that finished (the
    way the firing loop and a server write them), and the checker told about it."""
    job_id = factories.scheduled_job(engine, "ticker", "@every 5s")
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        on, until = now - timedelta(seconds=60), now - timedelta(seconds=handled_ago)
        for generation, at in enumerate(invariants.fire_times("@every 5s", "UTC", on, until), 1):
            conn.execute(
                sa.text(
                    "INSERT INTO runs (job_id, generation, scheduled_time, trigger, state, "
                    "created_at, started_at, ended_at, attempts) VALUES (:j, :g, "
                    "to_timestamp(:at), 'schedule', 'finished', to_timestamp(:at), "
                    "to_timestamp(:at + 0.2), to_timestamp(:at + 0.7), 1)"
                ),
                {"j": job_id, "g": generation, "at": at},
            )
        conn.execute(
            sa.text("UPDATE jobs SET fires_checked_until = :until WHERE id = :j"),
            {"until": until, "j": job_id},
        )
    trial.scheduled["ticker"] = invariants.Piece("@every 5s", "UTC", on.timestamp())
    return job_id


def _checking_trial(database_url: str, tmp_path: Path) -> Trial:
    trial = Trial("prune", 1, {}, database_url, "/unused", "unused", tmp_path)
    trial._cluster = Cluster({}, database_url, "/unused", "unused", tmp_path)
    return trial


def test_the_fires_checker_still_reads_the_runs_a_harness_prune_deleted(
    engine: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    """CHAOS_SEED=500268951: the command threads' ``events prune --older-than 10-60 s``
    deletes the scheduled job's ended runs rows too (history retention prunes ``runs``,
    issue 25), and S6, which read the runs table at the end, reported every fire time
    before the prune's cutoff "missed (no run, not recorded)" (22:10:25Z to 22:11:40Z).
    The harness keeps what it prunes, for the runs as for the events."""
    trial = _checking_trial(database_url, tmp_path)
    try:
        job_id = _ticker_with_history(engine, trial, handled_ago=1.0)
        assert trial.fire_problems(FIRE_LATENESS_BOUND_S) == []
        with engine.connect() as conn:
            trial.prune_history(conn, 10.0)
        ((left,),) = trial.cluster.sql("SELECT count(*) FROM runs WHERE job_id = :j", j=job_id)
        assert left <= 3, "the prune left the old runs: the test shows nothing"
        assert trial.fire_problems(FIRE_LATENESS_BOUND_S) == []
    finally:
        trial.cluster.engine.dispose()


def test_the_fires_checker_catches_a_firer_that_stopped_handling_fires(
    engine: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    """S6 checked the fire times up to ``fires_checked_until`` only: a firing loop that
    stopped for good (fires_checked_until left behind) passed. Every fire time older
    than the lateness bound must have been handled by the time of the check."""
    trial = _checking_trial(database_url, tmp_path)
    try:
        _ticker_with_history(engine, trial, handled_ago=40.0)
        problems = trial.fire_problems(FIRE_LATENESS_BOUND_S)
        # 40 s behind, 20 s of it past the bound: three or four fire times (the
        # boundary depends on where now falls between two of them).
        assert 3 <= len(problems) <= 4, problems
        assert all("was missed (no run, not recorded)" in p for p in problems), problems
    finally:
        trial.cluster.engine.dispose()


def _firing(engine: sa.Engine, seconds: float) -> None:
    """A firing loop's passes for ``seconds`` (no server runs here)."""
    deadline = time.monotonic() + seconds
    while True:
        with engine.begin() as conn:
            fires.fire_one(conn, "s1")
        if time.monotonic() >= deadline:
            return
        time.sleep(0.1)


def test_the_harness_schedule_commands_make_the_windows_s6_checks(
    engine: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    """The randomized mode's schedule commands as S6 sees them: a change while on (the
    new piece from the change's time), a stop, a change while off and the start (an off
    period), a backfill of the off period (its misfires queued again), and a change
    whose transaction rolled back (no piece). The runs the product wrote for them
    pass; checked against the first schedule alone, they do not."""
    trial = _checking_trial(database_url, tmp_path)
    try:
        factories.scheduled_job(engine, "ticker", "@every 1s")
        ((on,),) = trial.cluster.sql(
            "SELECT EXTRACT(EPOCH FROM fires_checked_until) FROM jobs WHERE name = 'ticker'"
        )
        trial.scheduled["ticker"] = invariants.Piece("@every 1s", "UTC", float(on))
        _firing(engine, 1.5)
        with engine.begin() as conn:
            trial.change_schedule(conn, "ticker", "@every 2s")
        with pytest.raises(RuntimeError), engine.begin() as conn:
            trial.change_schedule(conn, "ticker", "@every 3s")
            raise RuntimeError("rolled back: no piece")
        _firing(engine, 2.5)
        with engine.begin() as conn:
            trial.stop_schedule(conn, "ticker")
        _firing(engine, 2.5)
        with engine.begin() as conn:
            trial.change_schedule(conn, "ticker", "@every 1s")
        _firing(engine, 1.5)
        with engine.begin() as conn:
            assert trial.start_schedule(conn, "ticker").startswith("schedule on")
        _firing(engine, 0.5)
        with engine.begin() as conn:
            now = conn.execute(sa.text("SELECT now()")).scalar_one()
            result = trial.backfill(conn, "ticker", now - timedelta(seconds=8), now)
        assert result.startswith("queued ") and not result.startswith("queued 0"), result
        ((job_id, until),) = trial.cluster.sql(
            "SELECT id, fires_checked_until FROM jobs WHERE name = 'ticker'"
        )
        window = trial.schedule_window("ticker", until, ())
        assert len(window.changes) == 2 and len(window.off) == 1, window
        assert len(window.backfills) == 1, window
        with engine.connect() as conn:
            rows = runs.list_runs(conn, job_id, limit=1000)
        assert invariants.fire_problems(window, rows, lateness_bound=20.0) == []
        first_alone = invariants.ScheduleWindow(
            "ticker", invariants.fire_times("@every 1s", "UTC", float(on), until)
        )
        assert invariants.fire_problems(first_alone, rows, lateness_bound=20.0) != []
    finally:
        trial.cluster.engine.dispose()


def test_a_name_placed_on_a_server_goes_there_beside_jobs_that_stay_on_the_others() -> None:
    """``Trial.own_a_job``'s extra job: a name whose ring place is the server, which the
    coordinator's sticky placement gives to it while the live jobs sit on the others."""
    capacities = {"p3": 4, "s1": 4, "s2": 4}
    for server in capacities:
        name = name_placed_on("extra", capacities, server)
        others = sorted(set(capacities) - {server})
        jobs = {f"live{i}": placement.Job(current=others[i % 2]) for i in range(3)}
        jobs[name] = placement.Job()
        targets = placement.stick(
            jobs, capacities, epsilon=defaults.PLACEMENT_EPSILON, vnodes=defaults.RING_VNODES
        ).targets
        assert targets[name] == server, (server, name, targets)
    with pytest.raises(AssertionError, match="no name placed on s9"):
        name_placed_on("extra", capacities, "s9")


def test_own_a_job_starts_one_on_a_server_whose_live_jobs_left_it(
    stack_env: dict[str, str],
    database_url: str,
    zk_root: str,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    """A partition case needs its special server to own a job when the fault comes; a
    job that left it before (CI at c52f6ea, 2026-11-27: "the cut-off server must own a job") is
    replaced by one placed on it, and the moves that emptied it are noted in the summary."""
    trial = Trial(
        "own a job", 1, stack_env, database_url, zk_root, s3_bucket, tmp_path, fork_servers=True
    )
    try:
        trial.start(["s1", "s2"])
        trial.populate(sentinels=False)
        [mine] = trial.owned_by("s2")
        assert trial.own_a_job("s2") == [mine]  # it owns one: nothing more is started
        trial.command(jobs.stop, mine)
        trial.wait_state(mine, "stopped", 60)
        assert trial.owned_by("s2") == []
        [extra] = trial.own_a_job("s2")
        assert extra != mine and extra in trial.live_jobs
        assert trial.owners()[extra] == "s2"
        [note] = trial.outcome.notes
        assert "s2 owned no live job" in note and f"{mine} released server=s2" in note
    finally:
        trial.close()
