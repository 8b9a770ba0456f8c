"""Claims, renewals and the planned restart's hand-over (server/claims.py), against real
PostgreSQL, S3 and spark-submit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import store
from scheduler import distribution, job_spec, jobs
from server import runner, runs, watchdog
from sql.states import JobKind
from testing import factories, waiting
from tests.integration import runner_harness as harness


def _lease_expired(engine: sa.Engine, job_id: int) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text("SELECT lease_until < now() FROM distribution WHERE job_id = :j"),
                {"j": job_id},
            ).scalar_one()
        )


def test_a_claim_whose_commit_outcome_is_unknown_is_not_held_for_ever(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hole H3: the connection drops while a claim commits. PostgreSQL has the claim,
    the runner does not know it and has no local run. Before, every renewal extended that
    lease (it renewed every lease of its incarnation), the orphan check found no trace and
    left it 'to expire', and the job stayed ``starting`` with no driver for as long as
    the server lived. Renewals now extend only the leases of local runs: the unknown
    claim expires and the job is claimed again."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    claim = distribution.claim

    def claim_then_lose_the_answer(conn: sa.Connection, *args: object, **kwargs: object) -> None:
        with engine.begin() as own:  # committed, whatever happens to the caller's
            claim(own, *args, **kwargs)  # type: ignore[arg-type]
        raise sa.exc.OperationalError("COMMIT", {}, Exception("connection reset"))

    monkeypatch.setattr(distribution, "claim", claim_then_lose_the_answer)
    with pytest.raises(sa.exc.OperationalError):
        stepped_runner.poll_once()
    monkeypatch.setattr(distribution, "claim", claim)
    assert not stepped_runner.runs() and factories.row(engine, job_id).state == "starting"
    stepped_runner.poll_once()  # an orphan of this incarnation with no trace here
    waiting.wait_until(
        lambda: stepped_runner.renew_once() and _lease_expired(engine, job_id),
        3 * harness.TTL,
        interval=0.5,
        message="the unknown claim's lease was renewed past its TTL",
    )
    waiting.wait_until(
        lambda: stepped_runner.poll_once() >= 0 and stepped_runner.runs(),
        10,
        message="the job was not claimed again",
    )
    (run,) = stepped_runner.runs().values()
    assert run.epoch == 2
    waiting.wait_until(
        lambda: stepped_runner.renew_once() and harness.started(stage),
        harness.SPARK_START_S,
        interval=0.5,
        message="the driver did not start",
    )
    assert (stage / "starts").read_text().split() == ["2"]


def test_a_hung_kill_of_a_lost_run_does_not_hold_up_the_renewals(
    engine: sa.Engine, stepped_runner: runner.Runner
) -> None:
    """Hole H11: the renewal killed the drivers of lost leases inline. ``Driver.kill``
    can take tens of seconds on a hung driver, and meanwhile no lease of any other job
    on the server was renewed: every other driver died at its deadline."""
    hung = harness.HungDriver()
    run = runs.Run(
        job_id=1,
        name="lost",
        kind=JobKind.BATCH,
        epoch=1,
        attempt=1,
        claimed_at=watchdog.lease_clock() - 60,  # claimed long before this renewal
        deadline=0.0,
        owner=stepped_runner.owner,
        phase=runner.reconcile.Phase.RUNNING,
        driver=hung,  # type: ignore[arg-type]
    )
    stepped_runner.table.add(run)
    renewal = threading.Thread(target=stepped_runner.renew_once)
    try:
        renewal.start()
        waiting.wait_until(hung.killed.is_set, 10, message="the lost run was never killed")
        renewal.join(5)
        assert not renewal.is_alive(), "the renewal waited for the hung kill"
    finally:
        hung.release.set()
        renewal.join(10)
    assert not stepped_runner.runs()


def test_a_job_whose_lost_run_is_still_being_killed_here_is_not_claimed_here_again(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """A randomized run on a starved machine (CHAOS_SEED=81000001): a server lost a lease,
    its kill of the driver went to a task and the run was forgotten at once; the next
    poll claimed the job again on the same server 0.745 s before the old driver was
    dead (an early hand-off; its watchdog had woken 5.2 s past its deadline). A job
    whose previous local run is still being killed is not claimed until the kill is
    over."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)  # targeted here, claimable
    hung = harness.HungDriver()
    lost = runs.Run(
        job_id=job_id,
        name="b",
        kind=JobKind.BATCH,
        epoch=99,  # no lease of ours holds it: the renewal finds it lost
        attempt=1,
        claimed_at=watchdog.lease_clock() - 60,
        deadline=0.0,
        owner=stepped_runner.owner,
        phase=runner.reconcile.Phase.RUNNING,
        driver=hung,  # type: ignore[arg-type]
    )
    stepped_runner.table.add(lost)
    try:
        stepped_runner.renew_once()
        waiting.wait_until(hung.killed.is_set, 10, message="the lost run was never killed")
        stepped_runner.poll_once()
        assert factories.row(engine, job_id).epoch == 0, "claimed while its old driver lived"
    finally:
        hung.release.set()
    waiting.wait_until(
        lambda: stepped_runner.poll_once() is not None and factories.row(engine, job_id).epoch > 0,
        30,
        interval=0.2,
        message="the job was not claimed once the kill was over",
    )


