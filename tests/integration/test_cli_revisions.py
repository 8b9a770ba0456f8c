"""``job update | rollback | history`` and ``apply`` as a user meets them: the real CLI
(``python -m server``) against this test's own database, stdout a pipe."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler import job_views
from testing import cli_runner, factories


@pytest.fixture
def run(stack_env: dict[str, str], database_url: str):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    env = {**base, **stack_env, "SPARKRING_DATABASE_URL": database_url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_runner.run(args, env=env, timeout=60)

    return cli


def _error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_update_history_rollback_and_their_refusals(run, engine: sa.Engine) -> None:
    factories.job(engine, "etl", start=False)
    with engine.begin() as conn:
        factories.resource(conn, "app", content=b"print(2)\n")  # app:2
    before = run("job", "history", "etl", "--json").stdout

    for args, expected in [
        (("job", "update", "nope", "--conf", "a=1"), "no job named 'nope'"),
        (("job", "update", "etl", "--resource", "app:9"), "has no version 9"),
        (("job", "update", "etl", "--resource", "ghost"), "no resource named 'ghost'"),
        (("job", "update", "etl", "--conf", "nokey"), "is not KEY=VALUE"),
        (("job", "update", "etl", "--unset-conf", "spark.x"), "'spark.x' is not set"),
        (("job", "update", "etl", "--arg", "a", "--no-args"), "exclude each other"),
        (("job", "rollback", "etl"), "only revision 1"),
        (("job", "rollback", "etl", "--to", "4"), "has no revision 4"),
    ]:
        assert expected in _error(run(*args)), args
    assert run("job", "history", "etl", "--json").stdout == before  # nothing written

    done = run("job", "update", "etl", "--resource", "app", "--conf", "spark.x=1")
    assert done.stdout.strip() == (
        "job etl: revision 2 (resource, conf changed); used at the next 'sparkring job start etl'"
    )
    same = run("job", "update", "etl", "--conf", "spark.x=1")
    assert same.stdout.strip() == "job etl: no change (still revision 2)"
    back = run("job", "rollback", "etl")
    assert back.stdout.startswith("job etl: revision 3 (resource, conf changed)")
    history = run("job", "history", "etl").stdout
    for text in (
        "created",
        "resource app:1 -> app:2; conf spark.x='1' added",
        "rollback to revision 1; resource app:2 -> app:1; conf spark.x unset (was '1')",
        "3 current",
    ):
        assert text in history, history
    shown = run("job", "show", "etl").stdout
    assert "revision 3" in " ".join(shown.split())


def test_apply_plans_applies_and_refuses_an_invalid_file(
    run, engine: sa.Engine, tmp_path: Path
) -> None:
    with engine.begin() as conn:
        factories.resource(conn, "app")
    spec = tmp_path / "jobs.toml"
    spec.write_text('label = "t"\n[jobs.a]\nresource = "app"\ndesired = "stopped"\n')
    dry = run("apply", "-f", str(spec), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "create    a (streaming, app:1, stopped)",
        "dry run: 1 to create; nothing applied",
    ]
    with engine.connect() as conn:
        assert job_views.list_jobs(conn) == []
    assert run("apply", "-f", str(spec)).stdout.splitlines()[-1] == "applied: 1 create"
    again = run("apply", "-f", str(spec))
    assert again.stdout.splitlines() == ["unchanged a", "nothing to change"]

    spec.write_text('[jobs.a]\nkind = "nope"\nresource = "./gone.py"\nextra = 1\n')
    refused = run("apply", "-f", str(spec))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    located = [line.split(": ")[2] for line in refused.stderr.strip().splitlines()]
    assert located == ["jobs.a.extra", "jobs.a.kind", "jobs.a.resource"], refused.stderr


def test_restart_window_through_create_update_show_and_history(run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        factories.resource(conn, "app")
    for args, expected in [
        (("job", "create", "w", "--resource", "app", "--restart-window", "soon"),
         "--restart-window: duration 'soon' is not a number with a unit"),
        (("job", "create", "b", "--resource", "app", "--kind", "batch",
          "--restart-window", "1h"), "--restart-window is for streaming jobs"),
        (("job", "create", "w", "--resource", "app", "--restart-window", "400d"),
         "--restart-window must be 0 (none) to"),
    ]:  # fmt: skip
        assert expected in _error(run(*args)), args
    assert run("job", "show", "w").returncode == 1  # nothing was created
    assert run("job", "create", "w", "--resource", "app").returncode == 0
    shown = run("job", "show", "w").stdout
    assert "1h (crashes in it count against max_restarts)" in shown, shown
    assert "0/3" in shown, shown
    done = run("job", "update", "w", "--restart-window", "0")
    assert done.returncode == 0, done.stderr
    assert "none (every crash since the last start counts)" in run("job", "show", "w").stdout
    history = run("job", "history", "w").stdout
    assert "restart_window 1h -> none" in history, history
