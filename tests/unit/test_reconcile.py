"""The runner's decisions (server/reconcile.py), every branch, without services."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import distribution
from server import driver, reconcile, rundir
from server.reconcile import Phase
from sql.states import OWNED, RunState

ME = distribution.Owner("s1", "now")
BEFORE = distribution.Owner("s1", "before")  # the previous incarnation of s1


def row(job_id: int = 1, **changes: object) -> distribution.Row:
    base = distribution.Row(
        job_id=job_id,
        name=f"j{job_id}",
        kind="streaming",
        desired="running",
        job_generation=1,
        max_restarts=3,
        target="s1",
        owner=None,
        owner_incarnation=None,
        epoch=0,
        state=RunState.PENDING,
        generation=1,
        restarts=0,
        lease_expired=False,
        claimable_now=True,
    )
    return dataclasses.replace(base, **changes)


def mine(job_id: int = 1, epoch: int = 3, **changes: object) -> distribution.Row:
    """A row this incarnation owns and runs."""
    values = {
        "owner": ME.server,
        "owner_incarnation": ME.incarnation,
        "epoch": epoch,
        "state": RunState.RUNNING,
        **changes,
    }
    return row(job_id, **values)


def run(job_id: int = 1, epoch: int = 3, **changes: object) -> reconcile.LocalRun:
    base = reconcile.LocalRun(job_id, epoch, ME, Phase.RUNNING, unrecorded=False)
    return dataclasses.replace(base, **changes)


def decide(
    rows: list[distribution.Row],
    runs: list[reconcile.LocalRun] = (),  # type: ignore[assignment]
    *,
    capacity: int = 4,
    may_claim: bool = True,
    may_migrate: bool = True,
    handled: tuple[reconcile.OrphanKey, ...] = (),
) -> list[reconcile.Action]:
    return reconcile.decide(
        {r.job_id: r for r in rows},
        {r.job_id: r for r in runs},
        reconcile.Conditions(ME, capacity, may_claim=may_claim, may_migrate=may_migrate),
        handled,
    )


# ------------------------------------------------------------------ local runs


@pytest.mark.parametrize("state", [RunState.FINISHED, RunState.BACKOFF, RunState.FAILED])
def test_a_run_whose_watchdog_recorded_its_exit_is_awaited_not_dropped(state: RunState) -> None:
    """The watchdog records its driver's exit itself (exit 0 ``finished``, a crash
    ``backoff`` or ``failed``; owner cleared) just before it exits: a poll woken by
    that write sees the row no longer owned while the local run is still running. It is
    ending, not lost: no kill, no drop (the next poll reaps it and ships its log). Found
    running Spark's pi.py: its log was never shipped and the server logged 'no longer
    ours; killing the driver'."""
    ended = row(epoch=3, state=state, desired="running")
    assert decide([ended], [run(epoch=3)]) == []
    # A finished row of another epoch, or a job someone else finished, is still lost.
    assert decide([row(epoch=4, state=RunState.FINISHED)], [run(epoch=3)]) == [
        reconcile.Drop(1, "the job is no longer ours")
    ]
    assert decide([row(epoch=3, state=RunState.STOPPED)], [run(epoch=3)]) == [
        reconcile.Drop(1, "the job is no longer ours")
    ]


def test_an_unrecorded_outcome_is_recorded_again_whatever_the_row_says() -> None:
    ended = run(phase=Phase.ENDED, unrecorded=True)
    assert decide([mine()], [ended]) == [reconcile.Record(1)]
    assert decide([], [ended]) == [reconcile.Record(1)]  # PostgreSQL shows nothing


def test_a_running_run_whose_row_moved_on_is_dropped() -> None:
    taken = mine(epoch=4, owner="s2", owner_incarnation="x")
    assert decide([taken], [run()]) == [reconcile.Drop(1, "the job is no longer ours")]
    assert decide([], [run()]) == [reconcile.Drop(1, "the job is no longer ours")]
    other_incarnation = mine(owner_incarnation="someone-else")
    assert decide([other_incarnation], [run()])[0] == reconcile.Drop(1, "the job is no longer ours")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"desired": "stopped"}, "stop requested"),
        ({"job_generation": 2}, "restart requested"),
        ({"target": "s2"}, "migrating to s2"),
        ({"target": None}, "migrating to no server"),
    ],
)
def test_a_running_run_is_stopped_for_stop_restart_or_migration(
    changes: dict[str, object], reason: str
) -> None:
    warm = reason == "migrating to s2"  # a planned move of a streaming job
    assert decide([mine(**changes)], [run()]) == [reconcile.Stop(1, reason, warm)]


