"""The runner's shared state (server/run_table.py): its named operations, without
services. The table's threads and their timing are
tests/integration/test_runner_*.py's."""

from __future__ import annotations

from pathlib import Path

from scheduler import distribution
from server import run_table, runs
from server.reconcile import Phase

ME = distribution.Owner("s1", "now")
BEFORE = distribution.Owner("s1", "before")  # the previous incarnation of s1


class _Driver:
    """A driver that records its confirmations, and may have ended."""

    def __init__(self, ended: bool = False) -> None:
        self.deadlines: list[float] = []
        self._ended = ended

    def confirm(self, deadline: float) -> None:
        self.deadlines.append(deadline)

    def ended(self) -> bool:
        return self._ended


def _run(job_id: int, owner: distribution.Owner = ME, **fields: object) -> runs.Run:
    return runs.Run(
        job_id=job_id,
        name=f"j{job_id}",
        kind="batch",
        epoch=fields.pop("epoch", 1),  # type: ignore[arg-type]
        attempt=1,
        claimed_at=fields.pop("claimed_at", 0.0),  # type: ignore[arg-type]
        deadline=10.0,
        owner=owner,
        **fields,  # type: ignore[arg-type]
    )


def _warm(job_id: int, tmp_path: Path) -> runs.WarmRun:
    return runs.WarmRun(job_id, f"j{job_id}", "streaming", 2, 1, 1, tmp_path)


def test_a_renewal_confirms_the_renewed_and_returns_only_the_lost() -> None:
    table = run_table.RunTable()
    renewed = _run(1, phase=Phase.RUNNING, driver=_Driver())
    lost = _run(2, phase=Phase.RUNNING, driver=_Driver())
    ended = _run(3, phase=Phase.RUNNING, driver=_Driver(ended=True))
    late = _run(4, claimed_at=5.0)  # claimed after the renewal was sent
    unsent = _run(5)
    previous = _run(6, owner=BEFORE)
    for run in (renewed, lost, ended, late, unsent, previous):
        table.add(run)
    sent = {1, 2, 3, 4, 6}
    assert {run.job_id for run in table.owned_by(ME)} == {1, 2, 3, 4, 5}
    assert table.renewed(ME, sent, {1: 1, 2: 0}, deadline=42.0, t_sent=1.0) == [lost]
    assert renewed.deadline == 42.0 and renewed.driver.deadlines == [42.0]  # type: ignore[union-attr]
    assert lost.deadline == 10.0 and late.deadline == 10.0


def test_a_run_is_forgotten_only_while_it_is_its_job_s_run() -> None:
    table = run_table.RunTable()
    old, new = _run(1), _run(1, epoch=2)
    table.add(old)
    table.add(new)
    table.remove(old)
    assert table.snapshot() == {1: new}
    assert not table.add_ended(_run(1, epoch=3), lambda conn: None)
    table.remove(new)
    assert not table.has(1)
    orphan = _run(1, phase=Phase.ENDED)
    assert table.add_ended(orphan, print) and orphan.unrecorded is print


def test_an_outcome_is_recorded_by_one_thread_and_kept_until_it_is() -> None:
    table = run_table.RunTable()
    run = _run(1, phase=Phase.RUNNING)
    table.add(run)
    assert table.begin_stop(run) and run.phase is Phase.STOPPING
    assert not table.begin_stop(run)  # stopping already
    table.end(run, print)
    assert run.phase is Phase.ENDED
    assert table.begin_recording(run) is print
    assert table.begin_recording(run) is None  # another thread records it now
    table.recording_failed(run)
    assert table.begin_recording(run) is print and table.has(1)
    table.recorded(run)
    assert run.unrecorded is None and not run.recording and not table.has(1)


def test_a_run_is_marked_running_by_one_thread_at_a_time() -> None:
    table = run_table.RunTable()
    run = _run(1)
    assert table.begin_marking(run) and run.mark is runs.Mark.MARKING
    assert not table.begin_marking(run)
    table.end_marking(run)  # the write failed: tried again
    assert run.mark is runs.Mark.UNMARKED and table.begin_marking(run)
    run.mark = runs.Mark.MARKED  # by the thread that holds it marking
    table.end_marking(run)
    assert run.mark is runs.Mark.MARKED and not table.begin_marking(run)


