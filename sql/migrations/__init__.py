"""Alembic migrations of the sparkring schema (declared in sql/tables.py)."""
