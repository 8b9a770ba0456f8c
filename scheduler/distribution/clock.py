"""The cluster clock hold: when another server's expired lease may be taken.

:data:`HELD_OVER` is the condition a claim over another server's lease and a reap wait
for; :data:`STAMP_CLOCK` is the ``cluster_clock`` stamp every renewal writes, which ends
an outage (migration 0017).
"""

from __future__ import annotations

# Another server's expired lease is claimed over (:func:`claim`) or reaped (:func:`reap`)
# only ``:hold`` seconds after the later of PostgreSQL's start and the end of the
# cluster's last outage (``cluster_clock``, stamped by every renewal: :func:`renew_leases`).
# Right after either every lease has expired, and its owner, back a moment later, may
# hold the only word on how its driver ended (a batch exit 0, a failure that spends the
# budget: holes H5 and W1). A crash-restart of PostgreSQL, a failover to a standby and
# a network cut of every server do not move the postmaster's start; the clock does.
HELD_OVER = """GREATEST(pg_postmaster_start_time(),
                    COALESCE((SELECT outage_ended_at FROM cluster_clock WHERE id = 1),
                             '-infinity'))
           < now() - make_interval(secs => :hold)"""

# The stamp of every renewal: when the cluster last reached PostgreSQL; a stamp older
# than a lease (``:ttl``) means nobody renewed for that long, so this renewal ends an
# outage. GREATEST: a renewal that began earlier may commit later.
STAMP_CLOCK = """
    clock AS (
        UPDATE cluster_clock
           SET outage_ended_at = CASE
                   WHEN renewed_at < now() - make_interval(secs => :ttl) THEN now()
                   ELSE outage_ended_at END,
               renewed_at = GREATEST(renewed_at, now())
         WHERE id = 1
    )"""
