"""Does PostgreSQL commit synchronously to a standby? What a server says about it at start.

A failover to a standby that had not received the last commits loses them: the new
primary may hand a job's epoch to a second server while the first one's driver still
runs, and fencing by epoch cannot see it. Only synchronous replication
(``synchronous_standby_names`` and ``synchronous_commit`` ``on``, ``remote_write`` or
``remote_apply``) makes a failover lose nothing acknowledged. docs/deployment.md,
"PostgreSQL with a standby", says what to configure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa

# synchronous_commit values that wait for the standbys of synchronous_standby_names.
WAITING = frozenset({"on", "remote_write", "remote_apply"})
DOC = "docs/deployment.md, 'PostgreSQL with a standby'"


@dataclass(frozen=True)
class Replication:
    """What a session of the primary sees of its replication."""

    synchronous_commit: str
    standby_names: str  # synchronous_standby_names; empty: commits wait for no standby
    standbys: int  # standbys streaming from it now (pg_stat_replication)
    sync_standbys: int  # of those, the ones it waits for (0 when the role cannot see)

    @property
    def synchronous(self) -> bool:
        return bool(self.standby_names.strip()) and self.synchronous_commit in WAITING

    def verdict(self, listed_hosts: int) -> tuple[int, str]:
        """A log level and one line for it; ``listed_hosts`` is how many hosts the
        database URL lists (more than one: the operator expects failovers)."""
        settings = (
            f"synchronous_standby_names={self.standby_names!r}, "
            f"synchronous_commit={self.synchronous_commit}"
        )
        if self.synchronous and self.standbys == 0:
            return logging.WARNING, (
                f"PostgreSQL waits for a synchronous standby that is not connected ({settings}): "
                "every commit blocks until one is"
            )
        if self.synchronous:
            return logging.INFO, (
                f"PostgreSQL commits wait for a synchronous standby ({settings}): a failover to "
                "it loses no claim"
            )
        if self.standbys or listed_hosts > 1:
            return logging.WARNING, (
                f"PostgreSQL replicates asynchronously ({self.standbys} standby(s), {settings}): "
                "a failover may lose the last committed claims and run a job twice; make "
                f"replication synchronous ({DOC})"
            )
        return logging.INFO, (
            "PostgreSQL has no standby: a crash or restart of it is covered, a failover is not "
            f"({DOC})"
        )


def inspect(conn: sa.Connection) -> Replication:
    row = conn.execute(
        sa.text(
            "SELECT current_setting('synchronous_commit') AS commit,"
            " current_setting('synchronous_standby_names') AS names,"
            " (SELECT count(*) FROM pg_stat_replication) AS standbys,"
            " (SELECT count(*) FROM pg_stat_replication"
            "   WHERE sync_state IN ('sync', 'quorum')) AS sync_standbys"
        )
    ).one()
    return Replication(row.commit, row.names, int(row.standbys), int(row.sync_standbys))
