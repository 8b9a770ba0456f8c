"""The CLI as a user meets it: piped output, exit codes, readable values, filters.

Each test runs the real CLI (``python -m server``) against this test's own database
(and chroot or bucket when it needs one), with stdout a pipe as in ``sparkring ... | grep``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from server import clients, log_shipping
from server import settings as settings_module
from sql.states import JobKind
from testing import cli_runner, factories, waiting

SPARKRING = [sys.executable, "-m", "server"]
SERVICE_ENV = (
    "SPARKRING_DATABASE_URL",
    "SPARKRING_ZK_HOSTS",
    "SPARKRING_S3_ENDPOINT",
    "SPARKRING_S3_ACCESS_KEY",
    "SPARKRING_S3_SECRET_KEY",
)
CONFIG_ERROR = 78


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with exactly ``env`` as its SPARKRING_* settings (none inherited)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    return cli_runner.run(args, env={**base, **env}, timeout=60)


def _one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture
def env(stack_env: dict[str, str], database_url: str) -> dict[str, str]:
    return {**stack_env, "SPARKRING_DATABASE_URL": database_url}


def _rows(stdout: str) -> dict[str, list[str]]:
    """A table's rows by their first cell (the header line and the rule skipped)."""
    cells = [[c.strip() for c in line.split("│")] for line in stdout.splitlines()[2:]]
    return {row[0]: row for row in cells if row and row[0]}


# ------------------------------------------------------------------------ exit codes


def test_settings_errors_exit_78_naming_the_key(env: dict[str, str], tmp_path: Path) -> None:
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("capacity = = 3\n")
    line = _one_line_error(_run(env, "--config", str(bad_toml), "job", "list"), CONFIG_ERROR)
    assert "is not valid TOML" in line

    line = _one_line_error(_run({**env, "SPARKRING_CAPACITY": "abc"}, "job", "list"), 78)
    assert "SPARKRING_CAPACITY" in line and "abc" not in line

    unknown = tmp_path / "unknown.toml"
    unknown.write_text('datbase_url = "x"\nzk_host = "y"\ncapacty = 2\n')
    line = _one_line_error(_run(env, "--config", str(unknown), "job", "list"), CONFIG_ERROR)
    assert "'datbase_url'" in line and "'zk_host'" in line and "'capacty'" in line


@pytest.mark.parametrize(
    ("hosts", "problem"),
    [("localhost:12181x", "must be HOST:PORT"), ("", "SPARKRING_ZK_HOSTS is empty")],
)
def test_a_mistyped_zk_hosts_is_one_line_naming_it(
    env: dict[str, str], hosts: str, problem: str
) -> None:
    line = _one_line_error(
        _run({**env, "SPARKRING_ZK_HOSTS": hosts}, "server", "list"), CONFIG_ERROR
    )
    assert "SPARKRING_ZK_HOSTS" in line and problem in line, line


def test_an_unmigrated_database_says_to_upgrade(env: dict[str, str]) -> None:
    assert _run(env, "db", "downgrade", "base").returncode == 0
    for args in (("job", "list"), ("job", "show", "x"), ("token", "list")):
        line = _one_line_error(_run(env, *args), CONFIG_ERROR)
        assert "run 'sparkring db upgrade'" in line, line


