"""batch retries: a batch job's max_restarts is now its retry budget

Until this revision a batch driver's first failure was terminal and ``max_restarts``
(3 by default) applied to streaming jobs only. It now spends the same budget for batch
jobs (``job create --max-retries``, default 0). Batch jobs created before keep the
behaviour they had: their budget is set to 0 (retry none), so an upgrade never starts
running a failed batch again. Data only; the schema does not change.

Revision ID: 0006_batch_retries
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0006_batch_retries"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE jobs SET max_restarts = 0 WHERE kind = 'batch' AND max_restarts <> 0")


def downgrade() -> None:
    # Nothing to undo: code before this revision ignores a batch job's max_restarts.
    pass
