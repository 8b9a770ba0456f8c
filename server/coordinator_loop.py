"""The coordinator loop: while this server coordinates, a named thread runs the
coordinator's rebalances (``scheduler/coordinator.py``) and reaps departed owners'
expired leases, woken by membership or job changes (debounced), when a settle window
ends, and by a periodic timer as a fallback."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from scheduler import coordinator, loop

# The name its lines have always had, which operators' log filters know.
log = logging.getLogger("scheduler.coordinator")


class CoordinatorLoop(loop.Loop):
    """Runs :func:`coordinator.rebalance` and :func:`coordinator.reap` while this server
    coordinates, with its :class:`coordinator.RebalancePolicy`.

    ``servers()`` returns the live servers that take jobs (id -> capacity) and
    ``live()`` every live server id (including coordinator-only ones); both are read
    from the registry's membership view. ``on_deposed`` is called once if PostgreSQL
    reports a newer term; the loop then ends.

    The policy's ``lapse`` is the grace of a live owner's expired lease
    (:func:`coordinator.lapsed`). It applies only once this loop has reached PostgreSQL
    without a failure for that long: after an outage of PostgreSQL every lease in the
    table has expired, and each owner needs a poll to re-claim its own jobs, which must
    not be moved meanwhile.

    Its ``reap_hold``: nothing is reaped until the cluster has reached PostgreSQL again
    for that long after an outage (:func:`distribution.reap`); a server passes its lease
    TTL.
    """

    def __init__(
        self,
        engine: sa.Engine,
        server: str,
        term: int,
        servers: Callable[[], Mapping[str, int]],
        live: Callable[[], Iterable[str]],
        policy: coordinator.RebalancePolicy,
        *,
        on_deposed: Callable[[], None] = lambda: None,
        on_rebalance: Callable[[coordinator.Rebalance], None] = lambda _: None,
        still_leader: Callable[[], bool] = lambda: False,
    ) -> None:
        self.engine = engine
        self.server = server
        self.term = term
        self._servers = servers
        self._live = live
        self.policy = policy
        # When this loop's PostgreSQL access last began (monotonic; None: failing now).
        self._reachable_since: float | None = None
        self._next_wait = policy.interval
        self._on_deposed = on_deposed
        self._still_leader = still_leader
        self._on_rebalance = on_rebalance
        self._debounce_lock = threading.Lock()
        self._next_debounce = policy.debounce
        super().__init__(f"coordinator-{term}", join_timeout=10)

    def wake(self, debounce: float | None = None) -> None:
        """Rebalance soon: after ``debounce`` seconds (default: the policy's), so that a
        burst of changes gives one pass. Job commands pass a short one: an operator
        waiting for ``job start`` should not wait for a membership debounce."""
        with self._debounce_lock:
            wanted = self.policy.debounce if debounce is None else debounce
            self._next_debounce = min(self._next_debounce, wanted)
        super().wake()

    def run(self) -> None:
        retry = 0.2
        became = False
        while not self.stopping.is_set():
            try:
                if not became:
                    self._become()
                    became = True
                    log.info(
                        "coordinator term recorded",
                        extra={"action": "become", "term": self.term, "server": self.server},
                    )
                if self._reachable_since is None:
                    self._reachable_since = time.monotonic()
                self._cycle()
                retry = 0.2
            except coordinator.DeposedError as exc:
                log.warning(str(exc), extra={"action": "deposed", "term": self.term})
                self._on_deposed()
                return
            except DBAPIError as exc:
                # The state store is slow or failing over: retry with backoff, keep the job
                # set untouched, say so (never silently drop anything).
                self._reachable_since = None
                log.warning(
                    "rebalance failed (PostgreSQL unreachable or failing over); retrying",
                    extra={"action": "rebalance_retry", "error": type(exc.orig).__name__},
                )
                self.stopping.wait(retry)
                retry = min(retry * 2, 5.0)
                continue
            self.woken.wait(self._next_wait)
            if self.stopping.is_set():
                return
            # Debounce: let a burst of membership or job changes settle into one pass.
            self.woken.clear()
            with self._debounce_lock:
                delay, self._next_debounce = self._next_debounce, self.policy.debounce
            self.stopping.wait(delay)

    def _become(self) -> None:
        try:
            with self.engine.begin() as conn:
                coordinator.become(conn, self.term, self.server)
        except coordinator.DeposedError:
            # A larger recorded term while ZooKeeper says we lead: ZooKeeper lost its
            # history (see take_over). Otherwise we really were deposed.
            if not self._still_leader():
                raise
            with self.engine.begin() as conn:
                old_term, old_server = coordinator.take_over(conn, self.term, self.server)
            log.warning(
                "recorded coordinator term is from a lost ZooKeeper history; taking over",
                extra={
                    "action": "take_over",
                    "term": self.term,
                    "recorded_term": old_term,
                    "recorded_server": old_server,
                },
            )

    def _lapse_now(self) -> float | None:
        """The lapse grace, once PostgreSQL has been reachable for that long."""
        since, lapse = self._reachable_since, self.policy.lapse
        if lapse is None or since is None:
            return None
        return lapse if time.monotonic() - since >= lapse else None

    def _cycle(self) -> None:
        with self.engine.begin() as conn:
            p = self.policy
            result = coordinator.rebalance(
                conn,
                self.term,
                self.server,
                self._servers(),
                epsilon=p.epsilon,
                vnodes=p.vnodes,
                settle=p.settle,
                hold=p.hold,
                lapse=self._lapse_now(),
                defer_streak=p.defer_streak,
                defer_window=p.defer_window,
                residency=p.residency,
            )
        # Look again as soon as a settle window ends: a joiner then takes its jobs and
        # held new jobs are placed.
        # ... and as soon as a departed owner's lease expires: its jobs fail over then.
        # ... and as soon as a deferred join move's job has run for the residency.
        dues = [d for d in (result.settle_due, result.held_due, result.join_due) if d is not None]
        due = min(dues, default=None)
        self._next_wait = p.interval if due is None else min(p.interval, due + 0.05)
        with self.engine.begin() as conn:
            reaped = coordinator.reap(conn, self.term, self._live(), self.server, hold=p.reap_hold)
        if result.changed or reaped:
            log.info(
                "rebalanced",
                extra={
                    "action": "rebalance",
                    "term": self.term,
                    "ring_generation": result.ring_generation,
                    "changed": result.changed,
                    "moved": result.moved,
                    "pending": result.pending,
                    "reaped": len(reaped),
                    "lapsed": result.lapsed,
                    "deferred": result.deferred,
                    "not_renewing": list(result.not_renewing),
                    "seconds": round(result.seconds, 3),
                },
            )
        self._on_rebalance(result)