def test_no_migration_before_the_settle_time_but_stops_still_apply() -> None:
    moved = mine(target="s2")
    assert decide([moved], [run()], may_migrate=False) == []
    stopped = mine(target="s2", desired="stopped")
    assert decide([stopped], [run()], may_migrate=False) == [reconcile.Stop(1, "stop requested")]


def test_a_running_run_still_recorded_as_starting_is_marked_running_again() -> None:
    assert decide([mine(state=RunState.STARTING)], [run()]) == [reconcile.MarkRunning(1)]


def test_runs_starting_or_stopping_are_left_to_their_tasks() -> None:
    for phase in (Phase.STARTING, Phase.STOPPING):
        assert decide([mine(desired="stopped")], [run(phase=phase)]) == []


def test_a_healthy_run_needs_nothing() -> None:
    assert decide([mine()], [run()]) == []


# ------------------------------------------------------------------ rows without a run


def test_a_live_lease_of_this_server_id_without_a_run_is_an_orphan_handled_once() -> None:
    left = row(owner="s1", owner_incarnation=BEFORE.incarnation, epoch=2, state=RunState.RUNNING)
    assert decide([left]) == [reconcile.HandleOrphan(1)]
    assert decide([left], handled=((1, False),)) == []
    # Even when not targeted here, and even while claims are not allowed (adoption
    # happens before registration: its proof is local).
    assert decide([dataclasses.replace(left, target="s2")], may_claim=False) == [
        reconcile.HandleOrphan(1)
    ]


def test_an_expired_lease_of_a_previous_incarnation_is_read_here_before_any_claim() -> None:
    """M6 of safety review 3: the previous incarnation's run may have left how it ended
    in this work dir (a batch exit 0 whose record failed). Claimed over at once, it ran
    again; it is an orphan first (its outcome recorded, or released), claimed after."""
    expired = row(
        owner="s1",
        owner_incarnation=BEFORE.incarnation,
        epoch=2,
        state=RunState.RUNNING,
        lease_expired=True,
    )
    assert decide([expired]) == [reconcile.HandleOrphan(1)]
    assert decide([expired], handled=((1, True),)) == []
    assert decide([dataclasses.replace(expired, target="s2")]) == [reconcile.HandleOrphan(1)]
    assert reconcile.live_orphans([expired], ME) == {(1, True)}


def test_an_expired_lease_of_this_incarnation_without_a_run_is_claimable_here() -> None:
    """A claim of this incarnation whose commit answer was lost has no trace to read."""
    expired = row(
        owner="s1",
        owner_incarnation=ME.incarnation,
        epoch=2,
        state=RunState.STARTING,
        lease_expired=True,
    )
    assert decide([expired]) == [reconcile.Claim(1)]
    assert decide([dataclasses.replace(expired, target="s2")]) == []


def test_an_expired_lease_of_this_server_id_of_a_job_wanted_stopped_is_an_orphan() -> None:
    """Nobody else settles it: the coordinator places only jobs wanted running and reaps
    only departed owners' leases (CHAOS_SEED=798327972: stuck ``running`` for ever)."""
    expired = row(
        owner="s1",
        owner_incarnation=BEFORE.incarnation,
        epoch=2,
        state=RunState.RUNNING,
        lease_expired=True,
        desired="stopped",
        target=None,
    )
    assert decide([expired]) == [reconcile.HandleOrphan(1)]
    assert decide([expired], handled=((1, True),)) == []
    # Handled while live (left to expire), it is handled again once expired.
    assert decide([expired], handled=((1, False),)) == [reconcile.HandleOrphan(1)]
    assert decide([expired], may_claim=False) == [reconcile.HandleOrphan(1)]
    assert reconcile.live_orphans([expired], ME) == {(1, True)}
    # Wanted running and targeted elsewhere, it is read here too (above), then the
    # target's to claim.
    assert decide([dataclasses.replace(expired, desired="running", target="s2")]) == [
        reconcile.HandleOrphan(1)
    ]


