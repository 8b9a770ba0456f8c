"""Alembic migrations rebuild exactly the schema declared in sql/tables.py."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from sql import migrate, tables


def test_exactly_one_head() -> None:
    assert len(migrate.heads()) == 1


def test_declared_tables_match_migrated_schema(engine: sa.Engine) -> None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, tables.metadata)
    assert differences == []


def test_upgrade_head_on_empty_database(engine: sa.Engine) -> None:
    migrate.downgrade(engine, "base")
    assert migrate.current(engine) is None
    assert "jobs" not in sa.inspect(engine).get_table_names()
    migrate.upgrade(engine)
    assert migrate.current(engine) == migrate.heads()[0]
    assert set(tables.metadata.tables) <= set(sa.inspect(engine).get_table_names())


def _insert_rows(engine: sa.Engine) -> None:
    with engine.begin() as connection:
        resource_id = connection.execute(
            sa.insert(tables.resources)
            .values(
                name="etl",
                version=1,
                sha256="a" * 64,
                size=3,
                object_key="sha256/" + "a" * 64,
                filename="etl.py",
            )
            .returning(tables.resources.c.id)
        ).scalar_one()
        job_id = connection.execute(
            sa.insert(tables.jobs)
            .values(name="etl-job", kind="batch", resource_id=resource_id, max_restarts=3)
            .returning(tables.jobs.c.id)
        ).scalar_one()
        connection.execute(sa.insert(tables.distribution).values(job_id=job_id))


def test_downgrade_to_base_and_upgrade_again_with_rows_present(engine: sa.Engine) -> None:
    _insert_rows(engine)
    migrate.downgrade(engine, "base")
    assert (
        sa.inspect(engine).get_table_names() == ["alembic_version"]
        or not sa.inspect(engine).get_table_names()
    )
    migrate.upgrade(engine)
    _insert_rows(engine)
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(tables.jobs)).scalar() == 1
        assert connection.execute(sa.select(tables.coordinator.c.term)).scalar_one() == 0


def test_upgrade_is_idempotent(engine: sa.Engine) -> None:
    migrate.upgrade(engine)
    migrate.upgrade(engine)
    assert migrate.current(engine) == migrate.heads()[0]


def test_constraints_reject_bad_rows(engine: sa.Engine) -> None:
    _insert_rows(engine)
    bad_statements = [
        "UPDATE distribution SET owner = 'a'",  # an owner without a lease
        "UPDATE distribution SET state = 'exploded'",
        "UPDATE jobs SET kind = 'interactive'",
        "UPDATE jobs SET conf = '[]'::jsonb",
        "DELETE FROM resources",  # referenced by a job
        "UPDATE distribution SET target = 'no spaces allowed'",
    ]
    for statement in bad_statements:
        with engine.connect() as connection:
            try:
                connection.execute(sa.text(statement))
            except sa.exc.IntegrityError:
                continue
            raise AssertionError(f"accepted: {statement}")


def test_event_kinds_are_declared_once_and_guarded(engine: sa.Engine) -> None:
    """job_events.kind accepts exactly sql.states.EventKind: a kind added to the
    enum without a migration that widens the CHECK fails here, not in production."""
    import importlib

    from sql import states

    latest = importlib.import_module("sql.migrations.versions.0014_auto_rollback")
    assert set(latest.KINDS) == {kind.value for kind in states.EventKind}
    with engine.begin() as connection:
        for kind in states.EventKind:
            connection.execute(
                sa.insert(tables.job_events).values(job_id=1, job_name="j", kind=kind.value)
            )
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
        connection.execute(
            sa.insert(tables.job_events).values(job_id=1, job_name="j", kind="claimd")
        )


def test_batch_jobs_created_before_batch_retries_keep_retrying_none(engine: sa.Engine) -> None:
    """0006: batch jobs made when a batch failure was terminal (max_restarts 3 shown,
    never used) get a budget of 0, so an upgrade never reruns a failed batch; streaming
    jobs keep theirs."""
    migrate.downgrade(engine, "0005")
    _insert_rows(engine)  # etl-job: batch, max_restarts 3
    with engine.begin() as connection:
        resource_id = connection.execute(sa.select(tables.resources.c.id)).scalar_one()
        connection.execute(
            sa.insert(tables.jobs).values(
                name="stream", kind="streaming", resource_id=resource_id, max_restarts=3
            )
        )
    migrate.upgrade(engine)
    with engine.connect() as connection:
        query = sa.select(tables.jobs.c.name, tables.jobs.c.max_restarts)
        budgets = {name: budget for name, budget in connection.execute(query)}
    assert budgets == {"etl-job": 0, "stream": 3}


def test_upgrade_to_revisions_makes_each_existing_job_its_own_revision_1(
    engine: sa.Engine,
) -> None:
    """0007 on a database with jobs: each job's definition as it stands becomes revision
    1 (py-files in order), a job that has been claimed ran revision 1, and the jobs can
    be revised afterwards."""
    from scheduler import job_revisions, job_spec, job_views

    migrate.downgrade(engine, "0005")
    with engine.begin() as connection:
        ids = {}
        for name, digit in (("main", "a"), ("lib", "b"), ("lib2", "c")):
            ids[name] = connection.execute(
                sa.text(
                    "INSERT INTO resources (name, version, sha256, size, object_key, filename) "
                    "VALUES (:n, 1, :h, 3, :k, :f) RETURNING id"
                ),
                {"n": name, "h": digit * 64, "k": f"sha256/{name}", "f": f"{name}.py"},
            ).scalar_one()
        jobs_made = {}
        for name, epoch in (("ran", 4), ("never-ran", 0)):
            job_id = connection.execute(
                sa.text(
                    "INSERT INTO jobs (name, kind, resource_id, conf, args, spark_master, "
                    "max_restarts) VALUES (:n, 'streaming', :r, '{\"spark.x\": \"1\"}', "
                    "'[\"--a\"]', 'local[1]', 5) RETURNING id"
                ),
                {"n": name, "r": ids["main"]},
            ).scalar_one()
            connection.execute(
                sa.text("INSERT INTO distribution (job_id, epoch) VALUES (:j, :e)"),
                {"j": job_id, "e": epoch},
            )
            jobs_made[name] = job_id
        connection.execute(
            sa.text(
                "INSERT INTO job_py_files (job_id, position, resource_id) VALUES "
                "(:j, 0, :b), (:j, 1, :a)"
            ),
            {"j": jobs_made["ran"], "a": ids["lib"], "b": ids["lib2"]},
        )
    migrate.upgrade(engine)
    with engine.connect() as connection:
        history = job_revisions.history(connection, "ran")
        assert [(h["revision"], h["current"]) for h in history] == [(1, True)]
        (first,) = history
        assert first["resource"]["name"] == "main"
        assert [r["name"] for r in first["py_files"]] == ["lib2", "lib"]
        assert (first["conf"], first["args"], first["spark_master"], first["max_restarts"]) == (
            {"spark.x": "1"},
            ["--a"],
            "local[1]",
            5,
        )
        assert len(job_revisions.history(connection, "never-ran")) == 1
        shown = {n: job_views.show(connection, n).as_json() for n in ("ran", "never-ran")}
        assert [(s["revision"], s["run_revision"]) for s in shown.values()] == [(1, 1), (1, None)]
    with engine.begin() as connection:
        revised = job_revisions.update(connection, "ran", job_spec.Change(unset_conf=["spark.x"]))
    assert (revised.revision, revised.changed) == (2, ("conf",))
    # And back down: the revisions and their events go, the jobs stay.
    migrate.downgrade(engine, "0005")
    assert "job_revisions" not in sa.inspect(engine).get_table_names()
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one() == 2


def _job_events_at_index(engine: sa.Engine) -> list[tuple[str, bool]]:
    with engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(
                sa.text(
                    "SELECT c.relname, i.indisvalid FROM pg_index i "
                    "JOIN pg_class c ON c.oid = i.indexrelid "
                    "WHERE c.relname = 'ix_job_events_at'"
                )
            )
        ]


def test_history_index_comes_and_goes_with_0008_and_events_stay(engine: sa.Engine) -> None:
    """0008 adds ix_job_events_at (the retention scan, server/retention.py); a
    downgrade drops it and keeps the events."""
    assert _job_events_at_index(engine) == [("ix_job_events_at", True)]
    with engine.begin() as connection:
        connection.execute(
            sa.text("INSERT INTO job_events (job_id, job_name, kind) VALUES (1, 'j', 'created')")
        )
    migrate.downgrade(engine, "0007")
    assert _job_events_at_index(engine) == []
    migrate.upgrade(engine)
    assert migrate.current(engine) == migrate.heads()[0]
    assert _job_events_at_index(engine) == [("ix_job_events_at", True)]
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM job_events")).scalar_one() == 1


def test_audit_actions_are_declared_once_and_guarded(engine: sa.Engine) -> None:
    """audit_events.action accepts exactly scheduler.audit.Action (as tables.AUDIT_ACTIONS
    and the latest migration that sets them, 0019, declare them)."""
    import importlib

    from scheduler import audit

    latest = importlib.import_module("sql.migrations.versions.0019_job_env_and_secrets")
    assert set(latest.AUDIT_ACTIONS) == set(tables.AUDIT_ACTIONS) == {a.value for a in audit.Action}
    with engine.begin() as connection:
        for action in audit.Action:
            audit.record(connection, "cli:test (claimed)", action, "x")
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
        connection.execute(
            sa.insert(tables.audit_events).values(actor="a", action="job_eaten", subject="x")
        )


def test_0013_down_drops_the_alert_audit_rows_and_keeps_the_others(engine: sa.Engine) -> None:
    from scheduler import audit

    with engine.begin() as connection:
        audit.record(connection, "cli:a (claimed)", audit.Action.TOKEN_CREATED, "t")
        audit.record(connection, "cli:a (claimed)", audit.Action.ALERT_CREATED, "pager")
    migrate.downgrade(engine, "0012")
    with engine.connect() as connection:
        actions = connection.execute(sa.text("SELECT action FROM audit_events")).scalars().all()
    assert actions == ["token_created"]
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as connection:
        connection.execute(
            sa.insert(tables.audit_events).values(actor="a", action="alert_created", subject="x")
        )
    migrate.upgrade(engine)
    with engine.begin() as connection:
        audit.record(connection, "cli:a (claimed)", audit.Action.ALERT_DELETED, "pager")


def test_tokens_made_before_expiry_keep_working_and_never_expire(engine: sa.Engine) -> None:
    """0010 on a database with tokens: they authenticate as before (no expiry) and can
    be listed with their last use; back down to 0009 they still authenticate."""
    from scheduler import tokens

    migrate.downgrade(engine, "0009")
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO api_tokens (name, role, token_sha256) VALUES ('old', 'viewer', :h)"
            ),
            {"h": tokens.digest("srt_old")},
        )
    migrate.upgrade(engine)
    with engine.begin() as connection:
        assert tokens.authenticate(connection, "srt_old") == tokens.Principal("old", "viewer")
        (row,) = tokens.list_tokens(connection)
    assert row["expires_at"] is None and row["last_used_at"] is not None
    migrate.downgrade(engine, "0009")
    assert "audit_events" not in sa.inspect(engine).get_table_names()
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT name FROM api_tokens")).scalar_one() == "old"


def test_0014_round_trip_with_a_watch_and_a_rolled_back_event(engine: sa.Engine) -> None:
    """Down to 0013 with a job under an auto-rollback watch and a rolled_back event:
    the columns and the event go, the job stays; up again, it has the setting's
    defaults (off, 300 s) and no watch."""
    from testing import factories

    job_id = factories.job(engine, "watched")
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "UPDATE jobs SET auto_rollback = true, watch_revision = 1, watch_fallback = 1, "
                "watch_since = now(), watch_until = now() WHERE id = :j"
            ),
            {"j": job_id},
        )
        connection.execute(
            sa.insert(tables.job_events).values(job_id=job_id, job_name="w", kind="rolled_back")
        )
    migrate.downgrade(engine, "0013")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
    assert "auto_rollback" not in columns and "watch_until" not in columns
    migrate.upgrade(engine)
    with engine.connect() as connection:
        row = connection.execute(
            sa.text("SELECT auto_rollback, healthy_within_s, watch_revision FROM jobs")
        ).one()
        kinds = connection.execute(sa.text("SELECT kind FROM job_events")).scalars().all()
    assert tuple(row) == (False, 300.0, None)
    assert "rolled_back" not in kinds


def test_0015_round_trip_with_a_warm_hand_off_offered(engine: sa.Engine) -> None:
    """Down to 0014 with a warm hand-off offered and marked ready: the two columns go,
    the row stays; up again, neither is set (the move is cold, as a server of 0014's
    release would have made it)."""
    from testing import factories

    job_id = factories.job(engine, "warm")
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "UPDATE distribution SET handoff_epoch = 1, warm_ready_epoch = 1 WHERE job_id = :j"
            ),
            {"j": job_id},
        )
    migrate.downgrade(engine, "0014")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("distribution")}
    assert "handoff_epoch" not in columns and "warm_ready_epoch" not in columns
    migrate.upgrade(engine)
    with engine.connect() as connection:
        row = connection.execute(
            sa.text("SELECT handoff_epoch, warm_ready_epoch FROM distribution WHERE job_id = :j"),
            {"j": job_id},
        ).one()
    assert tuple(row) == (None, None)


def test_0016_round_trip_with_a_reaped_row(engine: sa.Engine) -> None:
    """Down to 0015 with a row reaped from s1: the column goes, the row stays; up again
    it is empty (a late outcome is refused, as a server of 0015's release did)."""
    from testing import factories

    job_id = factories.job(engine, "reaped")
    with engine.begin() as connection:
        connection.execute(
            sa.text("UPDATE distribution SET reaped_from = 's1' WHERE job_id = :j"), {"j": job_id}
        )
    migrate.downgrade(engine, "0015")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("distribution")}
    assert "reaped_from" not in columns
    migrate.upgrade(engine)
    with engine.connect() as connection:
        value = connection.execute(
            sa.text("SELECT reaped_from FROM distribution WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()
    assert value is None
