"""The target's side of a warm hand-off (server/warm.py) on the real PostgreSQL, with a
stand-in context: a warm start that cannot be launched is not tried again and tells the
old owner to stop now."""

from __future__ import annotations

import threading
import types
from pathlib import Path

import sqlalchemy as sa

from scheduler import distribution
from server import reconcile, run_table, warm
from testing import factories
from testing.factories import owner

S1, S2 = owner("s1"), owner("s2")
NO_MASTER = "spark://127.0.0.1:1"  # nothing listens: a master that does not answer


def _offered_to_s2(engine: sa.Engine) -> distribution.Row:
    job_id, _ = factories.warm_offer(engine, spark_master=NO_MASTER)
    with engine.connect() as conn:
        return next(r for r in distribution.poll(conn, S2) if r.job_id == job_id)


def test_a_warm_start_that_fails_is_kept_and_lets_the_old_owner_stop(
    engine: sa.Engine, tmp_path: Path
) -> None:
    row = _offered_to_s2(engine)
    assert reconcile.warm_wanted(row, "s2")
    submitted: list[tuple] = []
    table = run_table.RunTable()
    ctx = types.SimpleNamespace(
        engine=engine,
        owner=S2,
        config=types.SimpleNamespace(
            work_dir=tmp_path / "work", spark_master="local[1]", warm_go_timeout=60.0
        ),
        stop=threading.Event(),
        submit=lambda *call: submitted.append(call),
    )
    warm.begin(table, ctx, row)  # type: ignore[arg-type]
    [(task, *args)] = submitted
    task(*args)  # the prestart: no master answers
    assert warm.warm_epochs(table) == {row.job_id: row.epoch + 1}
    with engine.connect() as conn:
        seen = next(r for r in distribution.poll(conn, S1) if r.job_id == row.job_id)
    assert seen.warm_ready_epoch == row.epoch  # the old owner stops now
    assert reconcile.warm_wait(seen, S1, row.epoch) is reconcile.WarmWait.READY
    # Kept: the next poll pre-starts nothing again for this offer.
    decided = reconcile.decide(
        {row.job_id: row},
        {},
        reconcile.Conditions(S2, 4, may_claim=True, may_migrate=True),
        warm=warm.warm_epochs(table),
    )
    assert not any(isinstance(a, reconcile.PreStart) for a in decided)
