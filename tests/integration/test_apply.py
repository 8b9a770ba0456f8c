"""``sparkring apply`` over the real PostgreSQL and S3: the plan, idempotence, uploads of
new content only, revisions of changed jobs, prune, and invalid specs refused whole."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import catalog, store
from scheduler import job_revisions, job_spec, job_views, jobs
from server.cli import spec as apply
from sql import tables


def _write(folder: Path, text: str) -> Path:
    spec = folder / "jobs.toml"
    spec.write_text(textwrap.dedent(text))
    return spec


def _apply(
    engine: sa.Engine, bucket: store.Store, spec_file: Path, *, prune: bool = False
) -> list[apply.Step]:
    spec = apply.parse(spec_file)
    with engine.connect() as conn:
        steps = apply.plan(conn, spec, prune=prune)
    apply.execute(engine, bucket, spec, steps, max_bytes=1 << 20, actor="test", stop_timeout=5)
    return steps


def _plan(engine: sa.Engine, spec_file: Path, *, prune: bool = False) -> list[str]:
    spec = apply.parse(spec_file)
    with engine.connect() as conn:
        return [apply.describe(step) for step in apply.plan(conn, spec, prune=prune)]


def _resources(engine: sa.Engine) -> list[tuple[str, int]]:
    return [(r.name, r.version) for r in catalog.list_resources(engine)]


SPEC = """
    label = "team-a"

    [jobs.clicks]
    resource = "./clicks.py"
    conf = {{ "spark.sql.shuffle.partitions" = 4 }}
    args = ["--input", "/data/clicks"]

    [jobs.nightly]
    kind = "batch"
    resource = "lib:1"
    py_files = ["./helpers.py"]
    desired = "stopped"
    max_restarts = {max_restarts}
