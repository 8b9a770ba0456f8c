"""The coordinator: recomputes job targets and writes the ones that changed.

One server at a time is coordinator, elected through ZooKeeper with a *term* that only
grows (``registry``). Before its first write it records that term in the one-row
``coordinator`` table (:func:`become`); every rebalance locks that row and checks the
term, so a deposed coordinator (a newer term was recorded) writes nothing: PostgreSQL
rejects it with :class:`DeposedError`.

A rebalance is idempotent and resumable: it reads every job's current target, computes
the placement from scratch (``scheduler/placement.py``) and writes only the rows whose
target or pending reason differ, in one transaction with a new ring generation. A
coordinator that dies halfway commits nothing; the next one recomputes the same answer.
Targets are the only thing it writes (plus reaping departed owners' expired leases):
owners and epochs belong to the servers.

:class:`CoordinatorLoop` runs rebalances on a named thread, woken by membership or job
changes (debounced) and by a periodic timer as a fallback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from scheduler import distribution, notify, placement, states

log = logging.getLogger(__name__)


class DeposedError(Exception):
    """A newer coordinator term is recorded: this coordinator must write nothing."""


def become(conn: sa.Connection, term: int, server: str) -> None:
    """Record ``term`` as the current coordinator term.

    It must be newer than the recorded one, or the same term of the same server: a
    coordinator that stepped down during a short ZooKeeper disconnection and is elected
    again with the same election node (same term) resumes its term."""
    recorded = conn.execute(
        sa.text(
            """
            UPDATE coordinator SET term = :term, server = :server, updated_at = now()
             WHERE id = 1 AND (term < :term OR (term = :term AND server = :server))
            RETURNING term
            """
        ),
        {"term": term, "server": server},
    ).scalar_one_or_none()
    if recorded is None:
        raise DeposedError(f"term {term} of {server} is not newer than the recorded term")


def _fence(conn: sa.Connection, term: int) -> None:
    """Lock the coordinator row and check the term (a newer ``become`` waits for us)."""
    current = conn.execute(
        sa.text("SELECT term FROM coordinator WHERE id = 1 FOR UPDATE")
    ).scalar_one()
    if current != term:
        raise DeposedError(f"coordinator term {term} was superseded by term {current}")


def job_rows(conn: sa.Connection) -> list[sa.Row]:
    """Every job with what placement needs: name, desired, state, target, owner."""
    return conn.execute(
        sa.text(
            """
            SELECT d.job_id, j.name, j.desired, d.state, d.target, d.owner, d.pending_reason
              FROM distribution d JOIN jobs j ON j.id = d.job_id
            """
        )
    ).all()


def active_jobs(rows: Iterable[sa.Row]) -> list[str]:
    """Names of the jobs that need a target: wanted running, not finished or failed."""
    done = {states.RunState.FINISHED.value, states.RunState.FAILED.value}
    return [r.name for r in rows if r.desired == "running" and r.state not in done]


def placeable(conn: sa.Connection, servers: Mapping[str, int]) -> dict[str, int]:
    """The live servers that may take jobs: capacity above zero and not being drained."""
    drained = set(conn.execute(sa.text("SELECT server FROM drains")).scalars())
    return {sid: cap for sid, cap in servers.items() if cap > 0 and sid not in drained}


@dataclass(frozen=True)
class Rebalance:
    ring_generation: int | None  # None when nothing changed
    changed: int
    active: int
    pending: int
    seconds: float


_UPDATE_TARGETS = sa.text(
    """
    UPDATE distribution d
       SET target = v.target, pending_reason = v.reason, ring_generation = :generation,
           updated_at = now()
      FROM unnest(CAST(:job_ids AS bigint[]), CAST(:targets AS text[]),
                  CAST(:reasons AS text[])) AS v(job_id, target, reason)
     WHERE d.job_id = v.job_id
    """
)
_RETARGET_EVENTS = sa.text(
    """
    INSERT INTO job_events (job_id, job_name, kind, server, detail)
    SELECT v.job_id, v.name, 'retargeted', :server,
           jsonb_build_object('from', v.old, 'to', v.new, 'ring_generation', :generation)
      FROM unnest(CAST(:job_ids AS bigint[]), CAST(:names AS text[]),
                  CAST(:olds AS text[]), CAST(:news AS text[])) AS v(job_id, name, old, new)
    """
)


def rebalance(
    conn: sa.Connection,
    term: int,
    server: str,
    servers: Mapping[str, int],
    *,
    epsilon: float,
    vnodes: int,
) -> Rebalance:
    """Recompute every target for the live ``servers`` (id -> capacity) and write changes.

    Jobs wanted running and not finished or failed are placed; the others get no
    target. Must run inside a transaction; raises :class:`DeposedError` when ``term`` is
    no longer the recorded one.
    """
    started = time.perf_counter()
    _fence(conn, term)
    rows = job_rows(conn)
    active = active_jobs(rows)
    plan = placement.place(active, placeable(conn, servers), epsilon=epsilon, vnodes=vnodes)
    wanted = set(active)
    changes = []
    for r in rows:
        target = plan.targets.get(r.name) if r.name in wanted else None
        reason = plan.pending.get(r.name) if r.name in wanted else None
        if (target, reason) != (r.target, r.pending_reason):
            changes.append((r, target, reason))
    generation = None
    if changes:
        generation = conn.execute(
            sa.text(
                "UPDATE coordinator SET ring_generation = ring_generation + 1, "
                "updated_at = now() WHERE id = 1 RETURNING ring_generation"
            )
        ).scalar_one()
        conn.execute(
            _UPDATE_TARGETS,
            {
                "generation": generation,
                "job_ids": [r.job_id for r, _, _ in changes],
                "targets": [t for _, t, _ in changes],
                "reasons": [reason for _, _, reason in changes],
            },
        )
        moved = [(r, t) for r, t, _ in changes if t != r.target]
        if moved:
            conn.execute(
                _RETARGET_EVENTS,
                {
                    "server": server,
                    "generation": generation,
                    "job_ids": [r.job_id for r, _ in moved],
                    "names": [r.name for r, _ in moved],
                    "olds": [r.target for r, _ in moved],
                    "news": [t for _, t in moved],
                },
            )
        notify.notify(conn, notify.TARGETS_CHANNEL, str(generation))
    return Rebalance(
        ring_generation=generation,
        changed=len(changes),
        active=len(active),
        pending=len(plan.pending),
        seconds=time.perf_counter() - started,
    )


class CoordinatorLoop:
    """Runs :func:`rebalance` and :func:`distribution.reap` while this server coordinates.

    ``servers()`` returns the live servers that take jobs (id -> capacity) and
    ``live()`` every live server id (including coordinator-only ones); both are read
    from the registry's membership view. ``on_deposed`` is called once if PostgreSQL
    reports a newer term; the loop then ends.
    """

    def __init__(
        self,
        engine: sa.Engine,
        server: str,
        term: int,
        servers: Callable[[], Mapping[str, int]],
        live: Callable[[], Iterable[str]],
        *,
        epsilon: float,
        vnodes: int,
        debounce: float,
        interval: float,
        on_deposed: Callable[[], None] = lambda: None,
        on_rebalance: Callable[[Rebalance], None] = lambda _: None,
    ) -> None:
        self.engine = engine
        self.server = server
        self.term = term
        self._servers = servers
        self._live = live
        self._epsilon = epsilon
        self._vnodes = vnodes
        self._debounce = debounce
        self._interval = interval
        self._on_deposed = on_deposed
        self._on_rebalance = on_rebalance
        self._wake = threading.Event()
        self._debounce_lock = threading.Lock()
        self._next_debounce = debounce
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"coordinator-{term}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self, debounce: float | None = None) -> None:
        """Rebalance soon: after ``debounce`` seconds (default: the loop's), so that a
        burst of changes gives one pass. Job commands pass a short one: an operator
        waiting for ``job start`` should not wait for a membership debounce."""
        with self._debounce_lock:
            wanted = self._debounce if debounce is None else debounce
            self._next_debounce = min(self._next_debounce, wanted)
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        retry = 0.2
        became = False
        while not self._stop.is_set():
            try:
                if not became:
                    with self.engine.begin() as conn:
                        become(conn, self.term, self.server)
                    became = True
                    log.info(
                        "coordinator term recorded",
                        extra={"action": "become", "term": self.term, "server": self.server},
                    )
                self._cycle()
                retry = 0.2
            except DeposedError as exc:
                log.warning(str(exc), extra={"action": "deposed", "term": self.term})
                self._on_deposed()
                return
            except DBAPIError as exc:
                # The state store is slow or failing over: retry with backoff, keep the job
                # set untouched, say so (never silently drop anything).
                log.warning(
                    "rebalance failed (PostgreSQL unreachable or failing over); retrying",
                    extra={"action": "rebalance_retry", "error": type(exc.orig).__name__},
                )
                self._stop.wait(retry)
                retry = min(retry * 2, 5.0)
                continue
            self._wake.wait(self._interval)
            if self._stop.is_set():
                return
            # Debounce: let a burst of membership or job changes settle into one pass.
            self._wake.clear()
            with self._debounce_lock:
                delay, self._next_debounce = self._next_debounce, self._debounce
            self._stop.wait(delay)

    def _cycle(self) -> None:
        with self.engine.begin() as conn:
            result = rebalance(
                conn,
                self.term,
                self.server,
                self._servers(),
                epsilon=self._epsilon,
                vnodes=self._vnodes,
            )
        with self.engine.begin() as conn:
            _fence(conn, self.term)
            reaped = distribution.reap(conn, self._live(), self.server)
        if result.changed or reaped:
            log.info(
                "rebalanced",
                extra={
                    "action": "rebalance",
                    "term": self.term,
                    "ring_generation": result.ring_generation,
                    "changed": result.changed,
                    "pending": result.pending,
                    "reaped": len(reaped),
                    "seconds": round(result.seconds, 3),
                },
            )
        self._on_rebalance(result)
