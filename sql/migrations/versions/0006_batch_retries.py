"""batch retries: a batch job's max_restarts is now its retry budget

Until this revision a batch driver's first failure was terminal and ``max_restarts``
(3 by default) applied to streaming jobs only. It now spends the same budget for batch
jobs (``job create --max-retries``, default 0). Batch jobs created before keep the
behaviour they had: their budget is set to 0 (retry none), so an upgrade never starts
running a failed batch again. Data only; the schema does not change. During a rolling
upgrade a batch job created by a CLI or API of the previous release gets that
release's default (3) and is retried under servers of this one: set its budget again
(delete and create) if that matters.

Revision ID: 0006_batch_retries
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


# Rows per transaction: a claim locks its job row (FOR SHARE) and must not wait long.
BATCH_ROWS = 1000
_ONE_BATCH = sa.text(
    """
    UPDATE jobs SET max_restarts = 0
     WHERE id IN (SELECT id FROM jobs WHERE kind = 'batch' AND max_restarts <> 0
                   ORDER BY id LIMIT :rows)
    """
)


def upgrade() -> None:
    # Batched, each batch committed (docs/upgrade.md, rule 2); idempotent: it only
    # touches batch jobs whose budget is not 0 yet.
    with op.get_context().autocommit_block():
        while op.get_bind().execute(_ONE_BATCH, {"rows": BATCH_ROWS}).rowcount:
            pass


def downgrade() -> None:
    # Nothing to undo: code before this revision ignores a batch job's max_restarts.
    pass