"""


@pytest.fixture
def folder(tmp_path: Path, engine: sa.Engine, bucket: store.Store) -> Path:
    (tmp_path / "clicks.py").write_text("print('clicks v1')\n")
    (tmp_path / "helpers.py").write_text("X = 1\n")
    lib = tmp_path / "lib.py"
    lib.write_text("print('lib')\n")
    catalog.upload(engine, bucket, name="lib", path=lib, max_bytes=1 << 20)
    return tmp_path


def test_apply_creates_then_changes_nothing_the_second_time(
    engine: sa.Engine, bucket: store.Store, folder: Path
) -> None:
    spec_file = _write(folder, SPEC.format(max_restarts=2))
    assert _plan(engine, spec_file) == [
        "create    clicks (streaming, clicks:new)",
        "create    nightly (batch, lib:1, stopped)",
    ]
    assert _resources(engine) == [("lib", 1)]  # a plan writes nothing
    _apply(engine, bucket, spec_file)
    with engine.connect() as conn:
        clicks, nightly = (
            job_views.show(conn, "clicks").as_json(),
            job_views.show(conn, "nightly").as_json(),
        )
    assert (clicks["desired"], clicks["label"], clicks["revision"]) == ("running", "team-a", 1)
    assert clicks["conf"] == {"spark.sql.shuffle.partitions": "4"}
    assert (nightly["desired"], nightly["max_restarts"]) == ("stopped", 2)
    assert [p["name"] for p in nightly["py_files"]] == ["helpers"]
    resources = _resources(engine)
    assert resources == [("clicks", 1), ("helpers", 1), ("lib", 1)]
    with engine.connect() as conn:
        events = conn.execute(sa.select(sa.func.count()).select_from(tables.job_events)).scalar()
    # Idempotent: the same file again plans and does nothing.
    assert _plan(engine, spec_file) == ["unchanged clicks", "unchanged nightly"]
    _apply(engine, bucket, spec_file)
    assert _resources(engine) == resources
    with engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(tables.job_events)).scalar()
            == events
        )


def test_a_changed_file_makes_a_revision_uploading_only_new_content(
    engine: sa.Engine, bucket: store.Store, folder: Path
) -> None:
    _apply(engine, bucket, _write(folder, SPEC.format(max_restarts=2)))
    (folder / "clicks.py").write_text("print('clicks v2')\n")
    spec_file = _write(folder, SPEC.format(max_restarts=5).replace("= 4", "= 8"))
    assert _plan(engine, spec_file) == [
        "update    clicks: resource clicks:1 -> clicks:new; "
        "conf spark.sql.shuffle.partitions '4' -> '8'",
        "update    nightly: max_restarts 2 -> 5",
    ]
    _apply(engine, bucket, spec_file)
    assert _resources(engine) == [("clicks", 1), ("clicks", 2), ("helpers", 1), ("lib", 1)]
    with engine.connect() as conn:
        history = job_revisions.history(conn, "clicks")
    assert [h["revision"] for h in history] == [1, 2]
    assert history[-1]["diff"] == [
        "resource clicks:1 -> clicks:2",
        "conf spark.sql.shuffle.partitions '4' -> '8'",
    ]
    # Back to the first content: its version is found by sha256, nothing is uploaded.
    (folder / "clicks.py").write_text("print('clicks v1')\n")
    assert _plan(engine, spec_file)[0] == ("update    clicks: resource clicks:2 -> clicks:1")
    _apply(engine, bucket, spec_file)
    assert len(_resources(engine)) == 4


def test_prune_deletes_the_jobs_of_the_label_no_longer_in_the_file(
    engine: sa.Engine, bucket: store.Store, folder: Path
) -> None:
    _apply(engine, bucket, _write(folder, SPEC.format(max_restarts=2)))
    with engine.begin() as conn:  # a job of no label: never pruned
        jobs.create(conn, job_spec.JobSpec("other", "batch", catalog.resolve(engine, "lib").id))
    only_clicks = _write(folder, SPEC.format(max_restarts=2).split("[jobs.nightly]")[0])
    assert _plan(engine, only_clicks) == ["unchanged clicks"]
    assert _plan(engine, only_clicks, prune=True) == ["unchanged clicks", "delete    nightly"]
    _apply(engine, bucket, only_clicks, prune=True)
    with engine.connect() as conn:
        assert [j.name for j in job_views.list_jobs(conn)] == ["clicks", "other"]
    assert _plan(engine, only_clicks, prune=True) == ["unchanged clicks"]


def test_an_invalid_spec_lists_every_error_with_its_location_and_applies_nothing(
    engine: sa.Engine, bucket: store.Store, folder: Path
) -> None:
    spec_file = _write(
        folder,
        """
        lable = "x"

        [jobs.good]
        resource = "./clicks.py"

        [jobs.bad]
        kind = "interactive"
        resource = "./missing.py"
        py_files = ["no such:ref"]
        conf = { "k" = [1], "sparkring.health.stallTimeout" = "soon" }
        max_restarts = -1
        extra = true
        """,
    )
    with pytest.raises(apply.SpecError) as refused:
        apply.parse(spec_file)
    problems = [line.split(": ", 1)[1] for line in refused.value.errors]
    assert [p.split(":")[0] for p in problems] == [
        "lable",
        "jobs.bad.extra",
        "jobs.bad.kind",
        "jobs.bad.resource",
        "jobs.bad.py_files[0]",
        "jobs.bad.conf.k",
        "jobs.bad.conf",
        "jobs.bad.max_restarts",
    ]
    assert "sparkring.health.stallTimeout" in problems[6]
    # Errors that need the catalog are listed together too, before anything is written.
    spec_file = _write(
        folder,
        """
        [jobs.a]
        resource = "nope:3"
        [jobs.b]
        resource = "lib:7"
        """,
    )
    with pytest.raises(apply.SpecError) as refused, engine.connect() as conn:
        apply.plan(conn, apply.parse(spec_file), prune=True)
    assert [line.split(": ", 2)[1] for line in refused.value.errors] == [
        "label",
        "jobs.a.resource",
        "jobs.b.resource",
    ]
    with engine.connect() as conn:
        assert job_views.list_jobs(conn) == []
    assert _resources(engine) == [("lib", 1)]
    broken = folder / "broken.toml"
    broken.write_text("[jobs.x\n")
    with pytest.raises(apply.SpecError, match="not valid TOML"):
        apply.parse(broken)


def test_a_kind_cannot_change_through_apply(
    engine: sa.Engine, bucket: store.Store, folder: Path
) -> None:
    _apply(engine, bucket, _write(folder, SPEC.format(max_restarts=2)))
    changed = _write(folder, SPEC.format(max_restarts=2).replace('kind = "batch"', ""))
    with pytest.raises(apply.SpecError, match=r"jobs\.nightly\.kind: the job is batch"):
        _plan(engine, changed)


SCHEDULED = """
    [jobs.hourly]
    kind = "batch"
    resource = "lib:1"
    schedule = "{spec}"
    timezone = "Europe/Berlin"
    concurrency = "replace"
