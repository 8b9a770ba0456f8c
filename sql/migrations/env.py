"""Alembic environment: runs on the connection sql/migrate.py hands over."""

from __future__ import annotations

from alembic import context

from sql import tables

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through 'sparkring db ...' (sql/migrate.py)")

context.configure(
    connection=connection,
    target_metadata=tables.metadata,
    transaction_per_migration=True,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
connection.commit()
