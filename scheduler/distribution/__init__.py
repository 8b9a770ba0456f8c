"""Lease and fencing operations on the distribution table.

Every operation here is one guarded SQL statement (an ``UPDATE`` whose ``WHERE`` names
the caller, its epoch and the legal source states from ``sql/states.py``) that
also appends its event to ``job_events`` in the same statement. Zero rows matched means
the caller no longer holds the job at that epoch, or the transition is illegal: it
raises :class:`FencedError`, never passes silently.

Time comes only from PostgreSQL (``now()``): it is the one clock compared across
machines. A lease is ``lease_until = now() + ttl``; a claim succeeds only on a row
targeted at the caller whose lease is free or expired, and it increments ``epoch``, so
every later write of a previous owner (which carries the old epoch) matches no row.

An owner is one *incarnation* of a server (:class:`Owner`): its id and a token drawn
when the process starts. Claims record both; renewals and every owner write match both,
so two processes with one server id (a restart before the old ZooKeeper session
expired, two hosts with one name) never renew or write each other's leases.

A run's watchdog (``server/watchdog.py``) records how its driver ended itself, for
when its server is stalled or dead at that moment: :func:`finish_by_watchdog`,
:func:`record_crash_by_watchdog` and :func:`defer_by_watchdog` are the same writes,
fenced on the *run* (server and epoch) instead of the owner's incarnation (see
:func:`finish_by_watchdog` for why that is exact).

Lock order: a statement that reads the job's ``desired`` or ``generation`` to decide a
row's next state locks the job row first (``FOR SHARE``), as every operator command in
``scheduler/jobs.py`` does (``FOR UPDATE``) before it touches the distribution row. So
an owner ending a run and a concurrent ``job start``/``restart`` serialize: the release
sees the command, or the command sees the release, never neither (a job is never left
``stopped`` or ``finished`` while a newer start or restart wants it running).

Callers pass a ``sqlalchemy.Connection`` inside a transaction (``engine.begin()``), and
call the operations by this package's names (``distribution.claim(...)``). The modules:

- ``fencing``: :class:`Owner`, the errors, and the fenced write every owner write is;
- ``clock``: the cluster clock hold (:data:`HELD_OVER`) and the renewals' stamp of it;
- ``leases``: :func:`claim`, :func:`mark_running`, :func:`renew_leases`, :func:`adopt`,
  :func:`reap`, and the reads :func:`holds` and :func:`lease_remaining`;
- ``stopping``: :func:`begin_stop`, :func:`mark_warm_ready`, :func:`release`;
- ``ends``: :func:`finish`, :func:`record_crash`, :func:`defer` (and their
  ``*_by_watchdog`` twins), the restart budget (:data:`IN_WINDOW`, :data:`SPEND`),
  :func:`ended_at`;
- ``polling``: :class:`Row` and :func:`poll`, what a server's poll loop reads.
"""

from __future__ import annotations

from scheduler.distribution.clock import HELD_OVER
from scheduler.distribution.ends import (
    ENDED_BY_WATCHDOG,
    IN_WINDOW,
    SPEND,
    defer,
    defer_by_watchdog,
    ended_at,
    finish,
    finish_by_watchdog,
    record_crash,
    record_crash_by_watchdog,
)
from scheduler.distribution.fencing import FencedError, NotClaimable, Owner
from scheduler.distribution.leases import (
    Claim,
    adopt,
    claim,
    holds,
    lease_remaining,
    mark_running,
    reap,
    renew_leases,
)
from scheduler.distribution.polling import PRE_GO_HOOK_CONFS, WARM_ALLOWED, Row, poll
from scheduler.distribution.stopping import begin_stop, mark_warm_ready, release

__all__ = [
    "ENDED_BY_WATCHDOG",
    "HELD_OVER",
    "IN_WINDOW",
    "PRE_GO_HOOK_CONFS",
    "SPEND",
    "WARM_ALLOWED",
    "Claim",
    "FencedError",
    "NotClaimable",
    "Owner",
    "Row",
    "adopt",
    "begin_stop",
    "claim",
    "defer",
    "defer_by_watchdog",
    "ended_at",
    "finish",
    "finish_by_watchdog",
    "holds",
    "lease_remaining",
    "mark_running",
    "mark_warm_ready",
    "poll",
    "reap",
    "record_crash",
    "record_crash_by_watchdog",
    "release",
    "renew_leases",
]
