"""Auto-rollback as a user meets it: ``job create/update --auto-rollback
[--healthy-within D]``, ``--no-auto-rollback``, ``job show``, and its refusals (the
real CLI against this test's own database)."""

from __future__ import annotations

import json

import sqlalchemy as sa

from scheduler import job_views, jobs
from sql.states import JobKind
from testing import factories
from tests.integration.test_cli_revisions import _error, run  # noqa: F401 (the fixture)


def _setting(engine: sa.Engine, name: str) -> dict[str, object]:
    with engine.connect() as conn:
        return job_views.show(conn, name).as_json()["auto_rollback"]


def test_create_and_update_set_the_jobs_auto_rollback_and_an_update_is_watched(
    run,  # noqa: F811
    engine: sa.Engine,
) -> None:
    with engine.begin() as conn:
        factories.resource(conn, "app")
    made = run("job", "create", "s", "--resource", "app", "--auto-rollback",
               "--healthy-within", "2m")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert _setting(engine, "s") == {"enabled": True, "healthy_within_s": 120.0, "watch": None}
    assert "on (healthy within 2m)" in run("job", "show", "s").stdout
    with engine.begin() as conn:
        jobs.start(conn, "s")
        factories.resource(conn, "app", content=b"print(2)\n")
    done = run("job", "update", "s", "--resource", "app")
    assert done.returncode == 0, done.stderr
    assert "auto-rollback watches it until " in done.stdout
    assert "(back to 1)" in done.stdout
    shown = run("job", "show", "s").stdout
    assert "watching revision 2 until" in " ".join(shown.split()), shown
    watch = json.loads(run("job", "show", "s", "--json").stdout)["auto_rollback"]["watch"]
    assert (watch["revision"], watch["fallback"]) == (2, 1)

    off = run("job", "update", "s", "--no-auto-rollback")
    assert off.stdout.strip() == "job s: no change (still revision 2); auto-rollback off"
    assert _setting(engine, "s") == {"enabled": False, "healthy_within_s": 120.0, "watch": None}


def test_auto_rollback_refusals(run, engine: sa.Engine) -> None:  # noqa: F811
    factories.job(engine, "nightly", kind=JobKind.BATCH)
    factories.job(engine, "s")
    for args, expected in [
        (("job", "update", "nightly", "--auto-rollback"), "--auto-rollback is for streaming"),
        (
            ("job", "create", "b2", "--resource", "app", "--kind", "batch", "--auto-rollback"),
            "--auto-rollback is for streaming",
        ),
        (("job", "update", "s", "--auto-rollback", "--healthy-within", "soon"), "--healthy-within"),
        (("job", "update", "s", "--auto-rollback", "--healthy-within", "30d"), "at most 7d"),
    ]:
        assert expected in _error(run(*args)), args
    assert _setting(engine, "s")["enabled"] is False


def test_help_names_the_options(run) -> None:  # noqa: F811
    text = " ".join(run("job", "update", "--help").stdout.split())
    assert "--auto-rollback" in text and "--no-auto-rollback" in text
    assert "--healthy-within" in text