def test_a_hand_over_whose_commit_answer_is_lost_is_tried_again(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hole H12: the hand-over's lease extension committed but its answer was lost with
    the connection. The server logged "hand-over failed" and left the drivers to die at
    their current deadlines, while PostgreSQL held the window-long leases: the jobs
    waited out the whole window. The extension (idempotent) is tried again."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, stepped_runner.owner, harness.TTL)
    handle = harness.ConfirmedDriver()
    run = runs.Run(
        job_id=job_id,
        name="b",
        kind=JobKind.BATCH,
        epoch=claim.epoch,
        attempt=1,
        claimed_at=watchdog.lease_clock(),
        deadline=watchdog.lease_clock() + harness.TTL - 3.0,
        owner=stepped_runner.owner,
        phase=runner.reconcile.Phase.RUNNING,
        driver=handle,  # type: ignore[arg-type]
    )
    stepped_runner.table.add(run)
    renew = distribution.renew_leases
    answers_lost: list[int] = []

    def renew_then_lose_the_answer(conn: sa.Connection, *args: object, **kwargs: object) -> object:
        if answers_lost:
            return renew(conn, *args, **kwargs)  # type: ignore[arg-type]
        with engine.begin() as own:
            renew(own, *args, **kwargs)  # type: ignore[arg-type]
        answers_lost.append(1)
        raise sa.exc.OperationalError("COMMIT", {}, Exception("connection reset"))

    monkeypatch.setattr(distribution, "renew_leases", renew_then_lose_the_answer)
    before = watchdog.lease_clock()
    assert stepped_runner.hand_over(60.0) == ["b"]
    assert handle.deadlines and handle.deadlines[-1] >= before + 60.0 - 3.0


def test_a_hand_over_extends_only_the_leases_of_local_runs(
    engine: sa.Engine,
    bucket: store.Store,
    stage: Path,
    tmp_path: Path,
    stepped_runner: runner.Runner,
) -> None:
    """M8 of safety review 3: a lease this incarnation holds without a local run (a claim
    whose commit answer was lost: no driver behind it) is not extended by the hand-over:
    it expires at its own time, not after the whole window."""
    local = harness.batch_job(engine, bucket, stage, tmp_path)
    unknown = factories.job(engine, "no-run-here", kind=JobKind.BATCH)
    factories.target(engine, unknown, stepped_runner.owner.server)
    with engine.begin() as conn:
        claim = distribution.claim(conn, local, stepped_runner.owner, harness.TTL)
        distribution.claim(conn, unknown, stepped_runner.owner, harness.TTL)
    harness.local_run(stepped_runner, local, claim.epoch, deadline_in=harness.TTL - 3.0)
    assert stepped_runner.hand_over(600.0) == ["b"]
    with engine.connect() as conn:
        left = dict(
            conn.execute(
                sa.text(
                    "SELECT job_id, extract(epoch FROM lease_until - now()) FROM distribution "
                    "WHERE job_id IN (:a, :b)"
                ),
                {"a": local, "b": unknown},
            ).all()
        )
    assert left[local] > 500 and left[unknown] <= harness.TTL


class _FullDiskDriver(harness.ConfirmedDriver):
    def confirm(self, deadline: float) -> None:
        raise OSError(28, "No space left on device", "lease.json")


def test_a_lease_file_that_cannot_be_written_does_not_stop_the_renewals(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """A full work dir (found by the chaos fault disk_full, seed 772255147): writing one
    driver's lease file raised ENOSPC inside the renewal, the renew thread died and the
    server exited ('the runner thread died'). One driver's confirmation failing must
    leave it to die at its deadline, not stop every other job's renewals."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    with engine.begin() as conn:
        other = jobs.create(
            conn,
            job_spec.JobSpec(
                name="c",
                kind=JobKind.BATCH,
                resource_id=conn.execute(
                    sa.text("SELECT resource_id FROM jobs WHERE id = :j"), {"j": job_id}
                ).scalar_one(),
            ),
        )
        jobs.start(conn, "c")
    factories.target(engine, other, "s1")
    handles = {job_id: _FullDiskDriver(), other: harness.ConfirmedDriver()}
    for jid, handle in handles.items():
        with engine.begin() as conn:
            claim = distribution.claim(conn, jid, stepped_runner.owner, harness.TTL)
        stepped_runner.table.add(
            runs.Run(
                job_id=jid,
                name=claim.name,
                kind=JobKind.BATCH,
                epoch=claim.epoch,
                attempt=1,
                claimed_at=watchdog.lease_clock(),
                deadline=watchdog.lease_clock() + harness.TTL - 3.0,
                owner=stepped_runner.owner,
                phase=runner.reconcile.Phase.RUNNING,
                driver=handle,  # type: ignore[arg-type]
            )
        )
    assert stepped_runner.renew_once()
    assert handles[other].deadlines, "the other job's driver was not confirmed"
