"""The campaign's checks catch what they claim to: each one fed a violation and a clean
history (no services needed)."""

from __future__ import annotations

from tests.chaos import invariants


def _beats(job: str, pid: int, start: float, end: float) -> list[dict]:
    t, out = start, []
    while t <= end:
        out.append({"job": job, "epoch": "1", "server": "s", "pid": pid, "t": t})
        t += 0.2
    return out


def test_heartbeats_of_two_drivers_at_once_are_a_double_run() -> None:
    clean = _beats("a", 1, 0, 5) + _beats("a", 2, 6, 9) + _beats("b", 3, 0, 9)
    assert invariants.heartbeat_overlaps(clean) == []
    twice = _beats("a", 1, 0, 5) + _beats("a", 2, 4, 9)
    assert len(invariants.heartbeat_overlaps(twice)) == 1
    assert invariants.heartbeat_overlaps(twice, margin=2.0) == []


def _life(job: str, epoch: int, server: str, start: float, end: float | None) -> list[dict]:
    out = [{"job": job, "epoch": epoch, "server": server, "event": "started", "t": start}]
    if end is not None:
        out.append({"job": job, "epoch": epoch, "server": server, "event": "ended", "t": end})
    return out


def test_lifetimes_overlap_including_a_driver_still_alive() -> None:
    clean = _life("a", 1, "s1", 0, 5) + _life("a", 2, "s2", 6, None)
    assert invariants.lifetime_overlaps(clean, now=10) == []
    alive = _life("a", 1, "s1", 0, None) + _life("a", 2, "s2", 6, 8)
    assert len(invariants.lifetime_overlaps(alive, now=10)) == 1


def _event(i: int, kind: str, server: str | None, epoch: int | None) -> dict:
    return {"id": i, "job_name": "a", "kind": kind, "server": server, "epoch": epoch}


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


def test_lost_jobs_are_wanted_running_without_a_live_owner_or_a_reason() -> None:
    base = {"desired": "running", "target": "s1", "last_error": None}
    jobs = [
        {**base, "name": "ok", "state": "running", "owner": "s1"},
        {**base, "name": "dead-owner", "state": "running", "owner": "s9"},
        {**base, "name": "pending", "state": "pending", "owner": None},
        {**base, "name": "failed-why", "state": "failed", "owner": None, "last_error": "x"},
        {**base, "name": "failed-silent", "state": "failed", "owner": None},
        {**base, "name": "done", "state": "finished", "owner": None},
        {**base, "name": "off", "desired": "stopped", "state": "stopped", "owner": None},
    ]
    lost = invariants.lost_jobs(jobs, live={"s1"})
    assert [p.split(":")[0] for p in lost] == ["dead-owner", "pending", "failed-silent"]


def test_a_finished_job_claimed_again_is_resurrected() -> None:
    was = {"done": {"state": "finished", "epoch": 1, "attempt": 1}}
    assert invariants.resurrections(was, was, []) == []
    again = {"done": {"state": "starting", "epoch": 2, "attempt": 2}}
    assert len(invariants.resurrections(was, again, [])) == 1
    claimed = [{"job_name": "done", "kind": "claimed"}]
    assert len(invariants.resurrections(was, was, claimed)) == 1


def test_a_started_driver_of_a_corrupt_artifact_is_counted() -> None:
    lives = _life("bad", 1, "s1", 0, 1) + _life("good", 1, "s1", 0, 1)
    events = [{"job_name": "bad", "kind": "driver_started", "epoch": 1}]
    assert len(invariants.corrupt_starts(["bad"], lives, events)) == 2
    assert invariants.corrupt_starts(["other"], lives, events) == []
