"""Table definitions (the one source of truth) and Alembic migrations."""
