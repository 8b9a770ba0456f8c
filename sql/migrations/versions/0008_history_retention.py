"""history retention: an index on job_events(at), so a prune finds old events cheaply

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24

``sparkring events prune`` and the servers' hourly retention pass
(``server/retention.py``) look for events older than a cutoff; without an index on
``at`` a pass with nothing to delete would read the whole table.

A plain ``CREATE INDEX``, inside this migration's transaction, not ``CONCURRENTLY``:
``sparkring db upgrade`` run from several processes at once queues them on an advisory
lock (``sql/migrate.py``), and each queued process waits inside a statement, holding a
snapshot. ``CREATE INDEX CONCURRENTLY`` waits for every transaction holding an older
snapshot to end, so it waits for the queued upgrades while they wait for its lock:
PostgreSQL reports a deadlock and the upgrade fails (seen in
``tests/integration/test_upgrade.py::test_concurrent_upgrades_from_several_processes``). The plain
build keeps the migration one transaction (a failure rolls it back whole) and blocks
writes of job events while it runs: about 0.4 s per million events on the development
machine. Lease renewals write no event and go on; a claim or a state change that
waits longer than the servers' ``SPARKRING_DB_LOCK_TIMEOUT`` fails and is retried.

Expand only: servers of the previous release do not use the index. Downgrade drops it;
no data is lost either way.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_job_events_at", "job_events", ["at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_events_at", table_name="job_events")