@pytest.mark.parametrize(
    ("changes", "claims"),
    [
        ({}, True),
        ({"state": RunState.BACKOFF}, True),
        ({"state": RunState.BACKOFF, "claimable_now": False}, False),
        ({"state": RunState.STOPPED}, False),
        ({"state": RunState.FINISHED}, False),
        ({"state": RunState.FAILED}, False),
        ({"desired": "stopped"}, False),
        ({"target": "s2"}, False),
        ({"target": None}, False),
        ({"owner": "s2", "owner_incarnation": "x", "state": RunState.RUNNING}, False),
        (
            {
                "owner": "s2",
                "owner_incarnation": "x",
                "state": RunState.RUNNING,
                "lease_expired": True,
            },
            True,
        ),
    ],
)
def test_claims_only_free_rows_targeted_here(changes: dict[str, object], claims: bool) -> None:
    assert (decide([row(**changes)]) == [reconcile.Claim(1)]) is claims


def test_no_claim_unless_allowed() -> None:
    assert decide([row()], may_claim=False) == []


def test_no_claim_of_a_job_whose_lost_run_is_still_being_killed_here() -> None:
    free = [row(1), row(2)]
    conditions = reconcile.Conditions(ME, 4, may_claim=True, may_migrate=True, dying=frozenset({1}))
    assert reconcile.decide({r.job_id: r for r in free}, {}, conditions) == [reconcile.Claim(2)]


def test_claims_stop_at_capacity_counting_local_runs() -> None:
    free = [row(job_id) for job_id in range(10, 15)]
    assert decide(free, capacity=3) == [
        reconcile.Claim(10),
        reconcile.Claim(11),
        reconcile.Claim(12),
    ]
    running = [mine(job_id) for job_id in (1, 2)]
    runs = [run(job_id) for job_id in (1, 2)]
    assert decide(running + free, runs, capacity=3) == [reconcile.Claim(10)]


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "state": st.sampled_from(list(RunState)),
                "desired": st.sampled_from(["running", "stopped"]),
                "target": st.sampled_from(["s1", "s2", None]),
                "owner": st.sampled_from([None, "s1", "s2"]),
                "lease_expired": st.booleans(),
                "claimable_now": st.booleans(),
            }
        ),
        max_size=12,
    ),
    st.integers(min_value=0, max_value=6),
)
def test_never_more_claims_than_room_and_never_a_job_twice(
    specs: list[dict[str, object]], capacity: int
) -> None:
    rows = []
    for job_id, spec in enumerate(specs, start=1):
        owned = spec["owner"] is not None
        values = {
            **spec,
            # Only the owned states have an owner (the protocol never leaves another).
            "state": spec["state"] if not owned or spec["state"] in OWNED else RunState.RUNNING,
            "owner_incarnation": "someone" if owned else None,
            "lease_expired": bool(spec["lease_expired"]) and owned,
        }
        rows.append(row(job_id, **values))
    actions = decide(rows, capacity=capacity)
    claims = [a for a in actions if isinstance(a, reconcile.Claim)]
    assert len(claims) <= capacity
    assert len({a.job_id for a in actions}) == len(actions)
    for claim in claims:
        claimed = rows[claim.job_id - 1]
        assert claimed.target == "s1" and claimed.desired == "running"
        assert claimed.state not in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED)


# ------------------------------------------------------------------ phases and timing


def test_phase_transitions_are_declared_once() -> None:
    assert reconcile.may_enter(Phase.STARTING, Phase.RUNNING)
    assert reconcile.may_enter(Phase.RUNNING, Phase.STOPPING)
    assert reconcile.may_enter(Phase.STOPPING, Phase.ENDED)
    assert not reconcile.may_enter(Phase.ENDED, Phase.RUNNING)
    assert not reconcile.may_enter(Phase.STOPPING, Phase.RUNNING)


def test_next_look_is_the_earliest_due_row_targeted_here() -> None:
    rows = [
        row(1, due_in=3.0),
        row(2, due_in=0.7),
        row(3, target="s2", due_in=0.1),  # not ours to claim
        row(4, due_in=-1.0),  # already due: the claim was tried now
    ]
    assert reconcile.next_look(rows, "s1", default=2.0) == 0.7
    assert reconcile.next_look([], "s1", default=2.0) == 2.0
    assert reconcile.next_look([row(1, due_in=9.0)], "s1", default=2.0) == 2.0


