"""Upgrading a live database: ``sparkring db upgrade`` from several processes at once, and
rows written under each revision surviving the upgrade to head (and a rollback).

Seeds are plain SQL written against one revision's tables, keyed by the revision that
introduced their form; a revision without its own seed uses the newest earlier one.
That is the expand/contract rule of docs/upgrade.md made executable: until a migration
contracts (drops or renames what an older seed uses), code of the previous revision
must still be able to write, so its seed must still insert. A contracting migration
adds a seed for its revision here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from sql import database, migrate
from testing import waiting

SPARKRING = [sys.executable, "-m", "server"]
SHA_A, SHA_B = "a" * 64, "b" * 64


@dataclass(frozen=True)
class Seed:
    """Rows valid under one revision, and the queries that read them back."""

    statements: tuple[str, ...]  # may use {suffix}, so one seed can be written twice
    checks: tuple[str, ...]


SEEDS: dict[str, Seed] = {
    "0001": Seed(
        statements=(
            f"""INSERT INTO resources (name, version, sha256, size, object_key, filename)
                VALUES ('etl{{suffix}}', 1, '{SHA_A}', 3, 'sha256/{SHA_A}', 'etl.py'),
                       ('lib{{suffix}}', 2, '{SHA_B}', 5, 'sha256/{SHA_B}', 'lib.zip')""",
            """INSERT INTO jobs (name, kind, resource_id, conf, args, desired, max_restarts,
                                 generation)
               SELECT 'stream{suffix}', 'streaming', id, '{{"spark.cores.max": "1"}}',
                      '["--day", "1"]', 'running', 3, 2
               FROM resources WHERE name = 'etl{suffix}' AND version = 1""",
            """INSERT INTO job_py_files (job_id, position, resource_id)
               SELECT j.id, 0, r.id FROM jobs j, resources r
               WHERE j.name = 'stream{suffix}' AND r.name = 'lib{suffix}'""",
            """INSERT INTO distribution (job_id, target, owner, epoch, lease_until, state,
                                         attempt, restarts, generation, started_at)
               SELECT id, 'server-a', 'server-a', 7, now() + interval '1 hour', 'running',
                      2, 1, 2, now()
               FROM jobs WHERE name = 'stream{suffix}'""",
            """INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail)
               SELECT id, name, 'driver_started', 'server-a', 7, '{{"pid": 2}}'
               FROM jobs WHERE name = 'stream{suffix}'""",
            """UPDATE coordinator SET term = term + 5, server = 'server-a',
                                      ring_generation = ring_generation + 9
               WHERE id = 1""",
        ),
        checks=(
            """SELECT name, version, sha256, size, object_key, filename, created_at
               FROM resources ORDER BY name, version""",
            """SELECT j.name, j.kind, r.name, r.version, j.conf, j.args, j.desired,
                      j.max_restarts, j.generation, j.created_at
               FROM jobs j JOIN resources r ON r.id = j.resource_id ORDER BY j.name""",
            """SELECT j.name, p.position, r.name FROM job_py_files p
               JOIN jobs j ON j.id = p.job_id JOIN resources r ON r.id = p.resource_id
               ORDER BY j.name, p.position""",
            """SELECT j.name, d.target, d.owner, d.epoch, d.lease_until, d.state, d.attempt,
                      d.restarts, d.generation, d.started_at
               FROM distribution d JOIN jobs j ON j.id = d.job_id ORDER BY j.name""",
            """SELECT job_name, kind, server, epoch, detail FROM job_events ORDER BY id""",
            """SELECT term, server, ring_generation FROM coordinator""",
        ),
    ),
}


def seed_for(revision: str) -> Seed:
    """The seed of ``revision``, or of the newest earlier revision that has one."""
    history = migrate.history()
    for candidate in reversed(history[: history.index(revision) + 1]):
        if candidate in SEEDS:
            return SEEDS[candidate]
    raise AssertionError(f"no seed at or before revision {revision}")


def _write(engine: sa.Engine, seed: Seed, suffix: str) -> None:
    with engine.begin() as connection:
        for statement in seed.statements:
            result = connection.execute(sa.text(statement.format(suffix=suffix)))
            # A seed statement that matches nothing would make the test vacuous.
            assert result.rowcount > 0, statement


def _snapshot(engine: sa.Engine, seed: Seed) -> list[list[tuple[Any, ...]]]:
    with engine.connect() as connection:
        return [[tuple(row) for row in connection.execute(sa.text(q))] for q in seed.checks]


def test_every_revision_has_a_seed() -> None:
    for revision in migrate.history():
        assert seed_for(revision).statements


@pytest.mark.parametrize("revision", migrate.history())
def test_rows_written_at_a_revision_survive_upgrade_and_rollback(
    engine: sa.Engine, revision: str
) -> None:
    history, head = migrate.history(), migrate.heads()[0]
    migrate.downgrade(engine, revision)
    assert migrate.current(engine) == revision
    seed = seed_for(revision)
    _write(engine, seed, suffix="")
    before = _snapshot(engine, seed)
    assert all(before), "every check query reads back a seeded row"

    migrate.upgrade(engine)
    assert migrate.current(engine) == head
    assert _snapshot(engine, seed) == before

    # Rollback to the revision the rows were written at keeps them too.
    migrate.downgrade(engine, revision)
    assert migrate.current(engine) == revision
    assert _snapshot(engine, seed) == before
    migrate.upgrade(engine)
    assert _snapshot(engine, seed) == before

    # Rolling upgrade: servers of the previous release still write while the schema is
    # already at head, so the previous revision's writes must still be accepted.
    if revision in history[-2:]:
        _write(engine, seed, suffix="-old-code")
        after = _snapshot(engine, seed)
        grown = [
            len(rows_after) - len(rows) for rows_after, rows in zip(after, before, strict=True)
        ]
        assert min(grown) >= 0 and grown[0] == len(before[0]), grown


def _waiting_for_the_migration_lock(engine: sa.Engine) -> int:
    with engine.connect() as connection:
        return connection.execute(
            sa.text(
                """SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
                   WHERE l.locktype = 'advisory' AND NOT l.granted
                     AND d.datname = current_database()
                     AND l.classid = CAST(:high AS oid) AND l.objid = CAST(:low AS oid)"""
            ),
            {
                "high": migrate.ADVISORY_LOCK_KEY >> 32,
                "low": migrate.ADVISORY_LOCK_KEY & 0xFFFFFFFF,
            },
        ).scalar_one()


def test_concurrent_upgrades_from_several_processes(
    stack_env: dict[str, str], database_url: str
) -> None:
    engine = database.create_engine(database_url, pool_size=2)
    head = migrate.heads()[0]
    migrate.downgrade(engine, "base")
    assert migrate.current(engine) is None
    env = {**os.environ, **stack_env, "SPARKRING_DATABASE_URL": database_url}
    processes: list[subprocess.Popen[str]] = []
    try:
        # Hold the migration lock while three upgrades start, so that all three are
        # provably queued on it at once when it is released (a real race, every run).
        with engine.connect() as holder:
            holder.execute(sa.select(sa.func.pg_advisory_lock(migrate.ADVISORY_LOCK_KEY)))
            holder.commit()
            for _ in range(3):
                processes.append(
                    subprocess.Popen(
                        [*SPARKRING, "db", "upgrade"],
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )

            def all_queued() -> bool:
                exited = [p for p in processes if p.poll() is not None]
                assert not exited, f"an upgrade exited early: {exited[0].communicate()}"
                return _waiting_for_the_migration_lock(engine) == 3

            waiting.wait_until(
                all_queued, timeout=60, interval=0.1, message="3 upgrades waiting on the lock"
            )
            holder.execute(sa.select(sa.func.pg_advisory_unlock(migrate.ADVISORY_LOCK_KEY)))
            holder.commit()
        results = [(p.wait(timeout=120), *p.communicate()) for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    for returncode, stdout, stderr in results:
        assert returncode == 0, stderr
        assert f"database at revision {head}" in stdout
    assert migrate.current(engine) == head
    with engine.connect() as connection:
        versions = connection.execute(sa.text("SELECT version_num FROM alembic_version")).all()
        assert versions == [(head,)]
        assert connection.execute(sa.text("SELECT count(*) FROM coordinator")).scalar() == 1
    engine.dispose()
