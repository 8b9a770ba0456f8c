"""The fenced write: who may write a distribution row, and how a write proves it.

An owner is one *incarnation* of a server (:class:`Owner`): its id and a token drawn
when the process starts. Every owner write here is one guarded ``UPDATE``
(:func:`transition`) whose ``WHERE`` names the caller, its epoch and the legal source
states from ``sql/states.py``, and that appends its event to ``job_events`` in the same
statement (:func:`event_cte`). :func:`fenced` runs one: zero rows matched raises
:class:`FencedError`, never passes silently. A claim that finds the job not free raises
:class:`NotClaimable`.

Also here: the states an ended run leaves its job in when an operator's restart
(:data:`RESTART_WINS`) or stop (:data:`STOP_WINS`) came meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from sql import states
from sql.states import RunState


class FencedError(Exception):
    """A write matched no row: the caller's epoch is stale or the transition illegal."""


class NotClaimable(Exception):
    """The job is not free for this server to claim (not targeted here, leased, backoff)."""


@dataclass(frozen=True)
class Owner:
    """One incarnation of a server: who holds a lease."""

    server: str  # the server id (ZooKeeper member name, the row's ``owner``)
    incarnation: str  # drawn once per process start (``owner_incarnation``)

    def params(self) -> dict[str, str]:
        return {"server": self.server, "incarnation": self.incarnation}


def event_cte(kind: str, kind_sql: str | None = None) -> str:
    """SQL that appends one job_events row per row of the ``changed`` CTE; its kind is
    ``kind``, or the SQL expression ``kind_sql`` over ``changed`` when it depends on
    the state written."""
    kind_value = kind_sql or f"'{kind}'"
    return f"""
        , event AS (
            INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail)
            SELECT job_id, name, {kind_value}, :server, epoch, detail FROM changed
        )
    """


# The state an ended run leaves the job in when a restart was requested meanwhile (the
# job's generation moved past the run's): pending, so the new generation runs.
RESTART_WINS = "CASE WHEN j.desired = 'running' AND j.generation <> d.generation THEN 'pending' "
# A run that ends while its job is wanted stopped ends 'stopped' (a crash counted first).
STOP_WINS = "CASE WHEN j.desired = 'stopped' THEN 'stopped' "


def transition(
    kind: str,
    target: RunState,
    set_clause: str,
    *,
    release: bool,
    detail: str = "jsonb_build_object()",
    guard: str = "",
    state: str | None = None,
    by_watchdog: bool = False,
    after_reap: bool = False,
    kind_sql: str | None = None,
) -> sa.TextClause:
    """One fenced owner write: ``owner``, ``owner_incarnation`` and ``epoch`` must match
    (with ``by_watchdog``: ``owner`` and ``epoch``, the run; :func:`finish_by_watchdog`).

    ``after_reap``: also taken from the owner the coordinator reaped the row from, at
    the same epoch, while nobody has claimed it since (``reaped_from``, migration 0016;
    a claim clears it and bumps the epoch): the outcome of a run whose record its
    owner could not write before its lease expired (:func:`finish`).

    ``state``: an SQL expression for the new state when it depends on the job row
    (default: ``target``). The job row is locked first (the package docstring's lock order)."""
    owner_reset = "owner = NULL, owner_incarnation = NULL, lease_until = NULL," if release else ""
    new_state = state or f"'{target.value}'"
    incarnation = "" if by_watchdog else "AND d.owner_incarnation = :incarnation"
    fence = f"d.owner = :server {incarnation} AND d.state = ANY(:sources)"
    if after_reap:
        fence = (
            f"(({fence}) OR (d.owner IS NULL AND d.reaped_from = :server"
            " AND d.state IN ('pending', 'stopped')))"
        )
    return sa.text(
        f"""
        WITH j AS (
            SELECT id, name, kind, desired, generation, max_restarts, restart_window_s
              FROM jobs WHERE id = :job_id FOR SHARE
        ), changed AS (
            UPDATE distribution d
               SET {owner_reset}
                   state = {new_state},
                   {set_clause}
                   updated_at = now()
              FROM j
             WHERE d.job_id = j.id
               AND d.epoch = :epoch
               AND {fence}
               {guard}
            RETURNING d.job_id, j.name, d.epoch, d.state, d.restarts, {detail} AS detail
        )
        """
        + event_cte(kind, kind_sql)
        + "SELECT job_id, state, restarts FROM changed"
    )


def fenced(
    conn: sa.Connection,
    statement: sa.TextClause,
    target: RunState,
    job_id: int,
    fence: Mapping[str, str],
    epoch: int,
    sources: Iterable[RunState] | None = None,
    **params: object,
) -> sa.Row:
    """Run a :func:`transition`; ``fence``: ``Owner.params()``, or ``{"server": ...}``
    for a statement made ``by_watchdog``."""
    row = conn.execute(
        statement,
        {
            "job_id": job_id,
            **fence,
            "epoch": epoch,
            "sources": sorted(sources) if sources is not None else list(states.sources(target)),
            **params,
        },
    ).one_or_none()
    if row is None:
        raise FencedError(
            f"job {job_id}: {fence['server']} at epoch {epoch} may not move it to {target.value}"
        )
    return row
