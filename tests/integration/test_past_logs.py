"""Past driver logs (server/past_logs.py): which epoch a batch run's attempt ran as,
where an epoch's log is read from, and the one line that says why one is missing. The
pure functions first, then the mapping of attempts to epochs on a real PostgreSQL
(claims, a retry and a failover, as scheduler/distribution/ writes them)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from scheduler import distribution, runs
from server import past_logs
from sql.states import JobKind
from testing import factories


def _job(epoch: int = 3, owner: str | None = None, kind: str = "streaming") -> Any:
    """The fields of a job's view (``job_views.JobView``) the past logs read."""
    return SimpleNamespace(name="etl", kind=kind, epoch=epoch, owner=owner)


def _run(epoch: int | None = 12, attempts: int = 3, state: str = "finished") -> dict[str, Any]:
    return {"run_id": 7, "epoch": epoch, "attempts": attempts, "state": state}


def _missing(call: Any, *fragments: str) -> str:
    with pytest.raises(past_logs.Missing) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ---------------------------------------------------------------- a run's attempts


def test_a_runs_attempts_are_the_consecutive_epochs_ending_at_its_last() -> None:
    run = _run(epoch=12, attempts=3)
    assert [past_logs.attempt_epoch(run, k) for k in (1, 2, 3)] == [10, 11, 12]


def test_a_run_without_an_attempt_named_is_its_last_attempt() -> None:
    assert past_logs.run_attempt(_job(kind="batch"), 7, _run(epoch=12), None) == (3, 12)
    assert past_logs.run_attempt(_job(kind="batch"), 7, _run(epoch=12), 1) == (1, 10)


@pytest.mark.parametrize("attempt", [0, 4])
def test_an_attempt_the_run_did_not_make_is_named(attempt: int) -> None:
    _missing(
        lambda: past_logs.run_attempt(_job(kind="batch"), 7, _run(attempts=3), attempt),
        "job etl: run 7 made 3 attempts",
        f"no attempt {attempt}",
    )


def test_a_run_that_never_started_a_driver_says_so() -> None:
    _missing(
        lambda: past_logs.run_attempt(
            _job(kind="batch"), 7, _run(epoch=None, attempts=0, state="skipped"), None
        ),
        "job etl: run 7 (skipped) started no driver",
    )


def test_a_run_that_is_not_there_may_have_been_pruned() -> None:
    _missing(
        lambda: past_logs.run_attempt(_job(kind="batch"), 7, None, 1),
        "job etl has no run 7",
        "history retention",
    )


def test_a_streaming_job_has_no_runs_its_drivers_are_epochs() -> None:
    _missing(lambda: past_logs.run_attempt(_job(), 7, None, None), "streaming job", "epoch")


# ---------------------------------------------------------------- an epoch's log


def _never(*_: object) -> str | None:
    raise AssertionError("not to be read")


def test_a_past_epoch_is_read_from_the_bucket_never_from_the_owner() -> None:
    asked: list[int] = []

    def shipped(epoch: int) -> str:
        asked.append(epoch)
        return f"epoch {epoch}\n"

    text = past_logs.epoch_log(_job(epoch=3, owner="s1"), 2, live=_never, shipped=shipped)
    assert (text, asked) == ("epoch 2\n", [2])


def test_the_live_epoch_is_read_from_its_owner_and_from_the_bucket_if_it_does_not_answer() -> None:
    job = _job(epoch=3, owner="s1")
    text = past_logs.epoch_log(job, 3, live=lambda: "live\n", shipped=_never)
    assert text == "live\n"
    text = past_logs.epoch_log(job, 3, live=lambda: None, shipped=lambda e: "shipped\n")
    assert text == "shipped\n"


def test_an_epoch_after_the_latest_is_refused_naming_the_latest() -> None:
    _missing(
        lambda: past_logs.epoch_log(_job(epoch=3), 4, live=_never, shipped=_never),
        "job etl has no epoch 4",
        "its latest is 3",
    )
    _missing(
        lambda: past_logs.epoch_log(_job(epoch=0), 1, live=_never, shipped=_never),
        "job etl has no epoch 1",
        "never run",
    )


def test_a_log_not_kept_names_the_epoch_and_why_it_may_be_missing() -> None:
    message = _missing(
        lambda: past_logs.epoch_log(_job(epoch=3), 2, live=_never, shipped=lambda e: None),
        "job etl: no log of epoch 2 is kept",
        "history retention",
        "never shipped",
    )
    assert "SPARKRING_HISTORY_RETENTION" in message


def test_a_run_attempts_missing_log_names_the_run_and_the_attempt() -> None:
    _missing(
        lambda: past_logs.epoch_log(
            _job(epoch=12, kind="batch"),
            10,
            live=_never,
            shipped=lambda e: None,
            what=past_logs.attempt_label(7, 1, 10),
        ),
        "job etl: no log of run 7 attempt 1 (epoch 10) is kept",
    )


def test_the_live_epoch_whose_owner_does_not_answer_names_the_owner() -> None:
    _missing(
        lambda: past_logs.epoch_log(
            _job(epoch=3, owner="s2"), 3, live=lambda: None, shipped=lambda e: None
        ),
        "job etl: epoch 3 is the current run, on s2",
        "shipped",
    )


# ---------------------------------------------------------------- on PostgreSQL

OWNER = distribution.Owner("s1", "inc-1")
OTHER = distribution.Owner("s2", "inc-2")


def _claimed_epochs(engine: sa.Engine, job_id: int) -> list[int]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT epoch FROM job_events WHERE job_id = :j AND kind = 'claimed' "
                    "ORDER BY id"
                ),
                {"j": job_id},
            ).scalars()
        )


def test_each_attempt_of_a_run_is_a_claim_of_its_own_epoch(engine: sa.Engine) -> None:
    """A batch run that crashes (a retry), whose owner is then lost (a run again on
    another server) and which then finishes: three claims, three epochs, and attempt K
    of the run is the K-th of them."""
    job_id = factories.job(engine, "nightly", kind=JobKind.BATCH, max_restarts=1)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        first = distribution.claim(conn, job_id, OWNER, ttl=30)
        distribution.mark_running(conn, job_id, OWNER, first.epoch, pid=1)
        distribution.record_crash(
            conn, job_id, OWNER, first.epoch, "driver exited with exit code 3",
            retry=True, backoff_base=0, backoff_max=0,
        )  # fmt: skip
        second = distribution.claim(conn, job_id, OWNER, ttl=30)
        distribution.mark_running(conn, job_id, OWNER, second.epoch, pid=2)
    factories.expire_lease(engine, job_id)
    factories.target(engine, job_id, "s2")
    with engine.begin() as conn:
        third = distribution.claim(conn, job_id, OTHER, ttl=30, hold=0)
        distribution.mark_running(conn, job_id, OTHER, third.epoch, pid=3)
        distribution.finish(conn, job_id, OTHER, third.epoch)
    with engine.connect() as conn:
        (run,) = runs.list_runs(conn, job_id)
    assert (run["state"], run["attempts"], run["epoch"]) == ("finished", 3, third.epoch)
    claimed = _claimed_epochs(engine, job_id)
    assert claimed == [first.epoch, second.epoch, third.epoch]
    assert [past_logs.attempt_epoch(run, k) for k in (1, 2, 3)] == claimed
