"""What a server's poll loop reads: every job targeted at or owned by it, as :class:`Row`.

Also whether a job's conf lets a warm driver take its run (:data:`WARM_ALLOWED`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa

from scheduler.distribution import fencing
from sql.states import RunState


@dataclass(frozen=True)
class Row:
    """One job as a server sees it when it polls the distribution table."""

    job_id: int
    name: str
    kind: str
    desired: str
    job_generation: int
    max_restarts: int
    target: str | None
    owner: str | None
    owner_incarnation: str | None
    epoch: int
    state: RunState
    generation: int
    restarts: int
    lease_expired: bool
    claimable_now: bool
    # Seconds until the job may become claimable by time alone (another owner's lease
    # expires, or a backoff ends); None when no such time applies.
    due_in: float | None = None
    # The job's current revision and the one its run was claimed with.
    job_revision: int | None = None
    revision: int | None = None
    # The run's attempt (a claim makes it attempt + 1, with epoch + 1).
    attempt: int = 0
    # Warm hand-off (docs/distribution.md): the epoch whose owner offered its target a
    # warm hand-off as it began a planned stop, and the epoch whose hand-off the
    # target's warm driver is ready for (its SparkSession is built). Each names an
    # epoch, so a claim (epoch + 1) makes both stale without a write.
    handoff_epoch: int | None = None
    warm_ready_epoch: int | None = None
    # The job's conf neither opts out (sparkring.handoff.warm=false) nor sets a hook that
    # runs its code before the go signal (PRE_GO_HOOK_CONFS, a -javaagent).
    warm_allowed: bool = True


# Spark confs that run the job's own code while the driver's session is built, that is
# before a warm driver's go signal (docs/drivers.md, "Warm hand-off"): a job that sets one
# moves cold. So does one whose driver's JVM options load a Java agent.
PRE_GO_HOOK_CONFS = (
    "spark.plugins",
    "spark.driver.plugins",
    "spark.extraListeners",
    "spark.sql.queryExecutionListeners",
    "spark.sql.streaming.streamingQueryListeners",
)
_HOOKS = ", ".join(f"'{name}'" for name in PRE_GO_HOOK_CONFS)
WARM_ALLOWED = f"""(COALESCE(j.conf ->> 'sparkring.handoff.warm', 'true') <> 'false'
           AND NOT jsonb_exists_any(j.conf, ARRAY[{_HOOKS}])
           AND strpos(COALESCE(j.conf ->> 'spark.driver.extraJavaOptions', ''),
                      '-javaagent') = 0)"""

# This server's rows first (both indexes), then their jobs by primary key: a plain join
# made the planner scan every job (15 ms -> 3 ms at 100,000 jobs, docs/benchmarks.md).
_POLL = sa.text(
    f"""
    WITH mine AS MATERIALIZED (
        SELECT * FROM distribution
         WHERE target = :server OR owner = :server OR job_id = ANY(:also)
    )
    SELECT d.job_id, j.name, j.kind, j.desired, j.generation AS job_generation,
           j.max_restarts, d.target, d.owner, d.owner_incarnation, d.epoch, d.state,
           d.generation, j.revision AS job_revision, d.revision,
           d.restarts, d.attempt, d.handoff_epoch, d.warm_ready_epoch,
           {WARM_ALLOWED} AS warm_allowed,
           (d.lease_until IS NOT NULL AND d.lease_until < now()) AS lease_expired,
           (d.not_before IS NULL OR d.not_before <= now()) AS claimable_now,
           CAST(EXTRACT(EPOCH FROM CASE
               WHEN d.owner IS NOT NULL
                    AND (d.owner <> :server OR d.owner_incarnation <> :incarnation)
                   THEN d.lease_until - now()
               WHEN d.owner IS NULL THEN d.not_before - now()
           END) AS double precision) AS due_in
      FROM mine d
      JOIN jobs j ON j.id = d.job_id
     WHERE j.id = ANY(ARRAY(SELECT job_id FROM mine))
     ORDER BY d.job_id
    """
)


def poll(conn: sa.Connection, owner: fencing.Owner, also: Iterable[int] = ()) -> list[Row]:
    """Every job targeted at or owned by the server (any incarnation of it), and the
    jobs ``also`` (its local runs: a run's row that moved on is read, not missing):
    what its poll loop acts on. ``due_in`` counts down another owner's lease, a previous
    incarnation's included."""
    return [
        Row(
            job_id=r.job_id,
            name=r.name,
            kind=r.kind,
            desired=r.desired,
            job_generation=r.job_generation,
            max_restarts=r.max_restarts,
            target=r.target,
            owner=r.owner,
            owner_incarnation=r.owner_incarnation,
            epoch=r.epoch,
            state=RunState(r.state),
            generation=r.generation,
            restarts=r.restarts,
            lease_expired=r.lease_expired,
            claimable_now=r.claimable_now,
            due_in=r.due_in,
            job_revision=r.job_revision,
            revision=r.revision,
            attempt=r.attempt,
            handoff_epoch=r.handoff_epoch,
            warm_ready_epoch=r.warm_ready_epoch,
            warm_allowed=r.warm_allowed,
        )
        for r in conn.execute(_POLL, {**owner.params(), "also": sorted(also)})
    ]
