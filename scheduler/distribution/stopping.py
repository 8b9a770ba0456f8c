"""Stopping a run its owner holds: begin stopping (with a warm hand-off's offer), the
target's warm driver ready for it, and the release of the job once the driver ended.

The release decides ``pending`` or ``stopped`` in SQL from the job's ``desired``, read
under the job row's lock, so a start racing with a stop is never lost.
"""

from __future__ import annotations

import sqlalchemy as sa

from scheduler.distribution import fencing
from sql import states
from sql.states import EventKind, RunState

_BEGIN_STOP = fencing.transition(
    EventKind.STOPPING,
    RunState.STOPPING,
    "handoff_epoch = CASE WHEN CAST(:warm AS boolean) THEN d.epoch ELSE NULL END,",
    release=False,
    detail="jsonb_build_object('reason', CAST(:reason AS text))"
    " || CASE WHEN CAST(:warm AS boolean) THEN jsonb_build_object('warm', true)"
    " ELSE '{}'::jsonb END",
)


def begin_stop(
    conn: sa.Connection,
    job_id: int,
    owner: fencing.Owner,
    epoch: int,
    reason: str,
    *,
    warm: bool = False,
) -> None:
    """The owner starts stopping its driver (migration, stop or restart command).
    ``warm``: a planned move that offers its target a warm hand-off at this epoch
    (``handoff_epoch``; docs/drivers.md, "Warm hand-off")."""
    fencing.fenced(
        conn,
        _BEGIN_STOP,
        RunState.STOPPING,
        job_id,
        owner.params(),
        epoch,
        reason=reason,
        warm=warm,
    )


_MARK_WARM_READY = sa.text(
    """
    UPDATE distribution
       SET warm_ready_epoch = epoch, updated_at = now()
     WHERE job_id = :job_id
       AND target = :server
       AND epoch = :epoch
       AND handoff_epoch = :epoch
       AND state = 'stopping'
    RETURNING job_id
    """
)


def mark_warm_ready(conn: sa.Connection, job_id: int, server: str, epoch: int) -> None:
    """The target's warm driver for the hand-off of the run at ``epoch`` has built its
    SparkSession, or will not (it could not be launched): its old owner may stop now.
    Only the target of a standing offer may say so; it changes no lease and no state
    (the old owner still holds the epoch)."""
    if conn.execute(_MARK_WARM_READY, {"job_id": job_id, "server": server, "epoch": epoch}).first():
        return
    raise fencing.FencedError(
        f"job {job_id}: no warm hand-off of epoch {epoch} offered to {server}"
    )


_RELEASE = fencing.transition(
    EventKind.RELEASED,
    RunState.PENDING,
    "",
    release=True,
    state="CASE WHEN j.desired = 'running' THEN 'pending' ELSE 'stopped' END",
    detail="jsonb_build_object('state', CASE WHEN j.desired = 'running' "
    "THEN 'pending' ELSE 'stopped' END)",
)


def release(conn: sa.Connection, job_id: int, owner: fencing.Owner, epoch: int) -> RunState:
    """Give the job up after its driver ended: ``pending`` if it is still wanted running
    (handoff, restart, lost lease), else ``stopped``. Decided in SQL from the job's
    desired state, read under the job row's lock, so a start racing with a stop is
    never lost."""
    row = conn.execute(
        _RELEASE,
        {
            "job_id": job_id,
            **owner.params(),
            "epoch": epoch,
            "sources": sorted(states.OWNED),
        },
    ).one_or_none()
    if row is None:
        raise fencing.FencedError(
            f"job {job_id}: {owner.server} at epoch {epoch} may not release it"
        )
    return RunState(row.state)
