"""Schema migrations through Alembic: upgrade, downgrade, current, heads.

Upgrades take a PostgreSQL advisory lock, so several servers (or compose replicas) may
run ``sparkring db upgrade`` at once: one migrates, the others wait and find nothing to
do. Each migration runs in its own transaction.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# Any constant shared by every sparkring process; "sparkring" as 8 bytes.
ADVISORY_LOCK_KEY = 0x737061726B72696E


def config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def heads() -> list[str]:
    return list(ScriptDirectory.from_config(config()).get_heads())


def history() -> list[str]:
    """Every revision id, oldest first (the project keeps a single line of history)."""
    script = ScriptDirectory.from_config(config())
    return [revision.revision for revision in reversed(list(script.walk_revisions()))]


def current(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def _locked(engine: Engine, action) -> None:
    with engine.connect() as connection:
        connection.execute(sa.select(sa.func.pg_advisory_lock(ADVISORY_LOCK_KEY)))
        connection.commit()
        try:
            action(config(connection))
        finally:
            connection.execute(sa.select(sa.func.pg_advisory_unlock(ADVISORY_LOCK_KEY)))
            connection.commit()


def upgrade(engine: Engine, revision: str = "head") -> None:
    _locked(engine, lambda cfg: command.upgrade(cfg, revision))


def downgrade(engine: Engine, revision: str) -> None:
    _locked(engine, lambda cfg: command.downgrade(cfg, revision))
