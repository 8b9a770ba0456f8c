"""The campaign's checks catch what they claim to: each one fed a violation and a clean
history (no services needed)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from testing.chaos import invariants


def _beats(job: str, pid: int, start: float, end: float, server: str = "s") -> list[dict]:
    t, out = start, []
    while t <= end:
        out.append({"job": job, "epoch": "1", "server": server, "pid": pid, "t": t})
        t += 0.2
    return out


def test_heartbeats_of_two_drivers_at_once_are_a_double_run() -> None:
    clean = _beats("a", 1, 0, 5) + _beats("a", 2, 6, 9) + _beats("b", 3, 0, 9)
    assert invariants.heartbeat_overlaps(clean) == []
    twice = _beats("a", 1, 0, 5) + _beats("a", 2, 4, 9)
    assert len(invariants.heartbeat_overlaps(twice)) == 1
    assert invariants.heartbeat_overlaps(twice, margin=2.0) == []


def test_records_are_compared_on_boottime_not_the_wall_clock() -> None:
    """A wall-clock step (NTP, an operator) between two drivers' lives must neither hide
    a double run nor invent one: records that all carry ``mono`` (CLOCK_BOOTTIME) are
    compared on it."""

    def stepped(beats: list[dict], mono_shift: float, wall_shift: float) -> list[dict]:
        return [{**b, "mono": b["t"] + mono_shift, "t": b["t"] + wall_shift} for b in beats]

    # Driver 2 started 1 s after driver 1 ended, but the wall clock was stepped back
    # 3 s in between: on ``t`` they overlap, on ``mono`` they do not.
    first, second = _beats("a", 1, 0, 5), _beats("a", 2, 6, 9)
    apart = stepped(first, 100, 0) + stepped(second, 100, -3)
    assert invariants.heartbeat_overlaps(apart) == []
    # Driver 2 started while driver 1 still beat, and the clock was stepped forward 10 s
    # meanwhile: on ``t`` they are apart, on ``mono`` they overlap.
    overlapping = stepped(first, 100, 0) + stepped(_beats("a", 2, 4, 9), 100, 10)
    assert len(invariants.heartbeat_overlaps(overlapping)) == 1
    # The same for lifetime records, and an un-ended life compared with ``now`` on
    # BOOTTIME.
    one = [{**r, "mono": r["t"] + 100} for r in _life("a", 1, "s1", 0, 5)]
    two = [{**r, "mono": r["t"] + 100, "t": r["t"] + 10} for r in _life("a", 2, "s1", 4, None)]
    assert len(invariants.lifetime_overlaps(one + two, now=110)) == 1
    # One record without ``mono`` puts the whole comparison on the wall clock.
    assert invariants.records_clock([*one, *_life("a", 3, "s1", 0, 1)]) == "t"


def test_one_pid_on_two_servers_is_two_drivers() -> None:
    # Keyed by pid alone, these two drivers were one span 0-9 s: the overlap was unseen.
    same_pid = _beats("a", 7, 0, 5, server="s1") + _beats("a", 7, 3, 9, server="s2")
    assert len(invariants.heartbeat_overlaps(same_pid)) == 1
    apart = _beats("a", 7, 0, 5, server="s1") + _beats("a", 7, 6, 9, server="s2")
    assert invariants.heartbeat_overlaps(apart) == []


def _life(
    job: str,
    epoch: int,
    server: str,
    start: float,
    end: float | None,
    *,
    pid: int | None = None,
    reason: str = "exited",
    exit_code: int | None = 0,
) -> list[dict]:
    pid = epoch * 100 if pid is None else pid
    who = {"job": job, "epoch": epoch, "server": server, "pid": pid}
    out = [{**who, "event": "started", "t": start}]
    if end is not None:
        out.append({**who, "event": "ended", "t": end, "reason": reason, "exit_code": exit_code})
    return out


def test_lifetimes_overlap_including_a_driver_still_alive() -> None:
    clean = _life("a", 1, "s1", 0, 5) + _life("a", 2, "s2", 6, None)
    assert invariants.lifetime_overlaps(clean, now=10) == []
    alive = _life("a", 1, "s1", 0, None) + _life("a", 2, "s2", 6, 8)
    assert len(invariants.lifetime_overlaps(alive, now=10)) == 1


def _killed_at(records: list[dict], t: float, late_kills: int | None = None) -> list[dict]:
    """``records`` of one life with a ``killed`` record at ``t`` (the watchdog's first
    SIGKILL round) and, when given, ``late_kills`` in its ``ended`` record."""
    started, *ended = records
    killed = {**{k: started[k] for k in ("job", "epoch", "server", "pid")}, "event": "killed"}
    if late_kills is not None:
        ended = [{**r, "late_kills": late_kills} for r in ended]
    return [started, {**killed, "t": t}, *ended]


def test_a_killed_driver_stops_running_at_its_first_kill_not_at_its_reaping() -> None:
    # Killed at 5, reaped at 12 (a saturated host); its successor started at 6.
    slow_reap = _killed_at(_life("a", 1, "s1", 0, 12, reason="lease_expired"), 5, 0)
    successor = _life("a", 2, "s2", 6, None)
    assert invariants.lifetime_overlaps(slow_reap + successor, now=20) == []
    # Its watchdog hung after the kill: only the server's sweep wrote an end, later.
    hung = _killed_at(_life("a", 1, "s1", 0, 15, reason="killed", exit_code=None), 5)
    assert invariants.lifetime_overlaps(hung + successor, now=20) == []
    # A descendant that had left the group died only at the reaping: it ran until then.
    late = _killed_at(_life("a", 1, "s1", 0, 12, reason="lease_expired"), 5, 1)
    [problem] = invariants.lifetime_overlaps(late + successor, now=20)
    assert "overlap by 6.000 s" in problem
    # Without a killed record nothing changes: the end is the ended record.
    assert len(invariants.lifetime_overlaps(_life("a", 1, "s1", 0, 12) + successor, now=20)) == 1


def test_two_incarnations_driving_one_epoch_are_two_drivers() -> None:
    # Two incarnations of server s1 each started a driver for epoch 3 (same-id restart).
    both = _life("a", 3, "s1", 0, None, pid=11) + _life("a", 3, "s1", 2, 6, pid=12)
    assert len(invariants.lifetime_overlaps(both, now=10)) == 1


def _event(
    i: int, kind: str, server: str | None, epoch: int | None, job: str = "a", **detail: object
) -> dict:
    return {
        "id": i,
        "job_name": job,
        "kind": kind,
        "server": server,
        "epoch": epoch,
        "detail": detail,
    }


def test_a_write_by_an_old_epoch_after_a_newer_claim_is_stale() -> None:
    clean = [
        _event(1, "claimed", "s1", 1),
        _event(2, "driver_started", "s1", 1),
        _event(3, "retargeted", "s2", None),
        _event(4, "claimed", "s2", 2),
        _event(5, "driver_started", "s2", 2),
    ]
    assert invariants.stale_writes(clean) == []
    late = [*clean, _event(6, "released", "s1", 1)]
    assert len(invariants.stale_writes(late)) == 1
    impostor = [*clean, _event(6, "stopping", "s3", 2)]
    assert len(invariants.stale_writes(impostor)) == 1


def test_lost_jobs_are_wanted_running_without_a_live_owner() -> None:
    base = {"desired": "running", "target": "s1", "last_error": None, "max_restarts": 3}
    base["epoch"] = 1
    jobs = [
        {**base, "name": "ok", "state": "running", "owner": "s1"},
        {**base, "name": "dead-owner", "state": "running", "owner": "s9"},
        {**base, "name": "pending", "state": "pending", "owner": None},
        {**base, "name": "backoff", "state": "backoff", "owner": None},
        {**base, "name": "stopped", "state": "stopped", "owner": None},
        {**base, "name": "done", "state": "finished", "owner": None},
        {**base, "name": "off", "desired": "stopped", "state": "stopped", "owner": None},
    ]
    behind = _life("ok", 1, "s1", 0, None) + _life("dead-owner", 1, "s9", 0, None)
    lost = invariants.lost_jobs(jobs, live={"s1"}, events=[], lifetimes=behind, heartbeats=[])
    assert [p.split(":")[0] for p in lost] == ["dead-owner", "pending", "backoff", "stopped"]


def _running(name: str = "j", owner: str = "s1", epoch: int = 2) -> dict:
    return {
        "name": name,
        "desired": "running",
        "state": "running",
        "owner": owner,
        "target": owner,
        "epoch": epoch,
        "last_error": None,
        "max_restarts": 3,
    }


def test_a_running_row_with_no_driver_behind_it_is_lost() -> None:
    """The row is not evidence that a driver runs (holes H3(b), H4): a job running on a
    live owner needs an un-ended lifetime record at (job, epoch, owner), or a heartbeat of
    that driver within the window before the check."""

    def lost(lifetimes: list[dict], heartbeats: list[dict]) -> list[str]:
        return invariants.lost_jobs(
            [_running()],
            {"s1"},
            [],
            lifetimes=lifetimes,
            heartbeats=heartbeats,
            now=100.0,
            now_mono=1000.0,
        )

    # Nothing behind the row: lost, whatever the row says.
    nothing = lost([], [])
    assert len(nothing) == 1 and "no live driver" in nothing[0], nothing
    # A driver of this epoch on the owner, not ended: observed.
    assert lost(_life("j", 2, "s1", 10, None), []) == []
    # Ended, of another epoch, or on another server: not this row's driver.
    assert len(lost(_life("j", 2, "s1", 10, 20), [])) == 1
    assert len(lost(_life("j", 1, "s1", 10, None), [])) == 1
    assert len(lost(_life("j", 2, "s2", 10, None), [])) == 1
    # A heartbeat of that driver within the window (on the one clock both sides have:
    # BOOTTIME) is enough; an old one is not, nor one of another epoch.
    beat = {"job": "j", "epoch": "2", "server": "s1", "pid": 5, "t": 50.0, "mono": 998.0}
    assert lost([], [beat]) == []
    assert len(lost([], [{**beat, "mono": 900.0}])) == 1
    assert len(lost([], [{**beat, "epoch": "1"}])) == 1
    # A heartbeat without ``mono`` (an older driver) is compared on the wall clock.
    wall = {k: v for k, v in beat.items() if k != "mono"}
    assert lost([], [{**wall, "t": 98.0}]) == []
    assert len(lost([], [{**wall, "t": 50.0}])) == 1


def _lost(jobs: list[dict], events: list[dict]) -> list[str]:
    """S3 for jobs that are not running (no driver evidence needed), s1 live."""
    return invariants.lost_jobs(jobs, {"s1"}, events, lifetimes=[], heartbeats=[])


def _failed_job(name: str, max_restarts: int = 2) -> dict:
    return {
        "name": name,
        "desired": "running",
        "state": "failed",
        "owner": None,
        "target": "s1",
        "last_error": "some reason",
        "max_restarts": max_restarts,
    }


def _crashes(job: str, first_id: int, count: int, error: str, kind: str = "crashed") -> list:
    return [_event(first_id + i, kind, "s1", i + 1, job, error=error) for i in range(count)]


def test_failed_counts_as_lost_unless_its_own_driver_failed_past_its_budget() -> None:
    exited = "driver exited with exit code 1: Traceback"
    started = [_event(0, "start_requested", None, None, "j", generation=1)]
    # max_restarts 2: three driver failures (two crashes, then the failure) are the budget.
    budget = started + _crashes("j", 1, 2, exited) + _crashes("j", 3, 1, exited, "failed")
    assert _lost([_failed_job("j")], budget) == []
    # A reason in last_error is not enough: with no such events the job was lost.
    assert len(_lost([_failed_job("j")], started)) == 1
    # Two driver failures, then a transient start-up error made terminal (hole 5).
    transient = (
        started
        + _crashes("j", 1, 2, exited)
        + _crashes("j", 3, 1, "lease deadline passed while preparing the driver", "failed")
    )
    assert len(_lost([_failed_job("j")], transient)) == 1
    # Deferrals are not failures of the driver.
    deferred = (
        started
        + _crashes("j", 1, 3, "artifact unavailable: S3 down", "deferred")
        + _crashes("j", 4, 1, exited, "failed")
    )
    assert len(_lost([_failed_job("j")], deferred)) == 1
    # Failures of an earlier generation do not count against the current one.
    earlier = [
        *budget,
        _event(9, "restart_requested", None, None, "j", generation=2),
        *_crashes("j", 10, 1, exited, "failed"),
    ]
    assert len(_lost([_failed_job("j")], earlier)) == 1


def test_a_batch_job_failed_before_its_retries_were_spent_is_lost() -> None:
    """Batch retries spend max_restarts as streaming restarts do: a batch job FAILED at
    its first driver failure with retries left (the behaviour before --max-retries)
    is a violation; FAILED after max_restarts + 1 failures, or with a budget of 0 after
    one, is not."""
    exited = "driver exited with exit code 3: boom"
    started = [_event(0, "start_requested", None, None, "b", generation=1)]
    batch = {**_failed_job("b", max_restarts=2), "kind": "batch"}
    first = started + _crashes("b", 1, 1, exited, "failed")
    assert len(_lost([batch], first)) == 1
    spent = started + _crashes("b", 1, 2, exited) + _crashes("b", 3, 1, exited, "failed")
    assert _lost([batch], spent) == []
    no_retries = {**batch, "max_restarts": 0}
    assert _lost([no_retries], first) == []


def test_failed_for_an_invalid_artifact_or_spec_is_not_lost() -> None:
    started = [_event(0, "start_requested", None, None, "j", generation=1)]
    refused = started + _crashes(
        "j", 1, 1, "artifact refused: sha256 mismatch for heartbeat:2", "failed"
    )
    assert _lost([_failed_job("j")], refused) == []
    spec = started + _crashes("j", 1, 1, "job j: invalid Spark conf key 'a b'", "failed")
    assert _lost([_failed_job("j")], spec) == []
    # The runner names the cause in the event: "invalid" is legitimate, "driver" is not
    # unless the budget is spent.
    for cause, lost in (("invalid", 0), ("driver", 1)):
        event = _event(1, "failed", "s1", 1, "j", error="whatever went wrong", cause=cause)
        assert len(_lost([_failed_job("j")], [*started, event])) == lost


def test_a_restart_of_a_live_run_keeps_the_failures_that_count_towards_failed() -> None:
    """A restart (or a rolling revision) of a job whose driver failed and waits in
    backoff gives a new generation but keeps the restart count (scheduler/jobs.py): one
    more failure of a batch job with ``--max-retries 1`` makes it FAILED legitimately.
    Only a re-run of a job at rest (``rerun``) starts the count again."""
    exited = "driver exited with exit code 3: boom"
    batch = {**_failed_job("b", max_restarts=1), "kind": "batch"}
    head = [
        _event(0, "start_requested", None, None, "b", generation=1),
        _event(1, "claimed", "s1", 1, "b"),
        _event(2, "crashed", "s1", 1, "b", error=exited),
    ]
    tail = [_event(4, "claimed", "s1", 2, "b"), _event(5, "failed", "s1", 2, "b", error=exited)]
    live_restart = _event(3, "restart_requested", None, None, "b", generation=2, rerun=False)
    assert _lost([batch], [*head, live_restart, *tail]) == []
    rolled = _event(3, "revised", None, None, "b", generation=2, effect="rolling", revision=2)
    assert _lost([batch], [*head, rolled, *tail]) == []
    # Events of the code before ``rerun``: the restart came while the job was not at
    # rest (its last event a crash), so the count went on.
    legacy = _event(3, "restart_requested", None, None, "b", generation=2)
    assert _lost([batch], [*head, legacy, *tail]) == []
    # A restart on a stall (its owner's restart_run, detail "by") spends one restart as a
    # failure does: max_restarts 1, one stall restart, one failure: FAILED legitimately.
    stall = [
        _event(0, "start_requested", None, None, "b", generation=1),
        _event(1, "claimed", "s1", 1, "b"),
        _event(2, "restart_requested", "s1", 1, "b", generation=2, restarts=1, by="stalled"),
        *tail,
    ]
    assert _lost([batch], stall) == []
    # A re-run of the job at rest starts the count again: one failure since is too few.
    rerun = _event(3, "restart_requested", None, None, "b", generation=2, rerun=True)
    assert len(_lost([batch], [*head, rerun, *tail])) == 1
    # So does a restart of a batch job waiting in backoff (runs.fresh_retries, M4).
    fresh = _event(
        3, "restart_requested", None, None, "b", generation=2, rerun=False, retries_reset=True
    )
    assert len(_lost([batch], [*head, fresh, *tail])) == 1


def test_a_rolling_revision_gives_the_generation_its_claim_runs() -> None:
    """``job update`` / ``rollback`` of a live streaming job (or a batch one with
    --restart) rolls it: a new generation, recorded in the ``revised`` event. A claim
    after it runs that generation, so a generation that ended as the roll committed
    does not make the roll's claim a resurrection; a revision that did not roll (no
    generation in its detail: at rest, or a batch run kept) legalizes nothing."""

    def history(*rest: dict) -> list[dict]:
        return [
            _event(1, "start_requested", None, None, generation=1),
            _event(2, "claimed", "s1", 1),
            _event(3, "driver_started", "s1", 1),
            *rest,
        ]

    rolled = history(
        _event(4, "revised", None, None, revision=2, effect="rolling", generation=2),
        _event(5, "finished", "s1", 1),
        _event(6, "claimed", "s1", 2),
    )
    assert invariants.terminal_resurrections(rolled) == []
    assert invariants.claim_generations(rolled) == {1: 1, 2: 2}
    kept = history(
        _event(4, "finished", "s1", 1),
        _event(5, "revised", None, None, revision=2, effect="at rest"),
        _event(6, "claimed", "s1", 2),
    )
    assert len(invariants.terminal_resurrections(kept)) == 1
    # Batch: the rolled generation may run to its end again; without the roll it may not.
    kinds = {"a": "batch"}
    twice = _life("a", 1, "s1", 0, 4) + _life("a", 2, "s1", 6, 10)
    assert invariants.batch_generations(kinds, twice, rolled) == []
    assert len(invariants.batch_generations(kinds, twice, kept)) == 2


def test_a_finished_job_claimed_again_is_resurrected() -> None:
    was = {"done": {"state": "finished", "epoch": 1, "attempt": 1}}
    assert invariants.resurrections(was, was, []) == []
    again = {"done": {"state": "starting", "epoch": 2, "attempt": 2}}
    assert len(invariants.resurrections(was, again, [])) == 1
    claimed = [{"job_name": "done", "kind": "claimed"}]
    assert len(invariants.resurrections(was, was, claimed)) == 1


def test_a_claim_after_a_generation_ended_is_a_resurrection() -> None:
    def history(*ending: dict) -> list[dict]:
        return [
            _event(1, "start_requested", None, None, generation=1),
            _event(2, "claimed", "s1", 1),
            _event(3, "driver_started", "s1", 1),
            *ending,
        ]

    for end in (
        _event(4, "finished", "s1", 1),
        _event(4, "failed", "s1", 1, error="driver exited with exit code 1"),
        _event(4, "released", "s1", 1, state="stopped"),
    ):
        assert invariants.terminal_resurrections(history(end)) == []
        again = history(end, _event(5, "claimed", "s2", 2))
        assert len(invariants.terminal_resurrections(again)) == 1, end["kind"]
        commanded = history(
            end,
            _event(5, "start_requested", None, None, generation=2),
            _event(6, "claimed", "s2", 2),
        )
        assert invariants.terminal_resurrections(commanded) == [], end["kind"]
    # A migration releases to pending: the next claim is the same generation, legally.
    moved = history(_event(4, "released", "s1", 1, state="pending"), _event(5, "claimed", "s2", 2))
    assert invariants.terminal_resurrections(moved) == []
    # A restart committed while the old generation finished: the claim runs generation 2.
    raced = history(
        _event(4, "restart_requested", None, None, generation=2),
        _event(5, "finished", "s1", 1),
        _event(6, "claimed", "s1", 2),
    )
    assert invariants.terminal_resurrections(raced) == []
    # A start that only resumed a stopping job gives no new generation.
    resumed = history(
        _event(4, "released", "s1", 1, state="stopped"),
        _event(5, "start_requested", None, None),
        _event(6, "claimed", "s1", 2),
    )
    assert len(invariants.terminal_resurrections(resumed)) == 1


def test_a_second_ended_record_from_the_servers_sweep_does_not_rewrite_a_life() -> None:
    """The watchdog recorded its driver's exit 0 (its ``ended`` record, then the finish
    in PostgreSQL), then failed to write its result file (the disk was full) and died;
    the server's sweep, finding no result, wrote an ``ended`` record of its own (reason
    ``killed``, no exit code). The driver ended as its watchdog said: the generation
    finished with a driver that exited 0 (CHAOS_SEED=349316888, disk_full on the
    ticker's server; the later record used to replace the first)."""
    kinds = {"b": "batch"}
    life = _life("b", 1, "s1", 0, 4)
    swept = {**life[1], "t": 5, "reason": "killed", "exit_code": None}
    events = [*_claims((1, 1)), _event(10, "finished", "s1", 1, "b")]
    assert invariants.batch_generations(kinds, [*life, swept], events) == []


def _claims(*epochs_and_generations: tuple[int, int]) -> list[dict]:
    out, i = [], 0
    for epoch, generation in epochs_and_generations:
        i += 1
        out.append(_event(i, "start_requested", None, None, "b", generation=generation))
        i += 1
        out.append(_event(i, "claimed", "s1", epoch, "b"))
    return out


def test_a_batch_generation_runs_to_its_end_once() -> None:
    kinds = {"b": "batch", "st": "streaming"}
    once = _life("b", 1, "s1", 0, 4)
    finished = [*_claims((1, 1)), _event(10, "finished", "s1", 1, "b")]
    assert invariants.batch_generations(kinds, once, finished) == []
    # The owner was lost: its driver was killed (and recorded ended) before the next one.
    lost_owner = _life("b", 1, "s1", 0, 3, reason="lease_expired", exit_code=-9)
    lost_owner += _life("b", 2, "s2", 5, 9)
    events = [*_claims((1, 1)), _event(9, "claimed", "s2", 2, "b")]
    assert invariants.batch_generations(kinds, lost_owner, events) == []
    # Two drivers of one generation ran to their end: the job ran twice (hole 1).
    twice = _life("b", 1, "s1", 0, 4) + _life("b", 2, "s1", 6, 10)
    problems = invariants.batch_generations(kinds, twice, events)
    assert any("ran to its end 2 times" in p for p in problems)
    assert any("started again" in p for p in problems)
    # The earlier driver has no ended record, or ended after the next started.
    unproven = _life("b", 1, "s1", 0, None) + _life("b", 2, "s2", 5, 9)
    assert len(invariants.batch_generations(kinds, unproven, events)) == 1
    late = _life("b", 1, "s1", 0, 6, reason="killed", exit_code=None)
    late += _life("b", 2, "s2", 5, 9)
    assert len(invariants.batch_generations(kinds, late, events)) == 1
    # A generation recorded finished whose only driver lost its lease: never ran to its
    # end, so the 'finished' is unproven; the message names the event and the drivers.
    killed = _life("b", 1, "s1", 0, 4, reason="lease_expired", exit_code=0)
    [problem] = invariants.batch_generations(kinds, killed, finished)
    assert "generation 1 finished (event 10 by s1 at epoch 1) with no driver" in problem
    assert "epoch 1 on s1" in problem and "lease_expired (exit code 0)" in problem
    # Recorded finished, but no driver of that generation exited 0.
    killed = _life("b", 1, "s1", 0, 3, reason="lease_expired", exit_code=-9)
    assert len(invariants.batch_generations(kinds, killed, finished)) == 1
    # A restart gives a new generation, which may run to its end again.
    rerun = _claims((1, 1), (2, 2))
    assert invariants.batch_generations(kinds, twice, rerun) == []
    # Streaming jobs are not batch generations; a driver at an unclaimed epoch is.
    streaming = _life("st", 1, "s1", 0, 4) + _life("st", 2, "s1", 5, 9)
    assert invariants.batch_generations(kinds, streaming, []) == []
    stray = _life("b", 7, "s3", 0, 1)
    assert len(invariants.batch_generations(kinds, stray, _claims((1, 1)))) == 1


def test_a_generation_whose_driver_failed_past_its_budget_ran_again() -> None:
    """Hole H5: a batch driver with no retries (max_restarts 0) exits 1 while its owner
    is stalled; nobody records the failure, the lease expires and a claim runs the
    generation again. Its lifetime records show a failure and then another life."""
    no_retries = [{"name": "b", "max_restarts": 0}]
    claims = [*_claims((1, 1)), _event(9, "claimed", "s2", 2, "b")]
    again = _life("b", 1, "s1", 0, 3, exit_code=1) + _life("b", 2, "s2", 5, 9)
    problems = invariants.budget_overruns(no_retries, again, claims)
    assert len(problems) == 1 and "run past its budget" in problems[0], problems
    # One retry allowed: two lives, the first failed, are within the budget.
    assert invariants.budget_overruns([{"name": "b", "max_restarts": 1}], again, claims) == []
    # A driver killed for a lost lease (or stopped, or killed) did not fail on its own.
    lease = _life("b", 1, "s1", 0, 3, reason="lease_expired", exit_code=-9)
    assert invariants.budget_overruns(no_retries, lease + again[2:], claims) == []
    # Nor did one that exited non-zero while it was being stopped (its watchdog says so:
    # the product spends no budget on it; CHAOS_SEED=500268951, bf0 exited 1 after a
    # stop's SIGTERM, then a start resumed the generation).
    stopped = [{**r, "stopping": True} if r["event"] == "ended" else r for r in again[:2]]
    assert invariants.budget_overruns(no_retries, stopped + again[2:], claims) == []
    # A failure the server recorded counts as well, even without an exit in the records
    # (the watchdog was killed before it could write one).
    recorded = [
        *claims,
        _event(10, "crashed", "s1", 1, "b", error="driver exited with exit code 1"),
    ]
    killed = _life("b", 1, "s1", 0, 3, reason="killed", exit_code=None) + again[2:]
    assert len(invariants.budget_overruns(no_retries, killed, recorded)) == 1
    # A new generation (an operator's start or restart) has a budget of its own.
    rerun = _claims((1, 1), (2, 2))
    assert invariants.budget_overruns(no_retries, again, rerun) == []


def test_a_failure_lost_to_a_postgresql_cut_does_not_spend_the_budget() -> None:
    """As an exit 0 (docs/drivers.md): a batch driver that fails while its server is cut
    off from PostgreSQL cannot be recorded; a claim made before the heal is blind to it
    and runs the generation again (CHAOS_SEED=392273535: bf0's epoch 5 on s3, cut 8.4 s,
    s1's claim before the heal). Excused only within the cut's bounds."""
    no_retries = [{"name": "b", "max_restarts": 0}]
    claims = [*_claims((1, 1)), _event(9, "claimed", "s2", 2, "b")]
    again = _life("b", 1, "s1", 0, 3, exit_code=1) + _life("b", 2, "s2", 5, 9)
    cut = invariants.Cut("s1", 2.0, 7.0)
    assert invariants.budget_overruns(no_retries, again, claims, cuts=[cut]) == []
    # Another server's cut, or one healed long before the next driver: no excuse.
    other = invariants.Cut("s3", 2.0, 7.0)
    assert len(invariants.budget_overruns(no_retries, again, claims, cuts=[other])) == 1
    early = invariants.Cut("s1", 1.0, 2.0)
    late_claim = _life("b", 1, "s1", 0, 1.5, exit_code=1) + _life("b", 2, "s2", 30, 39)
    assert len(invariants.budget_overruns(no_retries, late_claim, claims, cuts=[early])) == 1
    # Nor when the failure was recorded after all: the claim then knew of it.
    recorded = [
        *claims,
        _event(10, "failed", "s1", 1, "b", error="driver exited with exit code 1"),
    ]
    assert len(invariants.budget_overruns(no_retries, again, recorded, cuts=[cut])) == 1
    # Streaming jobs spend max_restarts the same way: four failures of max_restarts 3,
    # then a fifth driver.
    three = [{"name": "st", "max_restarts": 3}]
    epochs = [_event(i, "claimed", "s1", i, "st") for i in range(1, 6)]
    crashing = [
        r for i in range(1, 5) for r in _life("st", i, "s1", i * 10, i * 10 + 5, exit_code=2)
    ]
    assert invariants.budget_overruns(three, crashing, epochs) == []
    fifth = crashing + _life("st", 5, "s1", 60, None)
    assert len(invariants.budget_overruns(three, fifth, epochs)) == 1


def test_a_lease_released_or_claimed_while_its_driver_lives_is_early() -> None:
    def at(event: dict, t: float) -> dict:
        return {**event, "at_s": t}

    # Migration: the driver ended (t=4), then the release (5), then the new claim (6).
    lives = _life("a", 1, "s1", 0, 4, reason="stopped") + _life("a", 2, "s2", 7, None)
    handoff = [
        at(_event(1, "claimed", "s1", 1), 0),
        at(_event(2, "released", "s1", 1, state="pending"), 5),
        at(_event(3, "claimed", "s2", 2), 6),
    ]
    assert invariants.early_handoffs(handoff, lives) == []
    # A same-id incarnation released the lease at t=2 while the old driver lived to 4.
    early = [
        at(_event(1, "claimed", "s1", 1), 0),
        at(_event(2, "released", "s1", 1, state="pending"), 2),
        at(_event(3, "claimed", "s2", 2), 3),
    ]
    problems = invariants.early_handoffs(early, lives)
    assert len(problems) == 2
    assert "released by s1" in problems[0] and "claimed by s2" in problems[1]
    # A driver with no ended record is alive.
    open_ended = _life("a", 1, "s1", 0, None) + _life("a", 2, "s2", 7, None)
    assert len(invariants.early_handoffs(handoff, open_ended)) == 2


def test_a_lifetime_written_under_a_stepped_wall_clock_is_placed_by_boottime() -> None:
    """The fault ``clock_step`` moves a server's wall clock (and its watchdogs' and
    drivers') by minutes; BOOTTIME never moves. PostgreSQL's ``at_s`` is on the host's
    true wall clock, so a record's ``t`` that disagrees with its ``mono`` by more than
    STEPPED_CLOCK_S is placed by ``mono`` (``boot_to_wall``: true wall minus BOOTTIME)."""
    boot_to_wall = 1000.0  # true wall = mono + 1000

    def life(start_mono: float, end_mono: float, step: float) -> list[dict]:
        out = _life("a", 1, "s1", start_mono + boot_to_wall, end_mono + boot_to_wall + step)
        out[0]["mono"], out[1]["mono"] = start_mono, end_mono
        return out

    events = [
        {**_event(1, "claimed", "s1", 1), "at_s": boot_to_wall + 0},
        {**_event(2, "released", "s1", 1, state="pending"), "at_s": boot_to_wall + 5},
        {**_event(3, "claimed", "s2", 2), "at_s": boot_to_wall + 6},
    ]
    # The driver really ended at 8, after the release (5) and the claim (6), but its
    # server's clock was stepped back 300 s: its "ended" record says -292.
    stepped_back = life(0, 8, -300.0)
    problems = invariants.early_handoffs(events, stepped_back, boot_to_wall=boot_to_wall)
    assert len(problems) == 2, problems
    # It ended at 4, but the clock was stepped forward: "ended" says 304. Not early.
    stepped_on = life(0, 4, +300.0)
    assert invariants.early_handoffs(events, stepped_on, boot_to_wall=boot_to_wall) == []
    # A wall clock within STEPPED_CLOCK_S of BOOTTIME's keeps its own reading (NTP slews
    # it by milliseconds, and BOOTTIME's offset is measured at the check): an ended
    # record at 4 on BOOTTIME but 5.5 on its wall clock came after the release (5).
    slewed = life(0, 4, invariants.STEPPED_CLOCK_S - 0.5)
    assert len(invariants.early_handoffs(events, slewed, boot_to_wall=boot_to_wall)) == 1


def test_a_started_driver_of_a_corrupt_artifact_is_counted() -> None:
    lives = _life("bad", 1, "s1", 0, 1) + _life("good", 1, "s1", 0, 1)
    events = [{"job_name": "bad", "kind": "driver_started", "epoch": 1}]
    assert len(invariants.corrupt_starts(["bad"], lives, events)) == 2
    assert invariants.corrupt_starts(["other"], lives, events) == []


def test_a_freeze_excuses_only_the_frozen_time_and_a_bounded_moment_after_the_thaw() -> None:
    """A host frozen with its watchdogs (``freeze``: server, watchdogs and drivers
    SIGSTOPped together) past the lease: another server claims the job meanwhile, and on
    the thaw the old driver may beat once more before its watchdog, whose BOOTTIME
    deadline passed during the freeze, SIGKILLs it. The checker accepts that overlap
    only on the frozen server, only for a driver alive when it froze, and only up to
    FREEZE_THAW_BOUND_S after the thaw; anything longer is a double run."""
    bound = invariants.FREEZE_THAW_BOUND_S
    freeze = invariants.Freeze(server="s1", start=5.0, end=15.0)
    # The old driver (s1) beats 0-5, is frozen 5-15, beats once more 0.4 s after the
    # thaw; the new one (s2) was claimed at 13.5 (lease expired) and beats from 14.
    old = _beats("a", 1, 0, 5, server="s1") + _beats("a", 1, 15.0, 15.0 + 0.4, server="s1")
    new = _beats("a", 2, 14, 20, server="s2")
    assert len(invariants.heartbeat_overlaps(old + new)) == 1  # without the freeze
    assert invariants.heartbeat_overlaps(old + new, freezes=[freeze]) == []
    # Beating on past the bound after the thaw is a double run, freeze or not.
    late = _beats("a", 1, 0, 5, server="s1") + _beats("a", 1, 15.0, 15.0 + bound + 1, server="s1")
    problems = invariants.heartbeat_overlaps(late + new, freezes=[freeze])
    assert len(problems) == 1 and "after the thaw" in problems[0]
    # A freeze of another server excuses nothing.
    other = invariants.Freeze(server="s3", start=5.0, end=15.0)
    assert len(invariants.heartbeat_overlaps(old + new, freezes=[other])) == 1
    # A driver started after the thaw on the frozen server is not excused either.
    after = _beats("a", 3, 15.2, 16, server="s1") + new
    assert len(invariants.heartbeat_overlaps(after, freezes=[freeze])) == 1

    # Lifetime records: the old watchdog's ``ended`` comes after the thaw.
    lives = _life("a", 1, "s1", 0, 15.0 + 0.5, reason="lease_expired") + _life(
        "a", 2, "s2", 14, None
    )
    assert len(invariants.lifetime_overlaps(lives, now=20)) == 1
    assert invariants.lifetime_overlaps(lives, now=20, freezes=[freeze]) == []
    slow = _life("a", 1, "s1", 0, 15.0 + bound + 2, reason="lease_expired") + _life(
        "a", 2, "s2", 14, None
    )
    assert len(invariants.lifetime_overlaps(slow, now=20, freezes=[freeze])) == 1
    assert invariants.double_runs(old + new, lives, freezes=[freeze]) == []

    # Early hand-offs: the claim at 13.5 came while the frozen driver had no ended record.
    events = [
        {**_event(1, "claimed", "s1", 1), "at_s": 0.0},
        {**_event(2, "claimed", "s2", 2), "at_s": 13.5},
    ]
    assert len(invariants.early_handoffs(events, lives)) == 1
    assert invariants.early_handoffs(events, lives, freezes=[freeze]) == []
    assert len(invariants.early_handoffs(events, slow, freezes=[freeze])) == 1
    # A claim before the freeze began is early whatever came after.
    before = [events[0], {**_event(2, "claimed", "s2", 2), "at_s": 4.0}]
    assert len(invariants.early_handoffs(before, lives, freezes=[freeze])) == 1


def test_a_freeze_excuses_a_batch_driver_ended_just_after_the_thaw() -> None:
    """The batch check's "every earlier driver ended before the next one started" sees
    the same host freeze (CHAOS_SEED=380134431: b1 and b2, and b0 twice, reported on the
    old checker, each earlier driver frozen with its server and killed by its watchdog
    0.1-0.3 s after the thaw): excused within FREEZE_THAW_BOUND_S of the thaw only."""
    bound = invariants.FREEZE_THAW_BOUND_S
    kinds = {"b": "batch"}
    freeze = invariants.Freeze(server="s1", start=5.0, end=15.0)
    events = [*_claims((1, 1)), _event(9, "claimed", "s2", 2, "b")]
    thawed = _life("b", 1, "s1", 0, 15.3, reason="lease_expired", exit_code=-9)
    thawed += _life("b", 2, "s2", 14, 20)
    assert len(invariants.batch_generations(kinds, thawed, events)) == 1
    assert invariants.batch_generations(kinds, thawed, events, freezes=[freeze]) == []
    slow = _life("b", 1, "s1", 0, 15 + bound + 1, reason="lease_expired", exit_code=-9)
    slow += _life("b", 2, "s2", 14, 20)
    assert len(invariants.batch_generations(kinds, slow, events, freezes=[freeze])) == 1
    # The next driver started before the freeze: no excuse.
    early = _life("b", 1, "s1", 0, 15.3, reason="lease_expired", exit_code=-9)
    early += _life("b", 2, "s2", 4, 20)
    assert len(invariants.batch_generations(kinds, early, events, freezes=[freeze])) == 1


# b's generation 1 claimed by s1 (epoch 1), then by s2 (epoch 2): a second run, unless
# something kept s1's exit 0 from being recorded; with it recorded, a re-run whatever.
RERUN = [*_claims((1, 1)), _event(9, "claimed", "s2", 2, "b")]
RERUN_RECORDED = [*RERUN[:2], _event(5, "finished", "s1", 1, "b"), RERUN[2]]


def _batch_reports(lifetimes: list[dict], events: list[dict] = RERUN, **excuses: Any) -> int:
    return len(invariants.batch_generations({"b": "batch"}, lifetimes, events, **excuses))


def test_a_host_frozen_as_its_watchdog_records_an_exit_0_may_run_it_again() -> None:
    """CHAOS_SEED=593937537 (freeze of s3): b2's driver exited 0 0.85 s before its host
    froze for 13.3 s; its watchdog, still importing what it records with, was frozen
    before it could write ``finished``; the lease expired, s1 claimed the job and ran the
    generation to its end again. A host lost between a batch driver's exit and its
    record is outside the model (docs/drivers.md): excused only when the exit was never
    recorded and the freeze began within FREEZE_RECORD_BOUND_S of it."""
    bound = invariants.FREEZE_RECORD_BOUND_S
    freeze = invariants.Freeze(server="s1", start=5.0, end=18.0)
    twice = _life("b", 1, "s1", 0, 4.2) + _life("b", 2, "s2", 14, 20)
    assert _batch_reports(twice) == 2
    assert _batch_reports(twice, freezes=[freeze]) == 0
    # The exit 0 was recorded: a claim after it is a re-run whatever froze.
    assert _batch_reports(twice, RERUN_RECORDED, freezes=[freeze]) == 2
    # The host froze long after the exit: its watchdog had all the time it needs.
    late = invariants.Freeze(server="s1", start=4.2 + bound + 0.5, end=18.0)
    assert _batch_reports(twice, freezes=[late]) == 2
    # Another server froze: nothing excuses the first driver's lost record.
    assert _batch_reports(twice, freezes=[dataclasses.replace(freeze, server="s3")]) == 2
    # The next driver started before the freeze: the lease had not lapsed through it.
    before = _life("b", 1, "s1", 0, 4.2) + _life("b", 2, "s2", 4.5, 20)
    assert _batch_reports(before, freezes=[freeze]) >= 1


def test_a_server_cut_off_from_postgresql_as_its_batch_driver_exits_0_may_run_it_again() -> None:
    """CHAOS_SEED=83850194 (pg_partition of s3 for 11.2 s): b1's driver exited 0 0.72 s
    into the cut; neither its watchdog nor its server could record ``finished``; the lease
    lapsed, s1 reaped it and claimed the job 0.3 s before the cut healed, and ran the
    generation again. The outcome was unknowable at that claim (docs/distribution.md):
    excused only when the exit was never recorded, it came within the cut (or
    CUT_RECORD_BOUND_S before it), and the next driver started before the cut healed or
    within the bound after (an owner back on PostgreSQL records at its next poll)."""
    bound = invariants.CUT_RECORD_BOUND_S
    cut = invariants.Cut(server="s1", start=5.0, end=16.0)
    twice = _life("b", 1, "s1", 0, 5.7) + _life("b", 2, "s2", 17.3, 23)
    assert _batch_reports(twice) == 2
    assert _batch_reports(twice, cuts=[cut]) == 0
    # The exit 0 was recorded: a claim after it is a re-run whatever was cut.
    assert _batch_reports(twice, RERUN_RECORDED, cuts=[cut]) == 2
    # The cut healed long before the next driver: the owner had time to record its exit.
    healed = dataclasses.replace(cut, end=17.3 - bound - 0.5)
    # The cut began long after the exit: the watchdog had all the time it needs.
    late = dataclasses.replace(cut, start=5.7 + bound + 0.5)
    # Another server was cut; a cut on the other clock says nothing about these records.
    other, mono = dataclasses.replace(cut, server="s3"), dataclasses.replace(cut, clock="mono")
    for miss in (healed, late, other, mono):
        assert _batch_reports(twice, cuts=[miss]) == 2, miss


# ---------------------------------------------------------------- one fault, one restart


def _timed(i: int, t: float, kind: str, server: str | None, epoch: int | None, **kw) -> dict:
    return {**_event(i, kind, server, epoch, **kw), "at_s": t}


RUNNING_BEFORE = [
    _timed(1, 0.0, "created", None, None),
    _timed(2, 1.0, "claimed", "s1", 1),
    _timed(3, 2.0, "driver_started", "s1", 1),
]
KILL_S1 = invariants.FaultWindow(start=100.0, end=200.0)


def test_a_failover_then_a_move_back_is_two_restarts_for_one_fault() -> None:
    """The double move of issue 24: s1 is killed, the job fails over to s2, s1 returns
    and the job is moved back to it: two restarts for one fault."""
    failover = [
        _timed(4, 105.0, "retargeted", "s2", None, why="orphaned"),
        _timed(5, 110.0, "claimed", "s2", 2),
        _timed(6, 111.0, "driver_started", "s2", 2),
    ]
    move_back = [
        _timed(7, 127.0, "retargeted", "s2", None, why="joined"),
        _timed(8, 128.0, "stopping", "s2", 2),
        _timed(9, 130.0, "released", "s2", 2, state="pending"),
        _timed(10, 131.0, "claimed", "s1", 3),
        _timed(11, 132.0, "driver_started", "s1", 3),
    ]
    assert invariants.restarts_per_fault(RUNNING_BEFORE + failover, [KILL_S1], 3) == []
    problems = invariants.restarts_per_fault(RUNNING_BEFORE + failover + move_back, [KILL_S1], 3)
    assert len(problems) == 1 and "restarted again at epoch 3 by s1 (event 10)" in problems[0]
    # A second fault of its own (s2 killed later) may cost the job its second restart.
    kill_s2 = invariants.FaultWindow(start=120.0, end=220.0)
    assert (
        invariants.restarts_per_fault(RUNNING_BEFORE + failover + move_back, [KILL_S1, kill_s2], 3)
        == []
    )


def _moved(i: int, t: float, old: str | None, new: str | None, why: str, job: str = "a") -> dict:
    return _timed(i, t, "retargeted", "s1", None, job=job, **{"from": old, "to": new, "why": why})


def test_a_drains_move_is_planned_not_a_faults_restart() -> None:
    """s1 is killed and the job fails over to s2 (the fault's restart); then an operator
    drains s2 and the job moves to s3 with a warm hand-off: a planned move, not a second
    restart for the fault, nor a restart outside every fault window (the old checker
    reported both: a drain's move was ``orphaned``, like a lost server's)."""
    failover = [
        _moved(4, 105.0, "s1", "s2", "orphaned"),
        _timed(5, 110.0, "claimed", "s2", 2),
        _timed(6, 111.0, "driver_started", "s2", 2),
    ]
    drain = [
        _moved(7, 150.0, "s2", "s3", "drained"),
        _timed(8, 150.5, "stopping", "s2", 2, warm=True),
        _timed(9, 158.0, "released", "s2", 2, state="pending"),
        _timed(10, 158.5, "claimed", "s3", 3, warm=True),
        _timed(11, 158.6, "driver_started", "s3", 3),
    ]
    history = RUNNING_BEFORE + failover + drain
    assert invariants.restarts_per_fault(history, [KILL_S1], 3) == []
    # The same drain long after the fault: outside every window, still no restart.
    late = [{**e, "at_s": e["at_s"] + 200.0} for e in drain]
    assert invariants.restarts_per_fault(RUNNING_BEFORE + failover + late, [KILL_S1], 3) == []
    # A move of a lost server's job after the failover is a second restart, as before.
    lost = [_moved(7, 150.0, "s2", "s3", "orphaned"), *drain[1:]]
    problems = invariants.restarts_per_fault(RUNNING_BEFORE + failover + lost, [KILL_S1], 3)
    assert len(problems) == 1 and "(event 10)" in problems[0]


DRAIN_S3 = invariants.Drain("s3", start=0.0, undone=None)


def test_a_job_a_drain_leaves_waiting_for_room_is_a_planned_move() -> None:
    """CHAOS_SEED=24132: s2 was drained while s3, just killed, was starting again; s1
    alone had no room, so the drain stopped s2's jobs with no target (``waiting``) and
    s1 claimed them when room came. The event says ``waiting``, not ``drained``: the
    drain's time (``invariants.Drain``) tells it from a fault's move."""
    history = [
        *RUNNING_BEFORE,
        _moved(4, 21.0, "s1", None, "waiting"),
        _timed(5, 22.0, "stopping", "s1", 1),
        _timed(6, 24.0, "released", "s1", 1, state="pending"),
        _moved(7, 40.0, None, "s3", "placed"),
        _timed(8, 41.0, "claimed", "s3", 2),
        _timed(9, 42.0, "driver_started", "s3", 2),
    ]
    drain = invariants.Drain("s1", start=20.0, undone=30.0)
    assert invariants.restarts_per_fault(history, [], 3, drains=[drain]) == []
    assert invariants.restarts_per_fault(history, [], 3, drains=[drain, DRAIN_S3]) == []
    # The same move before the drain was asked, or after its undo, or off another server.
    for other in (
        invariants.Drain("s1", start=21.5, undone=30.0),
        invariants.Drain("s1", start=10.0, undone=20.5),
        DRAIN_S3,
    ):
        assert len(invariants.restarts_per_fault(history, [], 3, drains=[other])) == 1


def test_the_join_of_an_undrained_server_is_planned_until_it_is_lost() -> None:
    """An undone drain makes the server a joiner again (docs/distribution.md): the
    streaming jobs its join moves to it are the operator's moves. Once it is lost after
    the undo, a move to it is a move back to a returning server: counted again."""
    drain = invariants.Drain("s1", start=20.0, undone=40.0)
    drained = [
        _moved(4, 21.0, "s1", "s2", "drained"),
        _timed(5, 25.0, "claimed", "s2", 2),
        _timed(6, 26.0, "driver_started", "s2", 2),
    ]
    joined = [
        _moved(7, 60.0, "s2", "s1", "joined"),
        _timed(8, 65.0, "claimed", "s1", 3),
        _timed(9, 66.0, "driver_started", "s1", 3),
    ]
    history = RUNNING_BEFORE + drained + joined
    assert invariants.restarts_per_fault(history, [], 3, drains=[drain]) == []
    # Without the undo the join is a move no fault window holds.
    assert len(invariants.restarts_per_fault(history, [], 3)) == 1
    # A join to a server whose drain was never undone, or undone after the move: no
    # operator made that join.
    for undone in (None, 61.0):
        other = invariants.Drain("s1", start=20.0, undone=undone)
        assert len(invariants.restarts_per_fault(history, [], 3, drains=[other])) == 1
    # s1 is killed after the undo (another job of its fails over), returns, and the job
    # is moved to it: the returning server took a job, counted against the fault.
    kill = invariants.FaultWindow(start=50.0, end=150.0)
    lost = _moved(10, 52.0, "s1", "s3", "orphaned", job="b")
    problems = invariants.restarts_per_fault([*history, lost], [], 3, drains=[drain])
    assert len(problems) == 1 and "(event 8)" in problems[0]
    assert invariants.restarts_per_fault([*history, lost], [kill], 3, drains=[drain]) == []


def test_a_failover_then_a_move_back_is_two_restarts_even_after_a_drain() -> None:
    """The double move of issue 24 with drains in the run: s1 was drained and undone
    before it was killed; the job fails over to s2 and moves back to the returning s1.
    The earlier undo does not excuse the move back: two restarts for one fault."""
    drain = invariants.Drain("s1", start=20.0, undone=40.0)
    history = [
        *RUNNING_BEFORE,
        _moved(4, 105.0, "s1", "s2", "orphaned"),
        _timed(5, 110.0, "claimed", "s2", 2),
        _timed(6, 111.0, "driver_started", "s2", 2),
        _moved(7, 127.0, "s2", "s1", "joined"),
        _timed(8, 131.0, "claimed", "s1", 3),
        _timed(9, 132.0, "driver_started", "s1", 3),
    ]
    problems = invariants.restarts_per_fault(history, [KILL_S1], 3, drains=[drain])
    assert len(problems) == 1 and "restarted again at epoch 3 by s1 (event 8)" in problems[0]


def test_restarts_the_job_or_an_operator_caused_are_not_charged_to_the_fault() -> None:
    after = [
        _timed(4, 110.0, "claimed", "s2", 2),  # the fault's restart
        _timed(5, 111.0, "driver_started", "s2", 2),
        _timed(6, 115.0, "crashed", "s2", 2, error="driver exited with exit code 1: boom"),
        _timed(7, 117.0, "claimed", "s2", 3),  # its own crash: the budget's business
        _timed(8, 118.0, "driver_started", "s2", 3),
        _timed(9, 120.0, "restart_requested", None, None, generation=2),
        _timed(10, 121.0, "claimed", "s2", 4),  # an operator's restart
        _timed(11, 122.0, "driver_started", "s2", 4),
        _timed(12, 125.0, "claimed", "s3", 5),  # a second restart for the same fault
    ]
    problems = invariants.restarts_per_fault(RUNNING_BEFORE + after, [KILL_S1], 3)
    assert len(problems) == 1 and "(event 12)" in problems[0]
    assert invariants.restarts_per_fault(RUNNING_BEFORE + after[:-1], [KILL_S1], 3) == []


def test_a_start_retried_after_a_deferral_is_the_same_restart() -> None:
    """S3 away: the claim's start is deferred and retried; only one driver starts."""
    after = [
        _timed(4, 110.0, "claimed", "s2", 2),
        _timed(5, 113.0, "deferred", "s2", 2, error="S3 unreachable"),
        _timed(6, 115.0, "claimed", "s2", 3),
        _timed(7, 116.0, "deferred", "s2", 3, error="S3 unreachable"),
        _timed(8, 119.0, "claimed", "s2", 4),
        _timed(9, 120.0, "driver_started", "s2", 4),
    ]
    assert invariants.restarts_per_fault(RUNNING_BEFORE + after, [KILL_S1], 3) == []
    # A claim whose driver never started (its commit answer lost) is no restart either.
    lost = [_timed(4, 110.0, "claimed", "s2", 2), _timed(5, 130.0, "claimed", "s2", 3)]
    assert invariants.restarts_per_fault(RUNNING_BEFORE + lost, [KILL_S1], 3) == []


def test_a_restart_outside_every_fault_window_is_reported() -> None:
    late = [_timed(4, 300.0, "claimed", "s2", 2)]
    assert len(invariants.restarts_per_fault(RUNNING_BEFORE + late, [KILL_S1], 3)) == 1
    # Claims before the fault (``since_id``) are not the fault's.
    assert invariants.restarts_per_fault(RUNNING_BEFORE + late, [KILL_S1], 4) == []


def test_matching_restarts_to_faults_finds_an_assignment_when_one_exists() -> None:
    """Two faults whose windows overlap, two restarts: the first restart must take the
    window that ends first, or the second would find none."""
    a = invariants.FaultWindow(start=100.0, end=150.0)
    b = invariants.FaultWindow(start=90.0, end=300.0)
    after = [
        _timed(4, 110.0, "claimed", "s2", 2),
        _timed(5, 111.0, "driver_started", "s2", 2),
        _timed(6, 200.0, "claimed", "s3", 3),
        _timed(7, 201.0, "driver_started", "s3", 3),
    ]
    assert invariants.restarts_per_fault(RUNNING_BEFORE + after, [b, a], 3) == []
    assert len(invariants.restarts_per_fault(RUNNING_BEFORE + after, [a], 3)) == 1


# ---------------------------------------------------------------- Spark master faults (S9)

PAIR = frozenset({"127.0.0.1:7001", "127.0.0.1:7002"})
ALONE = frozenset({"127.0.0.1:7003"})
# Job ``a`` runs on a pair of masters, ``solo`` on one. The active master of the pair
# killed at 100 s (never started again: its standby took over), the only master of
# ``solo`` down from 100 s to 220 s.
ACTIVE_KILLED = invariants.MasterOutage(frozenset({"127.0.0.1:7001"}), 100.0, 1000.0)
ONLY_DOWN = invariants.MasterOutage(ALONE, 100.0, 220.0)
MASTERS = {"a": PAIR, "solo": ALONE}


def test_job_masters_reads_each_host_port_of_a_spark_url() -> None:
    urls = {"a": "spark://127.0.0.1:7001,127.0.0.1:7002", "solo": "spark://127.0.0.1:7003",
            "local": "local[2]", "default": None}  # fmt: skip
    assert invariants.job_masters(urls) == MASTERS


def test_a_crash_or_failure_while_its_master_is_down_spent_the_budget() -> None:
    crash = _timed(4, 150.0, "crashed", "s1", 1, error="driver exited with exit code 1: no master")
    problems = invariants.master_fault_costs([*RUNNING_BEFORE, crash], [ACTIVE_KILLED], MASTERS)
    assert len(problems) == 1 and "a: crashed at epoch 1 (event 4" in problems[0]
    failed = {**_timed(4, 230.0, "failed", "s1", 1, error="x"), "job_name": "solo"}
    assert len(invariants.master_fault_costs([failed], [ONLY_DOWN], MASTERS, bound=30)) == 1
    # Legal: a deferral; a crash before the fault, after the bound, of a job on another
    # master, or inside another fault's window (that fault may be its cause).
    deferred = _timed(4, 150.0, "deferred", "s1", 1, error="cause=spark-master-unreachable")
    assert (
        invariants.master_fault_costs([*RUNNING_BEFORE, deferred], [ACTIVE_KILLED], MASTERS) == []
    )
    early = _timed(4, 99.0, "crashed", "s1", 1, error="boom")
    assert invariants.master_fault_costs([early], [ACTIVE_KILLED], MASTERS) == []
    assert invariants.master_fault_costs([failed], [ONLY_DOWN], MASTERS, bound=5) == []
    assert invariants.master_fault_costs([crash], [ONLY_DOWN], MASTERS) == []
    kill = invariants.FaultWindow(140.0, 160.0)
    assert invariants.master_fault_costs([crash], [ACTIVE_KILLED], MASTERS, [kill]) == []


def test_a_stream_running_when_its_master_fails_over_keeps_its_driver() -> None:
    replaced = [
        _timed(4, 130.0, "stopping", "s1", 1),
        _timed(5, 131.0, "released", "s1", 1, state="pending"),
        _timed(6, 132.0, "claimed", "s2", 2),
        _timed(7, 133.0, "driver_started", "s2", 2),
    ]
    problems = invariants.master_fault_restarts(
        RUNNING_BEFORE + replaced, [ACTIVE_KILLED], MASTERS, since_id=3
    )
    assert len(problems) == 1 and "replaced at epoch 2 by s2 (event 6)" in problems[0]
    # The only master down: the same.
    solo = [{**e, "job_name": "solo"} for e in RUNNING_BEFORE + replaced]
    assert len(invariants.master_fault_restarts(solo, [ONLY_DOWN], MASTERS, since_id=3)) == 1
    # Legal: the stream untouched; a restart the operator asked for; one another fault
    # (a server killed) caused; one of a job on another master.
    assert invariants.master_fault_restarts(RUNNING_BEFORE, [ACTIVE_KILLED], MASTERS) == []
    asked = [_timed(4, 129.0, "restart_requested", None, None, generation=2), *replaced]
    assert invariants.master_fault_restarts(RUNNING_BEFORE + asked, [ACTIVE_KILLED], MASTERS) == []
    kill = invariants.FaultWindow(120.0, 210.0)
    assert (
        invariants.master_fault_restarts(
            RUNNING_BEFORE + replaced, [ACTIVE_KILLED], MASTERS, [kill]
        )
        == []
    )
    assert invariants.master_fault_restarts(RUNNING_BEFORE + replaced, [ONLY_DOWN], MASTERS) == []


def test_a_job_due_while_its_only_master_is_down_starts_only_once_it_is_back() -> None:
    def due(claimed: float, started: float) -> list[dict]:
        return [
            {**e, "job_name": "solo"}
            for e in [
                _timed(1, 99.0, "start_requested", None, None, generation=1),
                _timed(2, 99.5, "claimed", "s1", 1),
                _timed(3, 111.5, "deferred", "s1", 1, error="cause=spark-master-unreachable"),
                _timed(4, claimed, "claimed", "s1", 2),
                _timed(5, started, "driver_started", "s1", 2),
            ]
        ]

    # Claimed and started while the master was down: its probe found none.
    problems = invariants.started_without_master(due(140.0, 150.0), [ONLY_DOWN], MASTERS)
    assert len(problems) == 1 and "solo: driver started at epoch 2 by s1 (event 5)" in problems[0]
    # Started after the master was spawned again, or claimed before it was killed (the
    # probe may have found it up): legal, however slow the start.
    assert invariants.started_without_master(due(200.0, 225.0), [ONLY_DOWN], MASTERS) == []
    assert invariants.started_without_master(due(100.5, 130.0), [ONLY_DOWN], MASTERS) == []
    # With a standby up, a job of the pair may start at any time.
    pair = [{**e, "job_name": "a"} for e in due(140.0, 150.0)]
    assert invariants.started_without_master(pair, [ACTIVE_KILLED], MASTERS) == []
    both = invariants.MasterOutage(PAIR, 100.0, 200.0)
    assert len(invariants.started_without_master(pair, [both], MASTERS)) == 1


# --- S6: each fire once (schedules) -------------------------------------------------------

FIRES = (100.0, 105.0, 110.0, 115.0)


def _run(run_id: int, at: float, start: float | None, end: float | None, **kw: object) -> dict:
    return {
        "run_id": run_id,
        "scheduled_time": at,
        "trigger": "schedule",
        "state": kw.pop("state", "finished"),
        "reason": kw.pop("reason", None),
        "created_at": at,
        "started_at": start,
        "ended_at": end,
        **kw,
    }


def _clean() -> list[dict]:
    return [_run(i, at, at + 0.5, at + 3.0) for i, at in enumerate(FIRES, 1)]


def _check(runs: list[dict], **window: object) -> list[str]:
    return invariants.fire_problems(
        invariants.ScheduleWindow("tick", FIRES, **window),  # type: ignore[arg-type]
        runs,
        lateness_bound=2.0,
    )


def test_every_fire_ran_once_is_clean() -> None:
    assert _check(_clean()) == []


def test_a_missed_fire_is_caught() -> None:
    runs = [r for r in _clean() if r["scheduled_time"] != 110.0]
    (problem,) = _check(runs)
    assert "was missed" in problem and "1970-01-01T00:01:50Z" in problem


def test_a_doubled_fire_is_caught() -> None:
    runs = [*_clean(), _run(9, 105.0, 106.0, 106.5)]
    problems = _check(runs)
    assert any("ran 2 times (runs 2 (schedule), 9 (schedule))" in p for p in problems), problems


def test_overlapping_runs_under_forbid_are_caught_not_under_replace() -> None:
    runs = _clean()
    runs[1]["ended_at"] = 111.0  # still running when the next fire's run started
    (problem,) = _check(runs)
    assert "runs 2 and 3 overlap under forbid" in problem
    assert _check(runs, concurrency="replace") == []


def test_a_late_fire_is_caught_unless_excused() -> None:
    runs = _clean()
    runs[2]["started_at"] = 125.0
    runs[2]["ended_at"] = 126.0
    (problem,) = _check(runs)
    assert "started 15.0 s late" in problem
    assert _check(runs, excused=((108.0, 130.0),)) == []
    runs[2]["started_at"] = runs[2]["ended_at"] = None  # never started, checked at 140
    (problem,) = invariants.fire_problems(
        invariants.ScheduleWindow("tick", FIRES), runs, lateness_bound=2.0, now=140.0
    )
    assert "started 30.0 s late" in problem


def test_skips_need_an_allowed_reason_that_held() -> None:
    runs = _clean()
    runs[2] = _run(3, 110.0, None, None, state="skipped", reason="previous run still running")
    (problem,) = _check(runs)
    assert "skipped while no run was running" in problem
    runs[1]["ended_at"] = 112.0  # the previous run was running at 110: a legal skip
    assert _check(runs) == []
    runs[2]["reason"] = "misfire"
    assert "misfire on a healthy cluster" in _check(runs)[0]
    assert _check(runs, excused=((100.0, 120.0),)) == []
    runs[2]["reason"] = "because"
    assert "skipped for 'because'" in _check(runs)[0]


def test_a_run_at_a_time_the_schedule_does_not_have_is_an_extra_fire() -> None:
    runs = [*_clean(), _run(9, 107.0, 107.5, 108.0)]
    (problem,) = _check(runs, concurrency="replace")
    assert "fired at 1970-01-01T00:01:47Z, not a fire time" in problem


def test_a_dst_gap_row_at_its_instant_of_the_jump_is_no_extra_fire() -> None:
    """A DST gap's skipped row has an instant (just before the zone's jump), which no
    fire time of the schedule is: it is no extra fire. Any other row there is."""
    gap = "dst-gap: 2026-03-29 02:30:00 does not exist in Europe/Berlin"
    runs = [*_clean(), _run(9, 107.9982, None, None, state="skipped", reason=gap)]
    assert _check(runs) == []
    runs[-1]["reason"] = "misfire"
    (problem,) = _check(runs, excused=((100.0, 120.0),))
    assert "not a fire time" in problem


# A schedule changed at 112 from @every 5s (switched on at 100) to @every 3s, checked to 130.
CHANGED = (
    invariants.Piece("@every 5s", "UTC", 100.0),
    invariants.Piece("@every 3s", "UTC", 112.0),
)
CHANGED_FIRES = invariants.piece_fire_times(CHANGED, 130.0)


def _changed(runs: list[dict], **window: object) -> list[str]:
    return invariants.fire_problems(
        invariants.ScheduleWindow(
            "tick",
            CHANGED_FIRES,
            changes=(112.0,),
            **window,  # type: ignore[arg-type]
        ),
        runs,
        lateness_bound=2.0,
    )


def _changed_clean() -> list[dict]:
    return [_run(i, at, at + 0.5, at + 1.0) for i, at in enumerate(CHANGED_FIRES, 1)]


def test_a_changed_schedule_expects_each_piece_in_its_span() -> None:
    """The old schedule's fire times up to the change, the new one's after it: none of
    the old one's after the change, none of the new one's before."""
    assert CHANGED_FIRES == (105.0, 110.0, 114.0, 117.0, 120.0, 123.0, 126.0, 129.0)
    assert _changed(_changed_clean()) == []


def test_a_fire_of_the_old_schedule_after_the_change_is_an_extra_fire() -> None:
    runs = [*_changed_clean(), _run(20, 115.0, 115.2, 115.4)]
    (problem,) = _changed(runs, concurrency="replace")
    assert "run 20 fired at 1970-01-01T00:01:55Z, not a fire time" in problem


def test_a_missed_fire_of_the_new_schedule_is_caught() -> None:
    runs = [r for r in _changed_clean() if r["scheduled_time"] != 117.0]
    (problem,) = _changed(runs)
    assert "the fire at 1970-01-01T00:01:57Z was missed" in problem


def test_an_old_fire_time_due_at_the_change_is_handled_by_it() -> None:
    """A change 0.4 s after a fire time the loop had not handled yet handles it in its
    transaction (docs/schedules.md): its run is the old piece's, a little late."""
    pieces = (CHANGED[0], invariants.Piece("@every 3s", "UTC", 110.4))
    fires = invariants.piece_fire_times(pieces, 130.0)
    assert fires[:3] == (105.0, 110.0, 111.0)
    runs = [_run(i, at, at + 0.5, at + 0.9) for i, at in enumerate(fires, 1)]
    runs[1].update(created_at=110.4, started_at=110.9, ended_at=110.95)
    window = invariants.ScheduleWindow("tick", fires, changes=(110.4,))
    assert invariants.fire_problems(window, runs, lateness_bound=2.0) == []


def _utc(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


def test_the_windows_of_a_zoned_schedule_are_its_zone_s() -> None:
    """S6's windows take a schedule's fire times from scheduler/schedule.py in its zone:
    Berlin's ``0 * * * *`` has 23 on the spring-forward day and 24 (not 25) on the
    fall-back day; the randomized mode's cron on even local minutes of Chatham (+13:45)
    fires on odd UTC minutes, and a change of zone alone moves its pieces' times."""
    spring = invariants.Piece("0 * * * *", "Europe/Berlin", _utc("2026-03-28T23:00:00"))
    assert len(invariants.piece_fire_times((spring,), _utc("2026-03-29T22:00:00"))) == 23
    autumn = invariants.Piece("0 * * * *", "Europe/Berlin", _utc("2026-10-24T22:00:00"))
    assert len(invariants.piece_fire_times((autumn,), _utc("2026-10-25T23:00:00"))) == 24
    start = _utc("2026-11-28T12:00:00")
    chatham = invariants.Piece("*/10 */2 * * * *", "Pacific/Chatham", start)
    new_york = invariants.Piece("*/10 */2 * * * *", "America/New_York", start + 600)
    times = invariants.piece_fire_times((chatham, new_york), start + 1200)
    minutes = [int(t // 60) % 2 for t in times]
    assert len(times) == 60 and minutes == [1] * 30 + [0] * 30, times


# Switched off at 107 (its fires handled up to 105.3), changed at 112 while off, switched
# on again at 121: 110 (old) and 114, 117 (new) are misfires; 120, the latest of the new
# schedule's, runs late at the switch-on.
OFF = invariants.OffPeriod(stopped=107.0, after=105.3, until=121.0)


def _off_period_runs() -> list[dict]:
    runs = _changed_clean()
    for r in runs:
        if r["scheduled_time"] in (110.0, 114.0, 117.0):
            r.update(state="skipped", reason="misfire", started_at=None, ended_at=None)
            r["created_at"] = 112.0 if r["scheduled_time"] == 110.0 else 121.2
        if r["scheduled_time"] == 120.0:
            r.update(created_at=121.2, started_at=121.6, ended_at=122.0)
    return runs


def test_a_schedule_off_records_its_fire_times_and_runs_only_the_latest_at_the_start() -> None:
    runs = _off_period_runs()
    assert _changed(runs, off=(OFF,)) == []
    # Without the stop, those misfires came on a healthy cluster.
    problems = _changed(runs)
    assert len(problems) == 3, problems
    assert all("misfire on a healthy cluster" in p for p in problems), problems
    # Late: 120 ran 1.6 s after its time, past a bound of 1 s, excused while off.
    window = invariants.ScheduleWindow("tick", CHANGED_FIRES, changes=(112.0,), off=(OFF,))
    assert invariants.fire_problems(window, runs, lateness_bound=1.0) == []


def test_a_fire_time_of_the_off_period_that_ran_is_caught() -> None:
    for ran in (110.0, 117.0):  # the old schedule's, closed by the change; not the latest
        runs = _off_period_runs()
        (row,) = [r for r in runs if r["scheduled_time"] == ran]
        row.update(state="finished", reason=None, started_at=ran + 11.5, ended_at=ran + 11.6)
        problems = _changed(runs, off=(OFF,))
        assert any(
            f"{invariants._iso_seconds(ran)} ran (run {row['run_id']}) while its schedule was off"
            in p
            for p in problems
        ), problems


# A backfill at 131 (the schedule had handled its fires up to 130) of [104, 122]: 110
# was skipped (a misfire in an outage), so it is queued again; 105 and 114 ran and are
# left out; 107 and 113 are the current schedule's (@every 3s) times in the old piece's
# span: never fire times then, so they have no row and are queued.
BACKFILL = invariants.Backfill(
    at=131.0,
    checked=130.0,
    queued=(107.0, 110.0, 113.0),
    before=((105.0, "finished"), (110.0, "skipped"), (114.0, "finished")),
)


def _backfilled_runs() -> list[dict]:
    runs = _changed_clean()
    (row,) = [r for r in runs if r["scheduled_time"] == 110.0]
    row.update(trigger="backfill", reason=f"{invariants.BACKFILLED_AFTER_SKIP}misfire")
    row.update(started_at=132.0, ended_at=132.5)
    extra = [_run(30, 107.0, 133.0, 133.5), _run(31, 113.0, 134.0, 134.5)]
    return runs + [{**r, "trigger": "backfill", "created_at": 131.0} for r in extra]


def _backfill_check(runs: list[dict], *backfills: invariants.Backfill, **window: object):
    return _changed(runs, backfills=backfills or (BACKFILL,), excused=((108.0, 111.0),), **window)


def test_backfilled_fire_times_each_run_once() -> None:
    assert _backfill_check(_backfilled_runs()) == []


def test_a_backfilled_time_that_ran_twice_is_caught() -> None:
    runs = [*_backfilled_runs(), _run(40, 110.0, 110.5, 111.0)]  # the schedule's run too
    problems = _backfill_check(runs)
    assert any("1970-01-01T00:01:50Z ran 2 times (runs 2 (backfill), 40 (schedule))" in p
               for p in problems), problems  # fmt: skip


def test_a_backfill_of_a_time_that_had_already_run_is_caught() -> None:
    wrong = invariants.Backfill(131.0, 130.0, (105.0, 107.0, 110.0, 113.0), BACKFILL.before)
    runs = _backfilled_runs()
    (row,) = [r for r in runs if r["scheduled_time"] == 105.0]
    row["trigger"] = "backfill"  # the row was queued and ran once more
    (problem,) = _backfill_check(runs, wrong)
    assert (
        "queued the fire at 1970-01-01T00:01:45Z, which had already run (its row was finished)"
        in problem
    )


def test_a_backfill_does_not_excuse_a_fire_the_schedule_missed() -> None:
    """120 had no row at the backfill though the schedule had handled its fires up to
    130: it was missed, and running it as a backfill hides nothing."""
    missed = invariants.Backfill(131.0, 130.0, (*BACKFILL.queued, 120.0), BACKFILL.before)
    runs = _backfilled_runs()
    (row,) = [r for r in runs if r["scheduled_time"] == 120.0]
    row.update(trigger="backfill", started_at=135.0, ended_at=135.5)
    (problem,) = _backfill_check(runs, missed)
    assert "the fire at 1970-01-01T00:02:00Z was missed: it had no row when the backfill" in problem
    # A backfill while the schedule is off, of its off period: not handled yet, so legal.
    while_off = invariants.Backfill(131.0, 119.0, missed.queued, BACKFILL.before)
    assert _backfill_check(runs, while_off) == []


def test_backfilled_runs_nobody_queued_or_lost_are_caught() -> None:
    runs = [r for r in _backfilled_runs() if r["scheduled_time"] != 113.0]
    runs.append({**_run(50, 108.0, 136.0, 136.5), "trigger": "backfill"})
    problems = _backfill_check(runs)
    assert any("run 50 was backfilled at 1970-01-01T00:01:48Z, which no backfill" in p
               for p in problems), problems  # fmt: skip
    assert any("1970-01-01T00:01:53Z queued by the backfill at" in p and "has no row" in p
               for p in problems), problems  # fmt: skip
    assert len(problems) == 2, problems


def test_a_queued_backfill_is_dropped_only_by_a_stop_after_it() -> None:
    runs = _backfilled_runs()
    (row,) = [r for r in runs if r["scheduled_time"] == 113.0]
    row.update(state="skipped", reason=invariants.STOPPED_BEFORE_ITS_TURN)
    row.update(started_at=None, ended_at=None)
    (problem,) = _backfill_check(runs)
    assert "backfilled run 31 at 1970-01-01T00:01:53Z was skipped" in problem
    assert "with no stop after it was queued" in problem
    stop = invariants.OffPeriod(stopped=131.5, after=130.0)
    assert _backfill_check(runs, off=(stop,)) == []


def _at(events: list[dict], *seconds: float) -> list[dict]:
    """``events`` with PostgreSQL times ``at_s`` (one each, in order)."""
    return [{**e, "at_s": t} for e, t in zip(events, seconds, strict=True)]


def test_spent_in_one_window_counts_only_spends_inside_one_window() -> None:
    assert invariants.spent_in_one_window([0, 5], 2, window=10)
    assert not invariants.spent_in_one_window([0, 15], 2, window=10)
    assert not invariants.spent_in_one_window([0, 10], 2, window=10)  # strictly after
    assert invariants.spent_in_one_window([0, 15, 30, 33], 2, window=10)
    assert invariants.spent_in_one_window([0, 1000], 2, window=0)  # no window: all count
    assert not invariants.spent_in_one_window([float("-inf"), 5], 2, window=10)


def test_a_stream_failed_with_its_crashes_spread_wider_than_its_window_was_lost() -> None:
    """The restart window (issue 26): a streaming job with max_restarts 1 and a 60 s
    window whose two driver failures were 100 s apart should have restarted; FAILED, it
    was lost (the product counting every crash since the start would do this). The same
    failures 30 s apart spend its budget: FAILED legitimately."""
    exited = "driver exited with exit code 3: boom"
    job = {**_failed_job("w", max_restarts=1), "kind": "streaming", "restart_window_s": 60.0}
    started = [_event(0, "start_requested", None, None, "w", generation=1)]
    crashes = _crashes("w", 1, 1, exited) + _crashes("w", 2, 1, exited, "failed")
    spread = started + _at(crashes, 1000.0, 1100.0)
    problems = _lost([job], spread)
    assert len(problems) == 1 and "failed without" in problems[0], problems
    close = started + _at(crashes, 1000.0, 1030.0)
    assert _lost([job], close) == []
    # Without a window (0), or for a batch job, every failure since the start counts.
    assert _lost([{**job, "restart_window_s": 0.0}], spread) == []
    assert _lost([{**job, "kind": "batch"}], spread) == []


def test_a_stream_run_again_after_its_window_filled_overran_its_budget() -> None:
    """A streaming job with max_restarts 1 and a 60 s window: two failures 30 s apart
    spend it, so a third driver is an overrun; two failures 100 s apart do not, and a
    third driver is legal."""
    one = [{"name": "w", "kind": "streaming", "max_restarts": 1, "restart_window_s": 60.0}]
    claims = [_event(0, "start_requested", None, None, "w", generation=1)] + [
        _event(i, "claimed", "s1", i, "w") for i in (1, 2, 3)
    ]
    lives = [
        *_life("w", 1, "s1", 0, 5, exit_code=3),
        *_life("w", 2, "s1", 10, 15, exit_code=3),
        *_life("w", 3, "s1", 20, None),
    ]
    exited = "driver exited with exit code 3"
    recorded = [_event(11, "crashed", "s1", 1, "w", error=exited),
                _event(12, "crashed", "s1", 2, "w", error=exited)]  # fmt: skip
    close = claims + _at(recorded, 1000.0, 1030.0)
    problems = invariants.budget_overruns(one, lives, close)
    assert len(problems) == 1 and "run past its budget" in problems[0], problems
    spread = claims + _at(recorded, 1000.0, 1100.0)
    assert invariants.budget_overruns(one, lives, spread) == []
    # A failure nobody recorded (H5) is placed before any window: never a false report.
    assert invariants.budget_overruns(one, lives, claims) == []


# ---------------------------------------------------------------- alerts


def _ev(i: int, kind: str, job: str = "j", **detail: object) -> dict:
    return {"id": i, "kind": kind, "job_name": job, "detail": detail}


def _dl(i: int | None, kind: str, did: str = "", alert: str = "chaos", **row: object) -> dict:
    return {
        "id": did or f"d{i}",
        "alert_name": alert,
        "event_id": i,
        "kind": kind,
        "job_name": "j",
        "status": row.get("status", "delivered"),
        "attempts": row.get("attempts", 1),
        "last_error": row.get("last_error"),
    }


def test_unraised_alerts_holds_when_each_event_raised_its_kind_once() -> None:
    events = [
        _ev(1, "created"),
        _ev(2, "crashed"),
        _ev(3, "claimed"),
        _ev(4, "claimed", taken_over_from="s2"),
        _ev(5, "health_flagged", flag="stalled"),
        _ev(6, "failed"),
    ]
    deliveries = [_dl(2, "restarted"), _dl(4, "failed_over"), _dl(5, "stalled"), _dl(6, "failed")]
    assert invariants.unraised_alerts(events, deliveries, "chaos") == []


def test_unraised_alerts_sees_a_missing_a_wrong_and_a_doubled_delivery() -> None:
    events = [_ev(2, "crashed"), _ev(3, "reaped"), _ev(4, "failed"), _ev(5, "finished")]
    deliveries = [
        _dl(3, "failed"),  # wrong kind
        _dl(4, "failed", did="a"),
        _dl(4, "failed", did="b"),  # twice
        _dl(5, "failed"),  # an event that raises nothing
    ]
    problems = invariants.unraised_alerts(events, deliveries, "chaos")
    assert len(problems) == 4, problems
    assert "event 2 (crashed of j) raised nothing, not one restarted" in problems[0]
    assert "raised ['failed'], not one failed_over" in problems[1]
    assert "raised ['failed', 'failed'], not one failed" in problems[2]
    assert "event 5 (finished) raised ['failed']" in problems[3]


def test_unraised_alerts_reads_only_events_after_the_mark_and_its_own_alert() -> None:
    events = [_ev(1, "failed"), _ev(2, "failed")]
    assert invariants.unraised_alerts(events, [_dl(2, "failed")], "chaos", since_id=1) == []
    assert invariants.unraised_alerts(events, [_dl(2, "failed", alert="other")], "chaos", 1)


def test_undelivered_alerts_sees_lost_unrecorded_and_made_up_deliveries() -> None:
    deliveries = [
        _dl(1, "failed", did="ok"),
        _dl(2, "failed", did="lost", status="pending", attempts=4, last_error="timed out"),
        _dl(3, "failed", did="unrecorded", status="pending"),
    ]
    assert invariants.undelivered_alerts(deliveries[:1], ["ok"]) == []
    pruned = [_dl(4, "failed", did="gone", status=invariants.PRUNED)]
    assert invariants.undelivered_alerts(pruned, ["gone"]) == []
    assert invariants.undelivered_alerts(pruned, []) == [
        "delivery gone (failed of j) never reached the receiver: pruned after 1 attempts (None)"
    ]
    problems = invariants.undelivered_alerts(deliveries, ["ok", "unrecorded", "ghost"])
    assert problems == [
        "delivery lost (failed of j) never reached the receiver: pending after 4 attempts "
        "(timed out)",
        "delivery unrecorded (failed of j) reached the receiver but is recorded pending",
        "the receiver accepted ghost, which no delivery has",
    ]


def test_a_stall_past_the_budget_is_a_legitimate_failed() -> None:
    """A stall past the restart budget ends the job FAILED (server/health.py: event
    ``failed`` with cause ``stalled``): with max_restarts 1, one restart on a stall and
    the failing stall make it FAILED legitimately; the failing stall alone does not."""
    stream = _failed_job("s", max_restarts=1)
    stalled = "stalled past its restart budget: no batch for 7.0 s (1 of 1 restarts)"
    events = [
        _event(0, "start_requested", None, None, "s", generation=1),
        _event(1, "claimed", "s1", 1, "s"),
        _event(2, "restart_requested", "s1", 1, "s", generation=2, restarts=1, by="stalled"),
        _event(3, "claimed", "s1", 2, "s"),
        _event(4, "failed", "s1", 2, "s", error=stalled, cause="stalled"),
    ]
    assert _lost([stream], events) == []
    assert len(_lost([stream], [events[0], events[1], events[4]])) == 1


def _watched(i: int, revision: int, job: str = "r", **extra: object) -> dict:
    until = "2026-11-26T10:00:00Z"
    return _event(i, "revised", None, None, job, revision=revision, watched_until=until, **extra)


def _rolled(i: int, revision: int, to: int, as_revision: int, job: str = "r") -> list[dict]:
    by = "auto-rollback"
    made = {"revision": as_revision, "rollback_of": to, "by": by}
    verdict = {"cause": "crashed", "revision": revision, "to": to, "as_revision": as_revision}
    return [
        _event(i, "revised", None, None, job, **made),
        _event(i + 1, "rolled_back", "s1", None, job, reason="crashed", by=by, **verdict),
    ]


def test_every_watched_update_is_rolled_back_once_or_superseded() -> None:
    fine = [
        _watched(1, 2),
        *_rolled(2, revision=2, to=1, as_revision=3),
        _watched(4, 4),
        _watched(5, 5),  # superseded 4 before it was judged
        *_rolled(6, revision=5, to=4, as_revision=6),
    ]
    assert invariants.auto_rollback_problems(fine) == []
    twice = [*fine, _event(8, "rolled_back", "s2", None, "r", revision=5, to=4, as_revision=7)]
    assert any("twice" in p for p in invariants.auto_rollback_problems(twice))
    # A rollback's revision is never watched, so never rolled back in turn (no loop).
    loop = [*fine, _event(8, "rolled_back", "s2", None, "r", revision=6, to=5, as_revision=7)]
    assert any("not watched" in p for p in invariants.auto_rollback_problems(loop))
    watched_rollback = [*fine, _watched(8, 7, rollback_of=6)]
    assert any("rollback" in p for p in invariants.auto_rollback_problems(watched_rollback))
    # Without the revision it names: no fenced roll behind the event.
    bare = [_watched(1, 2), _event(2, "rolled_back", "s1", None, "r", revision=2, to=1,
                                   as_revision=3)]  # fmt: skip
    assert any("no revision 3" in p for p in invariants.auto_rollback_problems(bare))

    # The last watch open at the end: judged by then unless its deadline is still ahead.
    def at_end(now_s: float) -> list[str]:
        return invariants.auto_rollback_problems([_watched(1, 2)], now_s, never_healthy={"r"})

    assert any("never judged" in p for p in at_end(_deadline() + 60))
    assert at_end(_deadline() - 1) == []
    # A job that may end a watch healthy (no event) is not judged at the end.
    assert invariants.auto_rollback_problems([_watched(1, 2)], _deadline() + 60) == []


def _deadline() -> float:
    import datetime

    return datetime.datetime(2026, 11, 26, 10, tzinfo=datetime.UTC).timestamp()


def test_a_driver_that_runs_the_job_s_code_before_its_claim_is_flagged() -> None:
    """The warm hand-off pre-starts the next driver while the old one runs; its job code
    (its lifetime's start: the go signal) must come after the claim of its epoch, by its
    server. A go written before the claim (or by another server than the claimer) is a
    second writer of the checkpoint in the making."""

    def at(event: dict, t: float) -> dict:
        return {**event, "at_s": t}

    events = [
        at(_event(1, "claimed", "s1", 1), 0),
        at(_event(2, "released", "s1", 1, state="pending"), 5),
        at(_event(3, "claimed", "s2", 2, warm=True), 6),
    ]
    gone_after_claim = _life("a", 1, "s1", 0.5, 4.5) + _life("a", 2, "s2", 6.2, None)
    assert invariants.runs_before_claim(events, gone_after_claim) == []
    went_early = _life("a", 1, "s1", 0.5, 4.5) + _life("a", 2, "s2", 5.5, None)
    [problem] = invariants.runs_before_claim(events, went_early)
    assert "a: driver of epoch 2 on s2" in problem and "before its claim" in problem
    never_claimed = _life("a", 3, "s2", 9, None)
    assert len(invariants.runs_before_claim(events, never_claimed)) == 1
    elsewhere = _life("a", 2, "s3", 7, None)  # s2 claimed epoch 2, s3 ran it
    assert len(invariants.runs_before_claim(events, elsewhere)) == 1


def _claimed(epoch: int, at_s: float) -> dict[str, Any]:
    return {"job_name": "sec", "kind": "claimed", "epoch": epoch, "at_s": at_s}


def test_stale_secret_problems_sees_a_driver_claimed_after_a_new_value_holding_the_old() -> None:
    values = [("aaaa", 100.0), ("bbbb", 200.0)]
    events = [_claimed(1, 50.0), _claimed(2, 150.0), _claimed(3, 250.0)]
    fine = [
        {"job": "sec", "epoch": 1, "pid": 1, "secret": "aaaa"},
        # Claimed before value 2 was stored: either value may reach it.
        {"job": "sec", "epoch": 2, "pid": 2, "secret": "aaaa"},
        {"job": "sec", "epoch": 3, "pid": 3, "secret": "bbbb"},
        {"job": "other", "epoch": 3, "pid": 9, "secret": "aaaa"},
    ]
    assert invariants.stale_secret_problems("sec", fine, events, values) == []
    stale = [*fine, {"job": "sec", "epoch": 3, "pid": 4, "secret": "aaaa"}]
    problems = invariants.stale_secret_problems("sec", stale, events, values)
    assert problems == [
        "sec epoch 3: claimed 50.0 s after the secret had a newer value than value 1, "
        "which its driver ran with"
    ]
    # A put whose outcome is unknown (+inf) ages nothing; a later stored value does.
    unknown = [("aaaa", 100.0), ("cccc", float("inf")), ("bbbb", 200.0)]
    assert len(invariants.stale_secret_problems("sec", stale, events, unknown)) == 1
    nothing = [{"job": "sec", "epoch": 1, "pid": 5, "secret": "e3b0c44298fc1c14"}]
    assert invariants.stale_secret_problems("sec", nothing, events, values) == [
        "sec epoch 1: its driver got no value of the secret"
    ]


def test_missing_module_problems_sees_a_driver_without_its_dependency() -> None:
    beats = [
        {"job": "sec", "epoch": 1, "module": "0.9.0"},
        {"job": "other", "epoch": 1},
    ]
    assert invariants.missing_module_problems("sec", beats, "0.9.0") == []
    broken = [*beats, {"job": "sec", "epoch": 2, "module": None}, {"job": "sec", "epoch": 3}]
    assert invariants.missing_module_problems("sec", broken, "0.9.0") == [
        "sec epoch 2: its driver imported None, not 0.9.0",
        "sec epoch 3: its driver imported None, not 0.9.0",
    ]


def _health(kind: str, job: str, epoch: int) -> dict[str, Any]:
    return {"kind": kind, "job_name": job, "epoch": epoch}


def test_unresolved_flag_problems_sees_a_replaced_runs_flag_never_cleared() -> None:
    events = [
        _health("health_flagged", "st", 1),
        _health("health_cleared", "st", 1),
        _health("health_flagged", "st", 2),
        _health("health_flagged", "live", 4),  # its run still runs: no problem
    ]
    assert invariants.unresolved_flag_problems(events, {"st": 3, "live": 4}) == [
        "st: the health flag of epoch 2 was never cleared, though epoch 3 reported since"
    ]
    cleared = [*events, _health("health_cleared", "st", 2)]
    assert invariants.unresolved_flag_problems(cleared, {"st": 3, "live": 4}) == []


def test_rollback_while_deferred_problems_sees_an_outage_judged_as_the_revisions() -> None:
    def event(kind: str, cause: str | None = None) -> dict[str, Any]:
        return {"job_name": "rb", "kind": kind, "detail": {"cause": cause} if cause else {}}

    fine = [event("claimed"), event("deferred"), event("claimed"), event("started")]
    assert (
        invariants.rollback_while_deferred_problems([*fine, event("rolled_back", "not_healthy")])
        == []
    )
    assert invariants.rollback_while_deferred_problems(
        [event("claimed"), event("deferred"), event("rolled_back", "not_healthy")]
    ) == ["rb: rolled back as not healthy while its run was deferred"]
    # A crash rolls back at once, deferred or not.
    assert (
        invariants.rollback_while_deferred_problems(
            [event("deferred"), event("rolled_back", "crashed")]
        )
        == []
    )