def test_commands_require_only_the_settings_they_use(env: dict[str, str], tmp_path: Path) -> None:
    db_only = {k: v for k, v in env.items() if k not in SERVICE_ENV[1:]}
    listed = _run(db_only, "job", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    assert _run(db_only, "db", "current").returncode == 0
    assert _run(db_only, "resource", "list").returncode == 0

    line = _one_line_error(_run(db_only, "server", "list"), CONFIG_ERROR)
    assert line == "error: invalid settings: SPARKRING_ZK_HOSTS is not set"
    app = tmp_path / "app.py"
    app.write_text("print(1)\n")
    line = _one_line_error(_run(db_only, "resource", "upload", "app", str(app)), CONFIG_ERROR)
    assert "SPARKRING_S3_ENDPOINT is not set" in line
    assert "SPARKRING_S3_ACCESS_KEY is not set" in line

    nothing = {k: v for k, v in env.items() if k not in SERVICE_ENV}
    line = _one_line_error(_run(nothing, "job", "list"), CONFIG_ERROR)
    assert line == "error: invalid settings: SPARKRING_DATABASE_URL is not set"


# ------------------------------------------------------------------ piped output


def test_piped_tables_keep_every_character(env: dict[str, str], engine: sa.Engine) -> None:
    job_id = factories.job(engine, "a-job-with-a-rather-long-name-for-a-narrow-terminal")
    error = "driver exited 1: " + "py4j.protocol.Py4JJavaError [bold]x[/] " * 6 + "END"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE distribution SET state = 'running', last_error = :e, "
                "owner = 'server-with-a-long-name-1', target = 'server-with-a-long-name-2', "
                "lease_until = now() + interval '1 hour' WHERE job_id = :id"
            ),
            {"e": error, "id": job_id},
        )
    listed = _run(env, "job", "list")
    assert listed.returncode == 0, listed.stderr
    assert "…" not in listed.stdout
    row = _rows(listed.stdout)["a-job-with-a-rather-long-name-for-a-narrow-terminal"]
    assert row[1:6] == [
        "streaming",
        "running",
        "running",
        "server-with-a-long-name-1",
        "server-with-a-long-name-2",
    ]
    shown = _run(env, "job", "show", "a-job-with-a-rather-long-name-for-a-narrow-terminal")
    assert shown.returncode == 0, shown.stderr
    assert f"last_error {error}\n" in shown.stdout


def test_job_logs_pass_driver_lines_through_byte_for_byte(
    env: dict[str, str], engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    job_id = factories.job(engine, "talker", start=False)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET epoch = 1 WHERE job_id = :id"), {"id": job_id}
        )
    text = (
        "26/11/23 20:01:02 INFO SparkContext: Running Spark version 4.0.0 on a line that "
        "is much longer than eighty columns, "
        * 3
        + "\n"
        + "col1\tcol2\t[bold]not markup[/bold]\t€\n"
        + "  indented   with   runs   of   spaces  \n"
    )
    log = tmp_path / "driver.log"
    log.write_text(text)
    bucket = clients.bucket(settings)
    bucket.ensure_bucket()
    bucket.put(log_shipping.log_key("talker", job_id, 1), log, log.stat().st_size)
    run_env = {
        **env,
        "SPARKRING_S3_BUCKET": settings.s3_bucket,
        "SPARKRING_ZK_HOSTS": "127.0.0.1:1",
    }
    result = _run(run_env, "job", "logs", "talker")
    assert result.returncode == 0, result.stderr
    assert result.stdout == text


def test_job_logs_of_a_re_created_job_never_show_its_deleted_namesakes_log(
    env: dict[str, str], engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    """Hole H6: job talker was deleted after its run 1 shipped its log (by this code, or
    by the older code, under the name alone), and created again. The new job's run 1
    has shipped nothing yet: `job logs` must say so, not show the deleted job's log."""
    bucket = clients.bucket(settings)
    bucket.ensure_bucket()
    log = tmp_path / "driver.log"
    log.write_text("the deleted job's run\n")
    bucket.put(log_shipping.legacy_log_key("talker", 1), log, log.stat().st_size)
    bucket.put(log_shipping.log_key("talker", 10**9, 1), log, log.stat().st_size)
    job_id = factories.job(engine, "talker", start=False)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET epoch = 1 WHERE job_id = :id"), {"id": job_id}
        )
        # Created a while after those logs (S3 dates them to the second only).
        conn.execute(
            sa.text("UPDATE jobs SET created_at = now() + interval '5 seconds' WHERE id = :id"),
            {"id": job_id},
        )
    run_env = {
        **env,
        "SPARKRING_S3_BUCKET": settings.s3_bucket,
        "SPARKRING_ZK_HOSTS": "127.0.0.1:1",
    }
    result = _run(run_env, "job", "logs", "talker")
    assert "the deleted job's run" not in result.stdout
    assert result.returncode != 0 and "has no driver log yet" in result.stderr, result.stderr


def test_job_logs_still_show_a_log_the_older_code_shipped(
    env: dict[str, str], engine: sa.Engine, settings: settings_module.Settings, tmp_path: Path
) -> None:
    """Upgrade compatibility: a run of the job that ended before the upgrade shipped its
    log under the name alone (log_shipping.legacy_log_key), after the job was created."""
    job_id = factories.job(engine, "talker", start=False)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET epoch = 1 WHERE job_id = :id"), {"id": job_id}
        )
    bucket = clients.bucket(settings)
    bucket.ensure_bucket()
    log = tmp_path / "driver.log"
    log.write_text("run 1, shipped by the older code\n")
    bucket.put(log_shipping.legacy_log_key("talker", 1), log, log.stat().st_size)
    run_env = {
        **env,
        "SPARKRING_S3_BUCKET": settings.s3_bucket,
        "SPARKRING_ZK_HOSTS": "127.0.0.1:1",
    }
    result = _run(run_env, "job", "logs", "talker")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "run 1, shipped by the older code\n"