"""


def test_a_schedule_in_a_spec_is_created_switched_on_and_revised(
    engine: sa.Engine, bucket: store.Store, folder: Path
) -> None:
    spec_file = _write(folder, SCHEDULED.format(spec="0 * * * *"))
    _apply(engine, bucket, spec_file)
    with engine.connect() as conn:
        shown = job_views.show(conn, "hourly").as_json()["schedule"]
    assert (shown["spec"], shown["timezone"], shown["concurrency"]) == (
        "0 * * * *",
        "Europe/Berlin",
        "replace",
    )
    assert shown["active"] is True  # desired running (the default): switched on
    assert _plan(engine, spec_file) == ["unchanged hourly"]
    changed = _write(folder, SCHEDULED.format(spec="@every 5m"))
    (line,) = _plan(engine, changed)
    assert line.startswith("update    hourly: schedule '0 * * * *' Europe/Berlin")
    assert "-> '@every 5m' Europe/Berlin" in line
    _apply(engine, bucket, changed)
    with engine.connect() as conn:
        assert job_views.show(conn, "hourly").as_json()["schedule"]["spec"] == "@every 5m"


def test_a_bad_schedule_in_a_spec_is_refused_with_its_location(folder: Path) -> None:
    spec_file = _write(
        folder,
        """
        [jobs.a]
        kind = "batch"
        resource = "lib:1"
        schedule = "61 * * * *"

        [jobs.b]
        resource = "lib:1"
        schedule = "@daily"

        [jobs.c]
        kind = "batch"
        resource = "lib:1"
        timezone = "UTC"
        """,
    )
    with pytest.raises(apply.SpecError) as caught:
        apply.parse(spec_file)
    errors = "\n".join(caught.value.errors)
    assert "jobs.a.schedule: schedule '61 * * * *' is not a valid cron expression" in errors
    assert "jobs.b.schedule: a schedule is for batch jobs" in errors
    assert "jobs.c.timezone: needs schedule" in errors


def test_a_restart_window_in_a_spec_is_applied_revised_and_checked(
    engine: sa.Engine, bucket: store.Store, folder: Path
) -> None:
    windowed = _write(folder, SPEC.format(max_restarts=2).replace(
        "args = [", 'restart_window = "30m"\n    args = ['))  # fmt: skip
    _apply(engine, bucket, windowed)
    with engine.connect() as conn:
        assert job_views.show(conn, "clicks").as_json()["restart_window_s"] == 1800.0
        assert job_views.show(conn, "nightly").as_json()["restart_window_s"] == 0.0  # batch: none
    assert _plan(engine, windowed) == ["unchanged clicks", "unchanged nightly"]
    default = _write(folder, SPEC.format(max_restarts=2))
    assert _plan(engine, default) == [
        "update    clicks: restart_window 30m -> 1h",
        "unchanged nightly",
    ]
    bad = _write(
        folder,
        """
        [jobs.a]
        resource = "lib:1"
        restart_window = "soon"

        [jobs.b]
        kind = "batch"
        resource = "lib:1"
        restart_window = "1h"

        [jobs.c]
        resource = "lib:1"
        restart_window = 5
        """,
    )
    with pytest.raises(apply.SpecError) as caught:
        apply.parse(bad)
    errors = "\n".join(caught.value.errors)
    assert "jobs.a.restart_window: duration 'soon' is not a number with a unit" in errors
    assert "jobs.b.restart_window: --restart-window is for streaming jobs" in errors
    assert 'jobs.c.restart_window: must be a duration such as "1h", or 0' in errors


def test_auto_rollback_in_a_spec_is_applied_planned_and_checked(
    engine: sa.Engine, bucket: store.Store, folder: Path
) -> None:
    watched = _write(folder, SPEC.format(max_restarts=2).replace(
        "args = [", 'auto_rollback = true\n    healthy_within = "2m"\n    args = ['))  # fmt: skip
    _apply(engine, bucket, watched)
    with engine.connect() as conn:
        setting = job_views.show(conn, "clicks").as_json()["auto_rollback"]
    assert setting == {"enabled": True, "healthy_within_s": 120.0, "watch": None}
    assert _plan(engine, watched) == ["unchanged clicks", "unchanged nightly"]
    # A new main artifact: the revision rolls the running job, and is watched.
    (folder / "clicks.py").write_text("print('clicks v2')\n")
    _apply(engine, bucket, watched)
    with engine.connect() as conn:
        watch = job_views.show(conn, "clicks").as_json()["auto_rollback"]["watch"]
    assert watch is not None and (watch["revision"], watch["fallback"]) == (2, 1)
    # The file without it turns it off (and ends the watch): a setting, not a revision.
    plain = _write(folder, SPEC.format(max_restarts=2))
    assert _plan(engine, plain) == [
        "update    clicks: auto_rollback on (healthy within 2m) -> off",
        "unchanged nightly",
    ]
    _apply(engine, bucket, plain)
    with engine.connect() as conn:
        shown = job_views.show(conn, "clicks").as_json()
    assert shown["auto_rollback"] == {"enabled": False, "healthy_within_s": 300.0, "watch": None}
    assert shown["revision"] == 2
    bad = _write(
        folder,
        """
        [jobs.a]
        kind = "batch"
        resource = "lib:1"
        auto_rollback = true

        [jobs.b]
        resource = "lib:1"
        auto_rollback = "yes"
        healthy_within = "soon"
        """,
    )
    with pytest.raises(apply.SpecError) as caught:
        apply.parse(bad)
    errors = "\n".join(caught.value.errors)
    assert "jobs.a.auto_rollback: --auto-rollback is for streaming jobs" in errors
    assert "jobs.b.auto_rollback: must be true or false" in errors
    assert "jobs.b.healthy_within: duration 'soon' is not a number with a unit" in errors
