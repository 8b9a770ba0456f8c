"""Job revisions on the real PostgreSQL: update, history, rollback, no-ops, bad input,
and what a new revision does to a live run (roll, keep, next start)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from resource_center import catalog, errors
from scheduler import distribution, job_events, job_revisions, job_spec, job_views, jobs
from server import reconcile
from sql import tables
from sql.states import JobKind
from testing import factories
from testing.factories import owner

S1 = owner("s1")


def _update(
    engine: sa.Engine, name: str, change: job_spec.Change, **kw: object
) -> job_revisions.Revised:
    with engine.begin() as conn:
        return job_revisions.update(conn, name, change, **kw)


def _rollback(
    engine: sa.Engine, name: str, to: int | None = None, **kw: object
) -> job_revisions.Revised:
    with engine.begin() as conn:
        return job_revisions.rollback(conn, name, to, **kw)


def _history(engine: sa.Engine, name: str) -> list[dict]:
    with engine.connect() as conn:
        return job_revisions.history(conn, name)


def _show(engine: sa.Engine, name: str) -> dict:
    with engine.connect() as conn:
        return job_views.show(conn, name).as_json()


def _counts(engine: sa.Engine) -> tuple[int, int, int]:
    """Revisions, their py-files and events: what a refused command must not add to."""
    with engine.connect() as conn:
        return tuple(
            conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            for table in (tables.job_revisions, tables.job_revision_py_files, tables.job_events)
        )


def _new_resource(engine: sa.Engine, name: str = "app") -> int:
    with engine.begin() as conn:
        return factories.resource(conn, name, content=f"print({name!r})\n".encode())


def _running(engine: sa.Engine, job_id: int) -> distribution.Claim:
    """Claim the job as s1 and record its driver running."""
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, S1, 10)
        distribution.mark_running(conn, job_id, S1, claim.epoch, pid=1)
    return claim


def test_create_is_revision_1_and_show_names_the_current_revision(engine: sa.Engine) -> None:
    factories.job(engine, "etl", start=False)
    shown = _show(engine, "etl")
    assert (shown["revision"], shown["run_revision"]) == (1, None)
    (first,) = _history(engine, "etl")
    assert (first["revision"], first["current"], first["running"], first["diff"]) == (
        1,
        True,
        False,
        [],
    )
    assert first["resource"]["id"] == shown["resource"]["id"]


def test_update_makes_the_next_revision_with_a_field_diff(engine: sa.Engine) -> None:
    factories.job(engine, "etl", start=False)
    lib = _new_resource(engine, "lib")
    newer = _new_resource(engine, "app")  # app:2
    revised = _update(
        engine,
        "etl",
        job_spec.Change(
            resource_id=newer,
            py_file_ids=[lib],
            conf={"spark.sql.shuffle.partitions": "4"},
            args=["--day", "2026-11-23"],
            spark_master="local[1]",
            max_restarts=5,
        ),
        actor="cli:alice",
    )
    assert (revised.revision, revised.previous, revised.effect) == (
        2,
        1,
        job_revisions.Effect.AT_REST,
    )
    assert revised.changed == ("resource", "py_files", "conf", "args", "master", "max_restarts")
    shown = _show(engine, "etl")
    assert shown["revision"] == 2
    assert (shown["resource"]["name"], shown["resource"]["version"]) == ("app", 2)
    assert [p["name"] for p in shown["py_files"]] == ["lib"]
    assert (shown["conf"], shown["args"], shown["spark_master"], shown["max_restarts"]) == (
        {"spark.sql.shuffle.partitions": "4"},
        ["--day", "2026-11-23"],
        "local[1]",
        5,
    )
    first, second = _history(engine, "etl")
    assert (first["current"], second["current"], second["created_by"]) == (
        False,
        True,
        "cli:alice",
    )
    assert second["changed"] == list(revised.changed)
    assert second["diff"] == [
        "resource app:1 -> app:2",
        "py_files (none) -> lib:1",
        "conf spark.sql.shuffle.partitions='4' added",
        "args '' -> '--day 2026-11-23'",
        "master (server default) -> local[1]",
        "max_restarts 3 -> 5",
    ]
    # Conf is merged key by key; --unset-conf removes; "" master means the default again.
    third = _update(
        engine,
        "etl",
        job_spec.Change(conf={"spark.x": "1"}, unset_conf=["spark.sql.shuffle.partitions"]),
    )
    assert third.changed == ("conf",)
    assert _history(engine, "etl")[-1]["diff"] == [
        "conf spark.sql.shuffle.partitions unset (was '4')",
        "conf spark.x='1' added",
    ]
    fourth = _update(engine, "etl", job_spec.Change(spark_master="", py_file_ids=()))
    assert fourth.changed == ("py_files", "master")
    shown = _show(engine, "etl")
    assert (shown["spark_master"], shown["py_files"], shown["conf"]) == (
        None,
        [],
        {"spark.x": "1"},
    )
    with engine.connect() as conn:
        revised_events = [e for e in job_events.events(conn, "etl") if e["kind"] == "revised"]
    assert [e["detail"]["revision"] for e in revised_events] == [2, 3, 4]
    assert revised_events[0]["detail"]["by"] == "cli:alice"


def test_an_update_that_changes_nothing_is_a_noop(engine: sa.Engine) -> None:
    factories.job(engine, "etl", start=False)
    _update(engine, "etl", job_spec.Change(conf={"spark.x": "1"}))
    before = _counts(engine)
    shown = _show(engine, "etl")
    same = _update(
        engine,
        "etl",
        job_spec.Change(
            resource_id=shown["resource"]["id"], conf={"spark.x": "1"}, max_restarts=3, args=()
        ),
    )
    assert (same.revision, same.changed, same.effect) == (2, (), job_revisions.Effect.UNCHANGED)
    assert _update(engine, "etl", job_spec.Change()).effect is job_revisions.Effect.UNCHANGED
    assert _counts(engine) == before
    assert _show(engine, "etl")["updated_at"] == shown["updated_at"]


def test_bad_input_is_refused_and_nothing_is_written(engine: sa.Engine) -> None:
    factories.job(engine, "etl", start=False)
    before, shown = _counts(engine), _show(engine, "etl")
    refused = [
        (lambda: _update(engine, "nope", job_spec.Change(max_restarts=1)), "no job named 'nope'"),
        (
            lambda: _update(engine, "etl", job_spec.Change(unset_conf=["spark.nope"])),
            "conf key 'spark.nope' is not set",
        ),
        (
            lambda: _update(engine, "etl", job_spec.Change(conf={"a": "1"}, unset_conf=["a"])),
            "both set and unset",
        ),
        (lambda: _update(engine, "etl", job_spec.Change(max_restarts=-1)), "0 or more"),
        (lambda: _rollback(engine, "etl"), "only revision 1"),
        (lambda: _rollback(engine, "etl", 7), "has no revision 7"),
        (lambda: _rollback(engine, "nope", 1), "no job named 'nope'"),
    ]
    for command, message in refused:
        with pytest.raises(job_spec.JobError, match=message):
            command()
    with pytest.raises(job_spec.JobError, match="is not KEY=VALUE"):
        job_spec.parse_conf(["nokey"])
    # An artifact that does not exist is refused by name before any write.
    with pytest.raises(errors.UnknownResource):
        catalog.resolve(engine, "app:9")
    # The schema refuses a resource id that does not exist: the whole update rolls back.
    with pytest.raises(sa.exc.IntegrityError):
        _update(engine, "etl", job_spec.Change(resource_id=10**9))
    assert _counts(engine) == before
    assert _show(engine, "etl") == shown


def test_rollback_restores_an_earlier_revision_as_a_new_one(engine: sa.Engine) -> None:
    factories.job(engine, "etl", start=False)
    original = _show(engine, "etl")
    newer = _new_resource(engine)
    _update(engine, "etl", job_spec.Change(resource_id=newer, conf={"spark.x": "2"}))
    back = _rollback(engine, "etl", actor="cli:bob")
    assert (back.revision, back.previous, back.changed) == (3, 2, ("resource", "conf"))
    shown = _show(engine, "etl")
    assert (shown["resource"]["id"], shown["conf"]) == (original["resource"]["id"], {})
    third = _history(engine, "etl")[-1]
    assert (third["rollback_of"], third["created_by"]) == (1, "cli:bob")
    assert third["diff"] == ["resource app:2 -> app:1", "conf spark.x unset (was '2')"]
    # The default is the revision before the current one: 2 again.
    assert _rollback(engine, "etl").revision == 4
    assert _show(engine, "etl")["resource"]["id"] == newer
    # Rolling back to what is current changes nothing.
    assert _rollback(engine, "etl", to=2).effect is job_revisions.Effect.UNCHANGED


def test_every_revision_keeps_its_artifact_versions_pinned(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "etl", start=False)
    first = _show(engine, "etl")["resource"]["id"]
    lib = _new_resource(engine, "lib")
    _update(engine, "etl", job_spec.Change(resource_id=_new_resource(engine), py_file_ids=[lib]))
    _update(engine, "etl", job_spec.Change(py_file_ids=()))
    # Revision 1's main and revision 2's py-file are not current, yet undeletable.
    for rid in (first, lib):
        assert catalog.referencing_jobs(engine, catalog.get(engine, rid)) == ["etl"]
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(sa.delete(tables.resources).where(tables.resources.c.id == rid))
    with engine.connect() as conn:
        pinned = job_revisions.revision_definition(conn, job_id, 2)
        assert pinned is not None and [p["id"] for p in pinned["py_files"]] == [lib]
        assert job_revisions.revision_definition(conn, job_id, 9) is None


def test_a_running_streaming_job_rolls_to_the_new_revision(engine: sa.Engine) -> None:
    """A new revision bumps the generation: the owner stops its driver (the reason says
    why), releases the job, and the next claim (epoch + 1) starts the new revision,
    while the run claimed before keeps reading the revision it was claimed with."""
    job_id = factories.job(engine, "stream")
    claim = _running(engine, job_id)
    assert claim.revision == 1
    revised = _update(engine, "stream", job_spec.Change(args=["--v2"]))
    assert (revised.effect, revised.run_revision) == (job_revisions.Effect.ROLLING, 1)
    with engine.connect() as conn:
        (row,) = distribution.poll(conn, S1)
        pinned = job_revisions.revision_definition(conn, job_id, claim.revision)
    assert pinned is not None and pinned["args"] == []
    assert reconcile.stop_reason(row, "s1", may_migrate=True) == "rolling to revision 2"
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, S1, claim.epoch, "rolling to revision 2")
        distribution.release(conn, job_id, S1, claim.epoch)
        again = distribution.claim(conn, job_id, S1, 10)
    assert (again.epoch, again.revision) == (claim.epoch + 1, 2)
    shown = _show(engine, "stream")
    assert (shown["revision"], shown["run_revision"], shown["state"]) == (2, 2, "starting")
    assert [h["running"] for h in _history(engine, "stream")] == [False, True]


def test_a_streaming_job_not_running_takes_the_revision_at_its_next_claim(
    engine: sa.Engine,
) -> None:
    job_id = factories.job(engine, "stream", start=False)
    assert (
        _update(engine, "stream", job_spec.Change(args=["a"])).effect
        is job_revisions.Effect.AT_REST
    )
    with engine.begin() as conn:
        jobs.start(conn, "stream")
    # Pending, no owner: the generation moves on and the claim starts revision 3.
    assert (
        _update(engine, "stream", job_spec.Change(args=["b"])).effect
        is job_revisions.Effect.NEXT_CLAIM
    )
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        assert distribution.claim(conn, job_id, S1, 10).revision == 3


def test_a_running_batch_job_keeps_its_revision_until_its_next_run(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "nightly", kind=JobKind.BATCH)
    claim = _running(engine, job_id)
    revised = _update(engine, "nightly", job_spec.Change(args=["--v2"]))
    assert (revised.effect, revised.run_revision) == (job_revisions.Effect.KEPT, 1)
    with engine.connect() as conn:
        (row,) = distribution.poll(conn, S1)
    assert row.job_generation == row.generation
    assert reconcile.stop_reason(row, "s1", may_migrate=True) is None
    # Its owner lost, the same run is run again elsewhere: still revision 1.
    factories.expire_lease(engine, job_id)
    factories.target(engine, job_id, "s2")
    with engine.begin() as conn:
        rerun = distribution.claim(conn, job_id, owner("s2"), 10)
    assert (rerun.epoch, rerun.revision) == (claim.epoch + 1, 1)
    with engine.begin() as conn:
        distribution.mark_running(conn, job_id, owner("s2"), rerun.epoch, pid=2)
        distribution.finish(conn, job_id, owner("s2"), rerun.epoch)
        assert jobs.start(conn, "nightly") == "started"
        nxt = distribution.claim(conn, job_id, owner("s2"), 10)
    assert nxt.revision == 2


def test_update_with_restart_rolls_a_running_batch_job(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "nightly", kind=JobKind.BATCH)
    claim = _running(engine, job_id)
    revised = _update(engine, "nightly", job_spec.Change(args=["--v2"]), restart=True)
    assert revised.effect is job_revisions.Effect.ROLLING
    with engine.connect() as conn:
        (row,) = distribution.poll(conn, S1)
    assert reconcile.stop_reason(row, "s1", may_migrate=True) == "rolling to revision 2"
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, S1, claim.epoch, "rolling to revision 2")
        # A batch driver stopped for the roll is not finished: the new generation runs.
        assert distribution.release(conn, job_id, S1, claim.epoch) == "pending"
        assert distribution.claim(conn, job_id, S1, 10).revision == 2


def test_describe_changes_names_each_field() -> None:
    def revision(**changes: object) -> dict:
        base = {
            "resource": {"name": "app", "version": 1},
            "py_files": [],
            "conf": {"a": "1", "b": "2"},
            "args": ["x"],
            "spark_master": None,
            "max_restarts": 3,
        }
        return {**base, **changes}

    assert job_revisions.describe_changes(revision(), revision()) == []
    assert job_revisions.describe_changes(
        revision(),
        revision(
            py_files=[{"name": "lib", "version": 2}, {"name": "util", "version": 1}],
            conf={"a": "1", "b": "3", "c": "x y"},
            args=["x", "with space"],
        ),
    ) == [
        "py_files (none) -> lib:2,util:1",
        "conf b '2' -> '3'",
        "conf c='x y' added",
        "args 'x' -> \"x 'with space'\"",
    ]