# -------------------------------------------------------------------- readability


def test_job_show_and_events_read_as_text_not_python(
    env: dict[str, str], engine: sa.Engine
) -> None:
    job_id = factories.job(engine, "reader")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail) "
                "VALUES (:id, 'reader', 'retargeted', 's1', 0, "
                """'{"from": "s1", "to": "s2", "reason": "server left"}')"""
            ),
            {"id": job_id},
        )
    shown = _run(env, "job", "show", "reader")
    assert shown.returncode == 0, shown.stderr
    resource = next(line for line in shown.stdout.splitlines() if "resource" in line)
    assert "{" not in resource and "'" not in resource
    assert "app:1" in resource and "sha256" in resource
    events = _run(env, "job", "events", "reader")
    assert events.returncode == 0, events.stderr
    assert "{" not in events.stdout and "'" not in events.stdout, events.stdout
    for pair in ("from=s1", "to=s2", 'reason="server left"'):
        assert pair in events.stdout, events.stdout
    as_json = json.loads(_run(env, "job", "show", "reader", "--json").stdout)
    assert as_json["resource"]["name"] == "app" and as_json["resource"]["version"] == 1


def test_job_events_and_show_print_a_multiline_error_on_one_line(
    env: dict[str, str], engine: sa.Engine
) -> None:
    """An error recorded with newlines and tabs (a stack trace, as older releases kept
    it) is one line of ``job events`` and of ``job show``, piped as here: no escapes,
    no line of the trace on a line of its own."""
    job_id = factories.job(engine, "tracer")
    trace = "driver exited with exit code 1: Traceback (most recent call last):\n\tat x.y(Z)\nBoom"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail) "
                "VALUES (:id, 'tracer', 'crashed', 's1', 1, "
                "jsonb_build_object('error', CAST(:error AS text), 'next', 'backoff'))"
            ),
            {"id": job_id, "error": trace},
        )
        conn.execute(
            sa.text("UPDATE distribution SET last_error = :error WHERE job_id = :id"),
            {"id": job_id, "error": trace},
        )
    one_line = "Traceback (most recent call last): at x.y(Z) Boom"
    events = _run(env, "job", "events", "tracer")
    assert events.returncode == 0, events.stderr
    assert "\\n" not in events.stdout and "\\t" not in events.stdout, events.stdout
    crashed = [line for line in events.stdout.splitlines() if "crashed" in line]
    assert len(crashed) == 1 and one_line in crashed[0], events.stdout
    assert not any(line.strip().startswith(("at x", "Boom")) for line in events.stdout.splitlines())
    shown = _run(env, "job", "show", "tracer")
    assert shown.returncode == 0, shown.stderr
    error = [line for line in shown.stdout.splitlines() if "last_error" in line]
    assert len(error) == 1 and one_line in error[0], shown.stdout


def test_ring_show_says_yes_and_no(env: dict[str, str], engine: sa.Engine, zk_root: str) -> None:
    factories.target(engine, factories.job(engine, "placed"), "gone")
    shown = _run({**env, "SPARKRING_ZK_ROOT": zk_root}, "ring", "show")
    assert shown.returncode == 0, shown.stderr
    assert "True" not in shown.stdout and "False" not in shown.stdout
    assert _rows(shown.stdout)["gone"][1:2] == ["no"]


def test_help_shows_no_bool_and_the_defaults(env: dict[str, str]) -> None:
    for args in (("job", "list"), ("server", "run"), ("resource", "upload"), ()):
        result = _run(env, *args, "--help")
        assert result.returncode == 0, result.stderr
        assert "<bool>" not in result.stdout, (args, result.stdout)
    run_help = " ".join(_run(env, "server", "run", "--help").stdout.split())
    assert "SPARKRING_CAPACITY, else 4" in run_help, run_help
    assert "SPARKRING_ROLE, else both" in run_help, run_help


# ------------------------------------------------------------------------ filters


