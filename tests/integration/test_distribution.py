"""Leases and fencing on the real PostgreSQL: claims, renewals, stale epochs, reaping."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from scheduler import distribution, job_events, jobs
from sql.states import JobKind, RunState
from testing import factories
from testing.factories import owner

TTL = 10.0


def _claim(engine: sa.Engine, job_id: int, server: str) -> distribution.Claim:
    with engine.begin() as conn:
        return distribution.claim(conn, job_id, owner(server), TTL)


def test_claim_takes_a_lease_and_bumps_the_epoch(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "a")
    factories.target(engine, job_id, "s1")
    claim = _claim(engine, job_id, "s1")
    assert (claim.epoch, claim.attempt) == (1, 1)
    row = factories.row(engine, job_id)
    assert row.owner == "s1" and row.state == "starting" and row.lease_until is not None
    with engine.connect() as conn:
        assert 9 < distribution.lease_remaining(conn, job_id) <= TTL


def test_claim_refused_when_not_targeted_or_stopped(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "a")
    factories.target(engine, job_id, "s1")
    with pytest.raises(distribution.NotClaimable):
        _claim(engine, job_id, "s2")
    with engine.begin() as conn:
        jobs.stop(conn, "a")
    with pytest.raises(distribution.NotClaimable):
        _claim(engine, job_id, "s1")


def test_two_servers_racing_to_claim_exactly_one_wins(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "race")
    factories.target(engine, job_id, "s1")
    # The target moves to s2 while both try: whatever the interleaving, one owner.
    barrier = threading.Barrier(8)
    winners: list[str] = []

    def attempt(server: str) -> None:
        barrier.wait()
        try:
            _claim(engine, job_id, server)
            winners.append(server)
        except distribution.NotClaimable:
            pass

    threads = [threading.Thread(target=attempt, args=("s1",)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert winners == ["s1"]
    assert factories.row(engine, job_id).epoch == 1


def test_stale_epoch_writes_are_rejected(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "a")
    factories.target(engine, job_id, "s1")
    old = _claim(engine, job_id, "s1")
    # s1 pauses; its lease expires; the job is retargeted and claimed by s2.
    factories.expire_lease(engine, job_id)
    factories.target(engine, job_id, "s2")
    new = _claim(engine, job_id, "s2")
    assert new.epoch == old.epoch + 1
    with engine.begin() as conn, pytest.raises(distribution.FencedError):
        distribution.mark_running(conn, job_id, owner("s1"), old.epoch, pid=1)
    with engine.begin() as conn, pytest.raises(distribution.FencedError):
        distribution.release(conn, job_id, owner("s1"), old.epoch)
    with engine.begin() as conn:
        assert distribution.renew_leases(conn, owner("s1"), TTL) == {}
        distribution.mark_running(conn, job_id, owner("s2"), new.epoch, pid=2)
    row = factories.row(engine, job_id)
    assert (row.owner, row.state, row.epoch) == ("s2", "running", new.epoch)


def test_renew_extends_every_live_lease_of_one_server_in_one_statement(engine: sa.Engine) -> None:
    ids = [factories.job(engine, f"j{i}") for i in range(5)]
    for job_id in ids:
        factories.target(engine, job_id, "s1")
        _claim(engine, job_id, "s1")
    factories.expire_lease(engine, ids[0])
    with engine.begin() as conn:
        renewed = distribution.renew_leases(conn, owner("s1"), TTL)
    assert set(renewed) == set(ids[1:])
    assert all(epoch == 1 for epoch in renewed.values())


def test_reap_only_after_the_lease_expired_and_owner_left(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "a")
    factories.target(engine, job_id, "s1")
    _claim(engine, job_id, "s1")
    with engine.begin() as conn:
        assert distribution.reap(conn, live=[], server="coord") == []  # lease still valid
    factories.expire_lease(engine, job_id)
    with engine.begin() as conn:
        assert distribution.reap(conn, live=["s1"], server="coord") == []  # owner alive
        assert distribution.reap(conn, live=["s2"], server="coord") == [(job_id, "s1", 1)]
    row = factories.row(engine, job_id)
    assert (row.owner, row.state, row.lease_until) == (None, "pending", None)
    with engine.connect() as conn:
        kinds = [e["kind"] for e in job_events.events(conn, "a")]
    assert kinds[-1] == "reaped"


def _running_on_s1_with_its_lease_expired(engine: sa.Engine) -> tuple[int, distribution.Claim]:
    """A batch job "b" whose driver runs on s1 (its first claim), its lease expired."""
    job_id = factories.job(engine, "b", kind=JobKind.BATCH)
    factories.target(engine, job_id, "s1")
    first = _claim(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.mark_running(conn, job_id, owner("s1"), first.epoch, pid=1)
    factories.expire_lease(engine, job_id)
    return job_id, first


def _postgresql_uptime(engine: sa.Engine) -> float:
    with engine.connect() as conn:
        return float(
            conn.execute(
                sa.text("SELECT EXTRACT(EPOCH FROM now() - pg_postmaster_start_time())")
            ).scalar_one()
        )


def test_right_after_postgresql_started_no_lease_is_reaped_or_taken_over(
    engine: sa.Engine,
) -> None:
    """Hole H5 under an outage of PostgreSQL past the lease (CHAOS_SEED=817466012): every
    lease expired and every server withdrew, and the first reap took a live owner's
    batch job whose driver had exited 1 meanwhile: it ran again past --max-retries 0.
    For ``hold`` seconds after PostgreSQL started, a departed owner's lease is neither
    reaped nor claimed over (its owner's word comes first); its own owner may re-claim."""
    job_id, first = _running_on_s1_with_its_lease_expired(engine)
    just_started = _postgresql_uptime(engine) + 3600  # as if PostgreSQL just started
    with engine.begin() as conn:
        assert distribution.reap(conn, live=[], server="coord", hold=just_started) == []
    factories.target(engine, job_id, "s2")
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, owner("s2"), TTL, hold=just_started)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:  # its own owner's expired lease: no wait
        again = distribution.claim(conn, job_id, owner("s1"), TTL, hold=just_started)
    assert again.epoch == first.epoch + 1
    factories.expire_lease(engine, job_id)
    with engine.begin() as conn:  # up for longer than the hold: reaped as before
        assert distribution.reap(conn, live=[], server="coord", hold=0.0) == [
            (job_id, "s1", again.epoch)
        ]


