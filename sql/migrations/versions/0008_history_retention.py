"""history retention: an index on job_events(at), so a prune finds old events cheaply

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24

``sparkring events prune`` and the servers' hourly retention pass
(``server/retention.py``) look for events older than a cutoff; without an index on
``at`` each pass would read the whole table, which only grows until it is pruned.

The index is built ``CONCURRENTLY``, in an autocommit block (``CREATE INDEX
CONCURRENTLY`` cannot run inside a transaction): writers of ``job_events`` (every
claim, renewal outcome and command appends an event) are never blocked while it is
built on a large table. The price is that this migration is not one transaction, unlike
the others: if the build fails (a lock timeout, a cancelled run), PostgreSQL leaves an
INVALID index and ``alembic_version`` stays at 0007; running ``sparkring db upgrade``
again drops that index and builds it anew. The build waits for transactions already
open on this database to end, so it finishes only once long transactions have.

Expand only: servers of the previous release do not use the index. Downgrade drops it
(concurrently too); no data is lost either way.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

INDEX = "ix_job_events_at"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        # An INVALID index left by a build that failed half-way: drop it, build again.
        invalid = (
            op.get_bind()
            .execute(
                sa.text(
                    "SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"
                ),
                {"name": INDEX},
            )
            .scalar()
        )
        if invalid:
            op.drop_index(INDEX, table_name="job_events", postgresql_concurrently=True)
        op.create_index(
            INDEX,
            "job_events",
            ["at"],
            unique=False,
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(INDEX, table_name="job_events", postgresql_concurrently=True, if_exists=True)