def test_a_start_forgets_its_start_deferrals_but_not_its_master_deferrals() -> None:
    table = run_table.RunTable()
    run = _run(1)
    assert [table.count_start_deferral(1) for _ in range(3)] == [0, 1, 2]
    assert [table.count_master_deferral(1) for _ in range(2)] == [0, 1]
    handle = _Driver()
    table.start_running(run, handle, "spark://m:7077")  # type: ignore[arg-type]
    assert run.phase is Phase.RUNNING and handle.deadlines == [run.deadline]
    assert table.count_start_deferral(1) == 0
    assert table.count_master_deferral(1) == 2
    table.forget_master_deferrals(1)
    assert table.count_master_deferral(1) == 0


def test_a_killed_run_s_record_is_decided_once_and_only_while_it_runs() -> None:
    table = run_table.RunTable()
    run = _run(1, epoch=3)
    table.add(run)
    assert table.kill_as(1, 3, print) is None  # starting: no driver yet
    run.driver = _Driver()  # type: ignore[assignment]
    run.phase = Phase.RUNNING
    assert table.kill_as(1, 2, print) is None  # another epoch
    assert table.kill_as(1, 3, print) is run and run.killed_as is print
    assert table.kill_as(1, 3, repr) is None and run.killed_as is print


def test_dying_jobs_and_handled_orphans() -> None:
    table = run_table.RunTable()
    table.add_dying(1)
    assert table.dying() == {1}
    table.discard_dying(1)
    assert table.dying() == frozenset()
    table.add_orphan((1, True))
    table.add_orphan((2, False))
    table.forget_orphan((2, False))
    table.keep_orphans({(1, True), (3, True)})
    assert table.handled_orphans() == {(1, True)}
    table.keep_orphans(set())
    assert table.handled_orphans() == frozenset()


def test_a_warm_driver_is_taken_or_discarded_once(tmp_path: Path) -> None:
    table = run_table.RunTable()
    warm = _warm(1, tmp_path)
    table.add_warm(warm)
    assert table.has_warm(1) and table.warm_wanted(warm)
    table.warm_ready(warm)
    assert warm.phase is runs.WarmPhase.READY and table.warm_wanted(warm)
    assert table.warm_epochs() == {1: 2}
    handle = _Driver()
    assert not table.set_warm_driver(warm, handle)  # type: ignore[arg-type]
    assert table.take_warm(1) == (warm, handle)
    assert warm.phase is runs.WarmPhase.DISCARDED and not table.warm_wanted(warm)
    assert table.take_warm(1) is None and table.discard_warm(1) is None
    # Discarded before its driver was launched: its launcher kills it.
    late = _warm(2, tmp_path)
    table.add_warm(late)
    assert table.discard_warm(2) is late
    table.warm_ready(late)  # its session was built meanwhile: it stays discarded
    assert late.phase is runs.WarmPhase.DISCARDED
    assert table.set_warm_driver(late, _Driver())  # type: ignore[arg-type]


def test_warm_drivers_that_ended_are_reaped_and_a_shutdown_discards_the_rest(
    tmp_path: Path,
) -> None:
    table = run_table.RunTable()
    building, ended, running = _warm(1, tmp_path), _warm(2, tmp_path), _warm(3, tmp_path)
    for warm in (building, ended, running):
        table.add_warm(warm)
    table.set_warm_driver(ended, _Driver(ended=True))  # type: ignore[arg-type]
    table.set_warm_driver(running, _Driver())  # type: ignore[arg-type]
    assert table.reap_ended_warm() == [ended] and ended.phase is runs.WarmPhase.DISCARDED
    assert table.warm_epochs() == {1: 2, 3: 2}
    assert sorted(w.job_id for w in table.discard_all_warm()) == [1, 3]
    assert {building.phase, running.phase} == {runs.WarmPhase.DISCARDED}
    assert table.warm_epochs() == {}


def test_the_declared_transitions_leave_no_state_unreachable() -> None:
    entered = {target for target, sources in runs.MARK_TRANSITIONS.items() if sources}
    assert entered | {runs.Mark.UNMARKED} == set(runs.Mark)
    assert set(runs.WARM_TRANSITIONS) | {runs.WarmPhase.BUILDING} == set(runs.WarmPhase)