@pytest.mark.parametrize(
    ("reason", "exit_code", "recorded", "shutting_down", "expected"),
    [
        # The job's own code failed: a crash, whose budget SQL spends (batch too).
        ("exited", 3, False, False, reconcile.Ending.CRASH),
        ("exited", 1, False, True, reconcile.Ending.CRASH),
        ("exited", -9, False, False, reconcile.Ending.CRASH),
        # SIGTERM from the service manager while we shut down: a hand-off.
        ("exited", 143, False, True, reconcile.Ending.RELEASE),
        ("exited", -15, False, True, reconcile.Ending.RELEASE),
        ("exited", 143, False, False, reconcile.Ending.CRASH),
        # Exit 0: finished.
        ("exited", 0, False, False, reconcile.Ending.FINISH),
        # Recorded by its watchdog (exit 0 or a crash): nothing is left to write.
        ("exited", 0, True, False, reconcile.Ending.RECORDED),
        ("exited", 3, True, False, reconcile.Ending.RECORDED),
        ("exited", 143, True, True, reconcile.Ending.RECORDED),
        # Ended by us or by its lease: nothing of the job's own, never counted.
        ("stopped", None, False, False, reconcile.Ending.RELEASE),
        ("lease_expired", None, False, False, reconcile.Ending.RELEASE),
        ("killed", None, False, True, reconcile.Ending.RELEASE),
    ],
)
def test_how_an_ended_run_is_recorded(
    reason: str,
    exit_code: int | None,
    recorded: bool,
    shutting_down: bool,
    expected: reconcile.Ending,
) -> None:
    got = reconcile.ending(reason, exit_code, recorded=recorded, shutting_down=shutting_down)
    assert got is expected


@pytest.mark.parametrize(
    ("reason", "exit_code", "stopping", "expected"),
    [
        # The driver's own exit: what its server would write (hole H5: a crash while
        # the server is stalled or dead is counted, never lost).
        ("exited", 0, False, reconcile.Ending.FINISH),
        ("exited", 1, False, reconcile.Ending.CRASH),
        ("exited", -9, False, reconcile.Ending.CRASH),
        ("exited", 143, False, reconcile.Ending.CRASH),
        # During a stop a nonzero exit is the server's to judge (released, not counted);
        # an exit 0 still ran to its end.
        ("exited", 0, True, reconcile.Ending.FINISH),
        ("exited", 1, True, None),
        ("exited", 143, True, None),
        # Not an exit of the driver itself: left to the owner (a release, or at launch).
        ("stopped", None, True, None),
        ("lease_expired", None, False, None),
        ("killed", None, False, None),
        ("spawn_failed", None, False, None),
    ],
)
def test_what_a_watchdog_records_itself(
    reason: str, exit_code: int | None, stopping: bool, expected: reconcile.Ending | None
) -> None:
    assert reconcile.watchdog_ending(reason, exit_code, stopping=stopping) is expected


@given(
    reason=st.sampled_from(["exited", "stopped", "lease_expired", "killed", "spawn_failed"]),
    exit_code=st.one_of(st.none(), st.integers(-64, 255)),
    stopping=st.booleans(),
)
def test_a_watchdog_records_only_what_its_server_would_record(
    reason: str, exit_code: int | None, stopping: bool
) -> None:
    """Whatever its watchdog records is what the server itself decides for that ending
    (when not shutting down, as the watchdog cannot know): the record of a stalled or
    dead server's run is the same as a live server's."""
    recorded = reconcile.watchdog_ending(reason, exit_code, stopping=stopping)
    if recorded is not None:
        assert recorded is reconcile.ending(reason, exit_code, recorded=False, shutting_down=False)
        if exit_code != 0:
            # Not during a stop: a service manager's SIGTERM reaches the watchdog too.
            assert not stopping


# ------------------------------------------------------------------ warm hand-off


