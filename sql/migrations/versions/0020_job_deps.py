"""jobs.deps_id and job_revisions.deps_id: a job's Python dependencies

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28

A job may carry the packages its driver and executors import, built from a requirements
file into a zip artifact of the resource center (``resource_center/deps.py``); like its
main artifact, a version pinned per revision, undeletable while a revision names it.

Expand only: a server of the previous release neither reads nor writes the column (it
starts the driver without the packages: a job given dependencies needs the new release
on every server).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("jobs", "job_revisions"):
        op.add_column(
            table,
            sa.Column(
                "deps_id",
                sa.BigInteger,
                sa.ForeignKey(
                    "resources.id", ondelete="RESTRICT", name=op.f(f"fk_{table}_deps_id_resources")
                ),
                nullable=True,
            ),
        )


def downgrade() -> None:
    for table in ("jobs", "job_revisions"):
        op.drop_column(table, "deps_id")
