"""The thread ownership of a run's fields that ``server/runs.py`` enforces (pure)."""

from __future__ import annotations

import pytest

from scheduler import distribution
from server import reconcile, runs


def _run() -> runs.Run:
    return runs.Run(
        job_id=1,
        name="a",
        kind="batch",
        epoch=3,
        attempt=0,
        claimed_at=0.0,
        deadline=10.0,
        owner=distribution.Owner("s1", "i1"),
    )


@pytest.mark.parametrize("field", sorted(runs.IDENTITY_FIELDS))
def test_a_run_s_identity_is_set_once(field: str) -> None:
    run = _run()
    with pytest.raises(AttributeError, match=field):
        setattr(run, field, getattr(run, field))


def test_a_run_s_state_may_change() -> None:
    run = _run()
    run.deadline = 20.0
    run.phase = reconcile.Phase.ENDED
    run.unrecorded = None
    run.recording = True
    run.mark = runs.Mark.MARKED
    assert (run.deadline, run.phase, run.mark) == (20.0, reconcile.Phase.ENDED, runs.Mark.MARKED)