def decide_warm(
    rows: list[distribution.Row],
    runs: list[reconcile.LocalRun] = (),  # type: ignore[assignment]
    *,
    warm: dict[int, int] | None = None,
    capacity: int = 4,
    may_claim: bool = True,
) -> list[reconcile.Action]:
    return reconcile.decide(
        {r.job_id: r for r in rows},
        {r.job_id: r for r in runs},
        reconcile.Conditions(ME, capacity, may_claim=may_claim, may_migrate=True),
        warm=warm or {},
    )


def handing_off(job_id: int = 1, epoch: int = 3, **changes: object) -> distribution.Row:
    """A row of s2's run, stopping for a planned move to s1 with a warm hand-off offered."""
    values = {
        "owner": "s2",
        "owner_incarnation": "x",
        "epoch": epoch,
        "state": RunState.STOPPING,
        "handoff_epoch": epoch,
        **changes,
    }
    return row(job_id, **values)


@pytest.mark.parametrize(
    ("changes", "warm"),
    [
        ({"target": "s2"}, True),  # a drain, a join's rebalance, ring rebalance
        ({"job_generation": 2, "job_revision": 2, "revision": 1}, True),  # job update's roll
        ({"target": None}, False),  # no server to go to: nothing to pre-start
        ({"desired": "stopped"}, False),
        ({"job_generation": 2}, False),  # job restart: a restart is cold
        ({"target": "s2", "kind": "batch"}, False),  # a batch run is never moved
        ({"target": "s2", "warm_allowed": False}, False),  # sparkring.handoff.warm=false
    ],
)
def test_only_a_planned_move_of_a_streaming_job_offers_a_warm_hand_off(
    changes: dict[str, object], warm: bool
) -> None:
    actions = decide([mine(**changes)], [run()])
    assert len(actions) == 1 and isinstance(actions[0], reconcile.Stop)
    assert actions[0].warm is warm


def test_the_target_of_an_offered_hand_off_pre_starts_a_warm_driver() -> None:
    assert decide_warm([handing_off()]) == [reconcile.PreStart(1, epoch=4)]


@pytest.mark.parametrize(
    "changes",
    [
        {"handoff_epoch": None},  # a stop without an offer: a fault or a cold move
        {"handoff_epoch": 2},  # an offer of an earlier run
        {"state": RunState.RUNNING},  # not stopping (yet)
        {"lease_expired": True},  # the owner is lost: a fault keeps the cold path
        {"target": "s3"},  # another server's to pre-start
        {"desired": "stopped"},
        {"kind": "batch"},
        {"warm_allowed": False},
    ],
)
def test_no_warm_driver_without_a_live_offer_of_a_planned_move(changes: dict[str, object]) -> None:
    decided = decide_warm([handing_off(**changes)])
    assert not any(isinstance(action, reconcile.PreStart) for action in decided)


def test_a_warm_driver_is_started_once_and_only_with_room_and_claims_allowed() -> None:
    assert decide_warm([handing_off()], warm={1: 4}) == []
    assert decide_warm([handing_off()], may_claim=False) == []
    full = [run(job_id) for job_id in (7, 8)]
    assert decide_warm([handing_off(), *(mine(j) for j in (7, 8))], full, capacity=2) == []
    other = handing_off(9, epoch=0, handoff_epoch=None)  # its warm driver is kept
    assert decide_warm([handing_off(), other], warm={9: 1}, capacity=1) == []


def test_a_roll_pre_starts_its_next_driver_beside_its_own_stopping_run() -> None:
    """The server rolls its own run: the stopping run's slot is the warm driver's."""
    rolling = mine(
        state=RunState.STOPPING, handoff_epoch=3, job_generation=2, job_revision=2, revision=1
    )
    stopping = run(phase=Phase.STOPPING)
    assert decide_warm([rolling], [stopping], capacity=1) == [reconcile.PreStart(1, epoch=4)]