def _outage_ended(engine: sa.Engine, seconds_ago: float) -> None:
    """The cluster's clock as if nobody had renewed for a long time and a renewal
    ``seconds_ago`` had ended that outage (what ``renew_leases`` writes)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE cluster_clock SET renewed_at = now() - make_interval(secs => :ago), "
                "outage_ended_at = now() - make_interval(secs => :ago) WHERE id = 1"
            ),
            {"ago": seconds_ago},
        )


def test_a_renewal_after_nobody_renewed_for_a_lease_marks_the_end_of_an_outage(
    engine: sa.Engine,
) -> None:
    with engine.begin() as conn:
        distribution.renew_leases(conn, owner("s1"), TTL)
        clock = conn.execute(sa.text("SELECT * FROM cluster_clock")).one()
    assert clock.renewed_at is not None and clock.outage_ended_at is None  # first stamp
    with engine.begin() as conn:
        distribution.renew_leases(conn, owner("s2"), TTL, job_ids=[])
        assert conn.execute(sa.text("SELECT outage_ended_at FROM cluster_clock")).scalar() is None
        conn.execute(
            sa.text("UPDATE cluster_clock SET renewed_at = now() - make_interval(secs => :s)"),
            {"s": TTL + 5},
        )
    with engine.begin() as conn:  # the first renewal after a gap longer than a lease
        distribution.renew_leases(conn, owner("s3"), TTL, job_ids=[])
        ended, renewed, now = conn.execute(
            sa.text("SELECT outage_ended_at, renewed_at, now() FROM cluster_clock")
        ).one()
    assert ended is not None and abs((now - ended).total_seconds()) < 5
    assert renewed >= ended


def test_after_an_outage_no_server_reaps_or_claims_over_before_the_hold(
    engine: sa.Engine,
) -> None:
    """Hole W1 of safety review 3: every server cut off from a PostgreSQL that kept
    running (no postmaster restart: the old hold's clock did not move). For ``hold``
    seconds after the cluster reached PostgreSQL again, a departed owner's lease is
    neither reaped nor claimed over; its own owner may re-claim; after the hold both
    go on as before."""
    job_id, first = _running_on_s1_with_its_lease_expired(engine)
    _outage_ended(engine, seconds_ago=2)
    hold = 16.0
    assert _postgresql_uptime(engine) > hold  # the postmaster's start says nothing here
    with engine.begin() as conn:
        assert distribution.reap(conn, live=[], server="coord", hold=hold) == []
    factories.target(engine, job_id, "s2")
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, owner("s2"), TTL, hold=hold)
    _outage_ended(engine, seconds_ago=hold + 1)
    with engine.begin() as conn:
        assert distribution.reap(conn, live=[], server="coord", hold=hold) == [
            (job_id, "s1", first.epoch)
        ]


@pytest.mark.parametrize("by_watchdog", [False, True])
def test_a_batch_failure_recorded_after_its_reap_spends_the_budget(
    engine: sa.Engine, by_watchdog: bool
) -> None:
    """As an exit 0 after a reap is taken (the test below), so is a failure: a
    ``--max-retries 0`` batch whose driver exited 1 while its owner was cut off ends
    FAILED on its owner's late word, not pending to run again (W1's crash write)."""
    job_id = factories.job(engine, "b", kind=JobKind.BATCH, max_restarts=0)
    factories.target(engine, job_id, "s1")
    first = _claim(engine, job_id, "s1")
    factories.expire_lease(engine, job_id)
    with engine.begin() as conn:
        assert distribution.reap(conn, live=["s2"], server="coord") == [(job_id, "s1", 1)]
    with engine.begin() as conn:
        if by_watchdog:
            state = distribution.record_crash_by_watchdog(
                conn, job_id, "s1", first.epoch, "exit 1", backoff_base=1, backoff_max=2
            )
        else:
            state = distribution.record_crash(
                conn, job_id, owner("s1"), first.epoch, "exit 1",
                retry=True, backoff_base=1, backoff_max=2,
            )  # fmt: skip
    assert state == RunState.FAILED
    row = factories.row(engine, job_id)
    assert (row.owner, row.state, row.epoch) == (None, "failed", first.epoch)
    with pytest.raises(distribution.NotClaimable):
        _claim(engine, job_id, "s1")


def test_claim_over_an_expired_lease_reruns_a_batch_job(engine: sa.Engine) -> None:
    job_id, _ = _running_on_s1_with_its_lease_expired(engine)
    factories.target(engine, job_id, "s2")
    second = _claim(engine, job_id, "s2")
    assert (second.epoch, second.attempt) == (2, 2)


def test_finished_job_is_never_claimed_again(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "b", kind=JobKind.BATCH)
    factories.target(engine, job_id, "s1")
    claim = _claim(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=1)
        distribution.finish(conn, job_id, owner("s1"), claim.epoch)
    with pytest.raises(distribution.NotClaimable):
        _claim(engine, job_id, "s1")
    assert factories.row(engine, job_id).state == "finished"


@pytest.mark.parametrize("by_watchdog", [False, True])
def test_a_batch_exit_0_recorded_after_its_reap_is_finished_until_another_claim(
    engine: sa.Engine, by_watchdog: bool
) -> None:
    """A batch driver exited 0 while its server was cut off from PostgreSQL; its lease
    expired and the coordinator reaped it (owner cleared, ``pending``). The cut heals
    before anybody claims the job: the old owner's ``finished`` at the same epoch is
    the truth and is taken (the epoch is the fence: no newer driver can have started),
    or the generation runs twice (CHAOS_SEED=390332867: b1's generation 4). Once
    another server has claimed it, the late record is refused as before."""
    job_id, first = _running_on_s1_with_its_lease_expired(engine)

    def late_finish(epoch: int) -> RunState:
        with engine.begin() as conn:
            if by_watchdog:
                return distribution.finish_by_watchdog(conn, job_id, "s1", epoch)
            return distribution.finish(conn, job_id, owner("s1"), epoch)

    with engine.begin() as conn:
        assert distribution.reap(conn, live=["s2"], server="coord") == [(job_id, "s1", 1)]
    assert late_finish(first.epoch) == RunState.FINISHED
    row = factories.row(engine, job_id)
    assert (row.owner, row.state, row.epoch) == (None, "finished", first.epoch)
    with pytest.raises(distribution.NotClaimable):
        _claim(engine, job_id, "s1")

    # Reaped, then claimed elsewhere: the old epoch's record comes too late.
    second_id = factories.job(engine, "b2", kind=JobKind.BATCH)
    factories.target(engine, second_id, "s1")
    old = _claim(engine, second_id, "s1")
    factories.expire_lease(engine, second_id)
    with engine.begin() as conn:
        distribution.reap(conn, live=["s2"], server="coord")
    factories.target(engine, second_id, "s2")
    _claim(engine, second_id, "s2")
    with pytest.raises(distribution.FencedError), engine.begin() as conn:
        if by_watchdog:
            distribution.finish_by_watchdog(conn, second_id, "s1", old.epoch)
        else:
            distribution.finish(conn, second_id, owner("s1"), old.epoch)
    assert factories.row(engine, second_id).state == "starting"


def test_crash_backs_off_then_fails_after_max_restarts(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "crashy", max_restarts=2)
    factories.target(engine, job_id, "s1")
    outcomes = []
    for _ in range(3):
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE distribution SET not_before = NULL"))
        claim = _claim(engine, job_id, "s1")
        with engine.begin() as conn:
            distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=1)
            outcomes.append(
                distribution.record_crash(
                    conn,
                    job_id,
                    owner("s1"),
                    claim.epoch,
                    "exit 3: boom",
                    retry=True,
                    backoff_base=30,
                    backoff_max=60,
                )
            )
    assert outcomes == [RunState.BACKOFF, RunState.BACKOFF, RunState.FAILED]
    row = factories.row(engine, job_id)
    assert row.last_error == "exit 3: boom" and row.owner is None and row.restarts == 2


@pytest.mark.parametrize("kind", [JobKind.BATCH, JobKind.STREAMING])
def test_a_batch_run_of_a_new_generation_gets_its_own_retries(
    engine: sa.Engine, kind: JobKind
) -> None:
    """M4 of safety review 3: ``job restart`` of a batch job in backoff (or a
    ``--concurrency replace`` fire: the same ``runs.fresh_retries``) starts a new run,
    whose retries are its own (docs/schedules.md, "Retries": "for that fire only"). A
    streaming job's restart keeps its count (its budget is a crash loop's, inside the
    restart window)."""
    job_id = factories.job(engine, "retried", kind=kind, max_restarts=1)
    factories.target(engine, job_id, "s1")
    claim = _claim(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=1)
        state = distribution.record_crash(
            conn, job_id, owner("s1"), claim.epoch, "exit 3", retry=True,
            backoff_base=0, backoff_max=0,
        )  # fmt: skip
        assert state is RunState.BACKOFF
        jobs.restart(conn, "retried")
        conn.execute(sa.text("UPDATE distribution SET not_before = NULL"))
    _claim(engine, job_id, "s1")
    row = factories.row(engine, job_id)
    assert row.restarts == (0 if kind is JobKind.BATCH else 1), row
    assert (row.crash_times == []) is (kind is JobKind.BATCH), row
    with engine.connect() as conn:
        asked = [e for e in job_events.events(conn, "retried") if e["kind"] == "restart_requested"]
    # The chaos checker reads it to count the budget from there (failed_with_cause).
    assert asked[-1]["detail"].get("retries_reset", False) is (kind is JobKind.BATCH)


def test_backoff_is_not_claimable_before_not_before(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "crashy")
    factories.target(engine, job_id, "s1")
    claim = _claim(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.record_crash(
            conn, job_id, owner("s1"), claim.epoch, "x", retry=True, backoff_base=60, backoff_max=60
        )
    with pytest.raises(distribution.NotClaimable):
        _claim(engine, job_id, "s1")


def test_poll_lists_targeted_and_owned_jobs(engine: sa.Engine) -> None:
    a = factories.job(engine, "a")
    b = factories.job(engine, "b")
    factories.target(engine, a, "s1")
    factories.target(engine, b, "s1")
    _claim(engine, b, "s1")
    factories.target(engine, b, "s2")  # moved away, still owned by s1
    with engine.connect() as conn:
        rows = {r.name: r for r in distribution.poll(conn, owner("s1"))}
    assert set(rows) == {"a", "b"}
    assert rows["b"].owner == "s1" and rows["b"].target == "s2"


def test_another_incarnation_of_the_same_server_id_can_neither_renew_nor_write(
    engine: sa.Engine,
) -> None:
    job_id = factories.job(engine, "a")
    factories.target(engine, job_id, "s1")
    first = owner("s1", "first")
    second = owner("s1", "second")  # the same id restarted, or a second host of one name
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, first, TTL)
    with engine.begin() as conn:
        assert distribution.renew_leases(conn, second, TTL) == {}
    for write in (
        lambda conn: distribution.mark_running(conn, job_id, second, claim.epoch, pid=1),
        lambda conn: distribution.release(conn, job_id, second, claim.epoch),
        lambda conn: distribution.finish(conn, job_id, second, claim.epoch),
    ):
        with engine.begin() as conn, pytest.raises(distribution.FencedError):
            write(conn)
    # The lease stays the first incarnation's until it expires; then the second claims.
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, second, TTL)
    factories.expire_lease(engine, job_id)
    with engine.begin() as conn:
        assert distribution.claim(conn, job_id, second, TTL).epoch == claim.epoch + 1
    row = factories.row(engine, job_id)
    assert (row.owner, row.owner_incarnation) == ("s1", "second")


def test_a_successor_adopts_a_live_lease_of_its_previous_incarnation_only(
    engine: sa.Engine,
) -> None:
    job_id = factories.job(engine, "a")
    factories.target(engine, job_id, "s1")
    before, after = owner("s1", "before"), owner("s1", "after")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, before, TTL)
        distribution.mark_running(conn, job_id, before, claim.epoch, pid=1)
    with engine.begin() as conn, pytest.raises(distribution.FencedError):
        distribution.adopt(conn, job_id, before, after, claim.epoch + 1, TTL)  # wrong epoch
    with engine.begin() as conn:
        assert distribution.adopt(conn, job_id, before, after, claim.epoch, TTL) == "running"
    row = factories.row(engine, job_id)
    assert (row.owner, row.owner_incarnation, row.epoch) == ("s1", "after", claim.epoch)
    with engine.begin() as conn:  # the previous incarnation has lost it for good
        assert distribution.renew_leases(conn, before, TTL) == {}
        assert distribution.renew_leases(conn, after, TTL) == {job_id: claim.epoch}
    factories.expire_lease(engine, job_id)
    with engine.begin() as conn, pytest.raises(distribution.FencedError):
        distribution.adopt(conn, job_id, after, owner("s1", "third"), claim.epoch, TTL)
    with engine.connect() as conn:
        assert [e["kind"] for e in job_events.events(conn, "a")][-1] == "adopted"


def _watchdog_writes(job_id: int, server: str, epoch: int) -> list:
    """A run's watchdog recording its driver's exit 0, and a crash."""
    return [
        lambda conn: distribution.finish_by_watchdog(conn, job_id, server, epoch),
        lambda conn: distribution.record_crash_by_watchdog(
            conn, job_id, server, epoch, "exit 1", backoff_base=30, backoff_max=60
        ),
    ]


def test_a_watchdog_records_its_run_after_an_adoption_but_never_a_newer_one(
    engine: sa.Engine,
) -> None:
    """Fenced on the run (server and epoch), not on the incarnation that launched it: an
    adoption keeps the epoch, so the watchdog's record still lands (hole H2); a release,
    a reap or a newer claim leaves nothing for it to match."""
    job_id = factories.job(engine, "a", kind=JobKind.BATCH)
    factories.target(engine, job_id, "s1")
    before, after = owner("s1", "before"), owner("s1", "after")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, before, TTL)
        distribution.mark_running(conn, job_id, before, claim.epoch, pid=1)
        distribution.adopt(conn, job_id, before, after, claim.epoch, TTL)
    for write in (
        *_watchdog_writes(job_id, "s1", claim.epoch + 1),  # an epoch it never ran at
        *_watchdog_writes(job_id, "s2", claim.epoch),  # another server's
    ):
        with engine.begin() as conn, pytest.raises(distribution.FencedError):
            write(conn)
    with engine.begin() as conn:
        assert distribution.finish_by_watchdog(conn, job_id, "s1", claim.epoch) == "finished"
    row = factories.row(engine, job_id)
    assert (row.state, row.owner, row.owner_incarnation) == ("finished", None, None)
    # Recorded once: the server's own write of that run, or the watchdog's again, is fenced.
    for write in (
        lambda conn: distribution.finish(conn, job_id, after, claim.epoch),
        *_watchdog_writes(job_id, "s1", claim.epoch),
    ):
        with engine.begin() as conn, pytest.raises(distribution.FencedError):
            write(conn)
    # A newer claim, by the same server, is out of reach of the old run's watchdog.
    with engine.begin() as conn:
        jobs.restart(conn, "a")
    newer = _claim(engine, job_id, "s1")
    for write in _watchdog_writes(job_id, "s1", claim.epoch):
        with engine.begin() as conn, pytest.raises(distribution.FencedError):
            write(conn)
    assert factories.row(engine, job_id).epoch == newer.epoch


def test_a_crash_recorded_by_a_watchdog_is_counted_once(engine: sa.Engine) -> None:
    """Hole H5: the watchdog spends the budget as the server would (backoff while
    restarts are left, then failed); the server's own record of the same run is then
    fenced, so a crash is never counted twice."""
    job_id = factories.job(engine, "crashy", kind=JobKind.BATCH, max_restarts=1)
    factories.target(engine, job_id, "s1")
    outcomes = []
    for _ in range(2):
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE distribution SET not_before = NULL"))
        claim = _claim(engine, job_id, "s1")
        with engine.begin() as conn:
            outcomes.append(
                distribution.record_crash_by_watchdog(
                    conn, job_id, "s1", claim.epoch, "exit 3: boom", backoff_base=30, backoff_max=60
                )
            )
        with engine.begin() as conn, pytest.raises(distribution.FencedError):
            distribution.record_crash(
                conn,
                job_id,
                owner("s1"),
                claim.epoch,
                "exit 3: boom",
                retry=True,
                backoff_base=30,
                backoff_max=60,
            )
    assert outcomes == [RunState.BACKOFF, RunState.FAILED]
    row = factories.row(engine, job_id)
    assert (row.state, row.owner, row.restarts, row.last_error) == (
        "failed",
        None,
        1,
        "exit 3: boom",
    )
    with engine.connect() as conn:
        kinds = [e["kind"] for e in job_events.events(conn, "crashy")]
    assert kinds.count("crashed") == 1 and kinds.count("failed") == 1, kinds


def _running_on(engine: sa.Engine, name: str, server: str, **spec: object) -> int:
    job_id = factories.job(engine, name, **spec)
    factories.target(engine, job_id, server)
    claim = _claim(engine, job_id, server)
    with engine.begin() as conn:
        distribution.mark_running(conn, job_id, owner(server), claim.epoch, 1234)
    return job_id


def _polled(engine: sa.Engine, server: str, job_id: int) -> distribution.Row:
    with engine.connect() as conn:
        return next(r for r in distribution.poll(conn, owner(server)) if r.job_id == job_id)


def test_a_warm_hand_off_is_offered_at_the_epoch_of_the_stopping_run(engine: sa.Engine) -> None:
    job_id = _running_on(engine, "a", "s1")
    factories.target(engine, job_id, "s2")
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, owner("s1"), 1, "migrating to s2", warm=True)
    seen = _polled(engine, "s2", job_id)
    assert (seen.state, seen.handoff_epoch, seen.warm_ready_epoch) == ("stopping", 1, None)
    assert (seen.attempt, seen.warm_allowed) == (1, True)
    cold = _running_on(engine, "b", "s1")
    with engine.begin() as conn:
        distribution.begin_stop(conn, cold, owner("s1"), 1, "stop requested")
    assert _polled(engine, "s1", cold).handoff_epoch is None


def test_only_the_target_of_an_offered_hand_off_may_say_it_is_warm(engine: sa.Engine) -> None:
    job_id = _running_on(engine, "a", "s1")
    factories.target(engine, job_id, "s2")
    with engine.begin() as conn:
        with pytest.raises(distribution.FencedError):  # nothing offered yet
            distribution.mark_warm_ready(conn, job_id, "s2", 1)
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, owner("s1"), 1, "migrating to s2", warm=True)
    for server, epoch in (("s3", 1), ("s2", 0)):  # not the target; not the offer's epoch
        with engine.begin() as conn, pytest.raises(distribution.FencedError):
            distribution.mark_warm_ready(conn, job_id, server, epoch)
    with engine.begin() as conn:
        distribution.mark_warm_ready(conn, job_id, "s2", 1)
    assert _polled(engine, "s1", job_id).warm_ready_epoch == 1


def test_a_claim_that_takes_a_warm_driver_says_so_in_its_event(engine: sa.Engine) -> None:
    job_id = _running_on(engine, "a", "s1")
    factories.target(engine, job_id, "s2")
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, owner("s1"), 1, "migrating to s2", warm=True)
        distribution.release(conn, job_id, owner("s1"), 1)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner("s2"), TTL, warm=True)
        detail = conn.execute(
            sa.text(
                "SELECT detail FROM job_events WHERE job_id = :j AND kind = 'claimed' "
                "ORDER BY id DESC LIMIT 1"
            ),
            {"j": job_id},
        ).scalar_one()
    assert claim.epoch == 2 and detail["warm"] is True


def test_a_job_opts_out_of_the_warm_hand_off_in_its_conf(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "own-context", conf={"sparkring.handoff.warm": "false"})
    factories.target(engine, job_id, "s1")
    assert _polled(engine, "s1", job_id).warm_allowed is False


@pytest.mark.parametrize(
    "conf",
    [
        {"spark.plugins": "com.example.Plugin"},
        {"spark.extraListeners": "com.example.Listener"},
        {"spark.sql.streaming.streamingQueryListeners": "com.example.Q"},
        {"spark.driver.extraJavaOptions": "-Xss4m -javaagent:/opt/agent.jar"},
    ],
)
def test_a_job_whose_conf_runs_its_code_before_the_go_moves_cold(
    engine: sa.Engine, conf: dict[str, str]
) -> None:
    """Issue 45: a warm driver runs no job code before its claim, but Spark plugins,
    listeners and Java agents run while its session is built. Such a job moves cold."""
    job_id = factories.job(engine, "hooked", conf=conf)
    factories.target(engine, job_id, "s1")
    assert _polled(engine, "s1", job_id).warm_allowed is False
    plain = factories.job(engine, "plain", conf={"spark.driver.extraJavaOptions": "-Xss4m"})
    factories.target(engine, plain, "s1")
    assert _polled(engine, "s1", plain).warm_allowed is True


@pytest.mark.parametrize("by_watchdog", [False, True])
def test_a_start_deferred_after_a_stop_was_asked_ends_stopped_not_in_backoff(
    engine: sa.Engine, by_watchdog: bool
) -> None:
    """A stop asked while the claim's start is prepared (the chaos run of CHAOS_SEED=
    552069408: ``stop_requested`` between ``claimed`` and ``deferred`` for want of a Spark
    master), then the start deferred: the job ends ``stopped``. Before, the deferral wrote
    ``backoff`` whatever the job wanted, and a job wanted stopped stayed there for ever,
    unowned and never claimed again."""
    job_id = factories.job(engine, "a")
    factories.target(engine, job_id, "s1")
    claim = _claim(engine, job_id, "s1")
    with engine.begin() as conn:
        jobs.stop(conn, "a")
    with engine.begin() as conn:
        if by_watchdog:
            distribution.defer_by_watchdog(
                conn, job_id, "s1", claim.epoch, "no master", 5.0, cause="spark-master-unreachable"
            )
        else:
            distribution.defer(conn, job_id, owner("s1"), claim.epoch, "no master", 5.0)
    row = factories.row(engine, job_id)
    assert (row.state, row.owner) == ("stopped", None)
    # A job still wanted running is deferred as before.
    with engine.begin() as conn:
        jobs.start(conn, "a")
    factories.target(engine, job_id, "s1")
    again = _claim(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.defer(conn, job_id, owner("s1"), again.epoch, "no master", 5.0)
    assert factories.row(engine, job_id).state == "backoff"


@pytest.mark.parametrize(
    ("command", "after", "next_state"),
    [(jobs.restart, "pending", "pending"), (jobs.stop, "stopped", "stopped")],
)
def test_a_crash_past_the_budget_that_a_restart_or_stop_overtook_is_no_failure(
    engine: sa.Engine, command: object, after: str, next_state: str
) -> None:
    """M3 of safety review 3: a crash that spends the budget while a restart (or a stop)
    was asked ends the run pending (or stopped), and its event is ``crashed``, naming
    where the job went, not ``failed`` (whose alert says the job ended FAILED)."""
    job_id = factories.job(engine, "j", max_restarts=0)
    factories.target(engine, job_id, "s1")
    claim = _claim(engine, job_id, "s1")
    with engine.begin() as conn:
        command(conn, "j")  # type: ignore[operator]
    with engine.begin() as conn:
        state = distribution.record_crash(
            conn, job_id, owner("s1"), claim.epoch, "exit 3",
            retry=True, backoff_base=1, backoff_max=2,
        )  # fmt: skip
    assert state == after
    with engine.connect() as conn:
        ends = conn.execute(
            sa.text(
                "SELECT kind, detail FROM job_events WHERE job_id = :j "
                "AND kind IN ('crashed', 'failed') ORDER BY id"
            ),
            {"j": job_id},
        ).all()
    assert [(e.kind, e.detail["next"]) for e in ends] == [("crashed", next_state)]
