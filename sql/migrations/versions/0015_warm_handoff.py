"""warm hand-off: the offer of a planned move, and the target's warm driver ready for it

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26

A planned move of a streaming job (a roll, a drain, a join's rebalance, ``ring
rebalance``) stops the old driver only once the next one is warm (docs/drivers.md,
"Warm hand-off"). Two columns of the distribution row carry it, each naming an epoch so
that the claim that ends the hand-off (epoch + 1) makes both stale without a write:

- ``handoff_epoch``: the owner of the run at this epoch offered a warm hand-off as it
  began its planned stop (``distribution.begin_stop(..., warm=True)``);
- ``warm_ready_epoch``: the target's warm driver for the hand-off of the run at this
  epoch has built its SparkSession (``distribution.mark_warm_ready``); the old owner
  stops its driver then, or after a bounded wait without it.

Expand only: a server of the previous release neither reads nor writes the columns (it
offers nothing and stops at once, the cold path; an offer it never sees is withdrawn by
the claim's epoch + 1).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

COLUMNS = ("handoff_epoch", "warm_ready_epoch")


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("distribution", sa.Column(column, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.drop_column("distribution", column)