@pytest.mark.parametrize(
    "changes",
    [
        {},  # the old owner still stopping
        {"state": RunState.PENDING, "owner": None, "owner_incarnation": None},  # released
        {"epoch": 4, "state": RunState.STARTING, "owner": "s1", "owner_incarnation": "now"},
    ],
)
def test_a_warm_driver_is_kept_while_its_hand_off_may_still_reach_it(
    changes: dict[str, object],
) -> None:
    decided = decide_warm([handing_off(**changes)], warm={1: 4})
    assert not any(isinstance(a, reconcile.Discard | reconcile.PreStart) for a in decided)


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ([], "the job is gone"),
        ([handing_off(target="s3")], "the job moved to s3"),
        ([handing_off(desired="stopped")], "the job is wanted stopped"),
        ([handing_off(epoch=4, owner="s3", owner_incarnation="y")], "claimed at epoch 4 by s3"),
        ([handing_off(epoch=5)], "the job is at epoch 5"),
        (
            [handing_off(epoch=4, owner=None, owner_incarnation=None, state=RunState.PENDING)],
            "epoch 4 was claimed and has ended",
        ),
    ],
)
def test_a_warm_driver_whose_hand_off_went_elsewhere_is_discarded(
    rows: list[distribution.Row], why: str
) -> None:
    assert reconcile.Discard(1, why) in decide_warm(rows, warm={1: 4})


@pytest.mark.parametrize(
    ("changes", "wait"),
    [
        ({"warm_ready_epoch": 3}, reconcile.WarmWait.READY),
        ({}, reconcile.WarmWait.WAIT),
        ({"target": "s3"}, reconcile.WarmWait.WAIT),  # retargeted: s3 may go warm too
        ({"target": None}, reconcile.WarmWait.GIVE_UP),
        ({"desired": "stopped"}, reconcile.WarmWait.GIVE_UP),
        ({"job_generation": 2}, reconcile.WarmWait.WAIT),  # a roll is a new generation
        ({"owner": "s3"}, reconcile.WarmWait.GIVE_UP),
        ({"epoch": 4}, reconcile.WarmWait.GIVE_UP),
        ({"handoff_epoch": None}, reconcile.WarmWait.GIVE_UP),
        ({"warm_ready_epoch": 2}, reconcile.WarmWait.WAIT),  # an earlier hand-off's
    ],
)
def test_the_old_owner_waits_for_a_warm_driver_only_while_its_offer_stands(
    changes: dict[str, object], wait: reconcile.WarmWait
) -> None:
    offered = handing_off(**{"owner": "s1", "owner_incarnation": "now", "target": "s2", **changes})
    assert reconcile.warm_wait(offered, ME, 3) is wait
    assert reconcile.warm_wait(None, ME, 3) is reconcile.WarmWait.GIVE_UP


def test_a_warm_driver_counts_against_the_capacity_of_claims() -> None:
    """M7 of safety review 3: claims counted only runs while pre-starts counted runs and
    warm drivers, so a server with warm drivers ran more JVMs than its capacity. A warm
    driver takes a slot; the claim of its own job takes that slot, not another."""
    running, warmed, other = mine(1), row(2), row(3)
    warming = handing_off(2)  # job 2's hand-off to this server, its warm driver started
    actions = decide_warm([running, warming, other], [run(1)], warm={2: 4}, capacity=2)
    assert not any(isinstance(a, reconcile.Claim) for a in actions)
    actions = decide_warm([running, warmed], [run(1)], warm={2: 1}, capacity=2)
    assert [a.job_id for a in actions if isinstance(a, reconcile.Claim)] == [2]


@pytest.mark.parametrize("exit_code", [75, 1, 0, -9])
def test_a_warm_driver_that_never_got_its_go_is_released_not_crashed(exit_code: int) -> None:
    """M2 of safety review 3: a warm driver taken but never told to go (its server died
    between the link and the go; the successor adopted the run) exits after its own go
    timeout; it ran nothing of the job's: a release, never a crash of the budget."""
    got = reconcile.ending("exited", exit_code, recorded=False, shutting_down=False, went=False)
    assert got is reconcile.Ending.RELEASE


def test_a_result_without_its_go_reads_as_not_went(tmp_path: Path) -> None:
    (tmp_path / rundir.RESULT_FILE).write_text(
        json.dumps({"reason": "exited", "exit_code": 75, "ended_at": 1.0, "went": False})
    )
    assert driver.Driver.outcome_of(tmp_path).went is False
    (tmp_path / rundir.RESULT_FILE).write_text(
        json.dumps({"reason": "exited", "exit_code": 1, "ended_at": 1.0})
    )
    assert driver.Driver.outcome_of(tmp_path).went is True  # a result of older code