def test_job_list_filters_by_state_and_server(env: dict[str, str], engine: sa.Engine) -> None:
    on_s1 = factories.job(engine, "on-s1")
    moving = factories.job(engine, "moving-to-s1")
    factories.job(engine, "idle", start=False)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE distribution SET state = 'running', owner = 's1', "
                "lease_until = now() + interval '1 hour' WHERE job_id = :id"
            ),
            {"id": on_s1},
        )
        conn.execute(
            sa.text(
                "UPDATE distribution SET owner = 's2', target = 's1', "
                "lease_until = now() + interval '1 hour' WHERE job_id = :id"
            ),
            {"id": moving},
        )

    def names(*args: str) -> list[str]:
        result = _run(env, "job", "list", "--json", *args)
        assert result.returncode == 0, result.stderr
        return [row["name"] for row in json.loads(result.stdout)]

    assert names() == ["idle", "moving-to-s1", "on-s1"]
    assert names("--state", "running") == ["on-s1"]
    assert names("--state", "stopped") == ["idle"]
    assert names("--server", "s1") == ["moving-to-s1", "on-s1"]
    assert names("--server", "s2", "--state", "pending") == ["moving-to-s1"]
    table = _run(env, "job", "list", "--server", "s1")
    assert set(_rows(table.stdout)) == {"moving-to-s1", "on-s1"}
    refused = _run(env, "job", "list", "--state", "runing")
    assert refused.returncode == 2 and "runing" in refused.stderr


# ----------------------------------------------------------------------- start-up

# Libraries that only some commands need: importing the CLI (what every command does
# before it runs) must not import them (benchmarks/cli_startup.py measures the cost).
SERVICE_LIBRARIES = ("kazoo", "minio", "urllib3", "fastapi", "starlette", "uvicorn", "httpx")
SERVICE_LIBRARIES += ("pyspark", "alembic", "uhashring", "prometheus_client")


def test_cli_start_up_imports_no_library_of_a_service_it_may_not_use() -> None:
    probe = (
        "import sys, server.cli.main; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(result.stdout.split())
    assert not loaded & set(SERVICE_LIBRARIES), sorted(loaded & set(SERVICE_LIBRARIES))
    assert {"sqlalchemy", "typer"} <= loaded  # the probe sees real imports


# ------------------------------------------------------------------------ --wait


def test_wait_that_times_out_exits_124_naming_where_the_job_is(
    env: dict[str, str], engine: sa.Engine
) -> None:
    """No server runs here: ``job start --wait`` gives up after --timeout with 124 and
    says where the job waits; ``job stop --wait`` on it returns at once (nothing runs)."""
    factories.job(engine, "idle", start=False)
    waited = _run(env, "job", "start", "idle", "--wait", "--timeout", "0.5")
    line = _one_line_error(waited, 124)
    assert "job idle not running after 0.5 s: pending" in line, line
    stopped = _run(env, "job", "stop", "idle", "--wait", "--timeout", "5")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.splitlines()[-1] == "job idle: stopped"


def test_start_wait_ends_with_1_and_the_error_when_the_job_fails(
    env: dict[str, str], engine: sa.Engine
) -> None:
    """The job fails while ``job start --wait`` waits for it to run (set here as its
    owner's fenced write would: no server runs in this test): exit 1 with its error.
    ``job stop --wait`` on the failed job is done at once (no driver runs)."""
    job_id = factories.job(engine, "doomed", kind=JobKind.BATCH, max_restarts=0, start=False)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    waiting_cli = subprocess.Popen(
        [*SPARKRING, "job", "start", "doomed", "--wait", "--timeout", "60"],
        env={**base, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        waiting.wait_until(
            lambda: factories.row(engine, job_id).state == "pending", 30, message="started"
        )
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE distribution SET state = 'failed', last_error = 'driver exited "
                    "with exit code 3' WHERE job_id = :j"
                ),
                {"j": job_id},
            )
        stdout, stderr = waiting_cli.communicate(timeout=60)
    finally:
        if waiting_cli.poll() is None:
            waiting_cli.kill()
            waiting_cli.wait()
    assert waiting_cli.returncode == 1, (stdout, stderr)
    assert "job doomed failed: driver exited with exit code 3" in stderr, stderr
    stopped = _run(env, "job", "stop", "doomed", "--wait", "--timeout", "5")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.splitlines()[-1] == "job doomed: failed"
