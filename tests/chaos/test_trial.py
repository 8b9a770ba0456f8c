"""The harness's own bookkeeping on the real PostgreSQL: what ``Trial`` keeps of the
history it prunes, so that the checker never reads less than what happened."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from server import retention
from tests.chaos.trial import Trial

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
