"""What the short job commands import (issue 15): a structural check, not a timed one.

Each command runs as a user's shell runs it (``python -m server ...``, one process,
stdout a pipe) with a probe that records every module loaded by the time the process
exits, so imports made inside the command count too. ``benchmarks/cli_startup.py``
measures the CPU time these imports cost.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from scheduler import alerts
from testing import factories

# Libraries of services and processes that `job list/show/start` never talk to or run.
NOT_FOR_JOB_COMMANDS = frozenset(
    {
        "alembic",
        "fastapi",
        "httpx",
        "kazoo",
        "minio",
        "prometheus_client",
        "pyspark",
        "starlette",
        "uhashring",
        "urllib3",
        "uvicorn",
    }
)

# Runs ``python -m server ARGS`` and writes the top-level names of sys.modules, one a
# line, to the file named first, when the interpreter exits (after SystemExit).
PROBE = """
import atexit, runpy, sys
path, sys.argv = sys.argv[1], ["sparkring", *sys.argv[2:]]
atexit.register(
    lambda: open(path, "w").write("\\n".join(sorted({m.split(".")[0] for m in sys.modules})))
)
runpy.run_module("server", run_name="__main__", alter_sys=True)
"""


# Each short job command, and whether it prints through Rich (a table, a record, a
# message): ``--json`` is written with the json module, so Rich (about 0.02 s of CPU to
# import) stays unloaded.
JOB_COMMANDS = (
    (("job", "list", "--json"), False),
    (("job", "show", "probe", "--json"), False),
    (("job", "list"), True),
    (("job", "show", "probe"), True),
    (("job", "start", "probe"), True),
    # Alerts' listings are as short (the webhook's HTTP client is the servers').
    (("alert", "list", "--json"), False),
    (("alert", "show", "probe", "--json"), False),
    (("alert", "list"), True),
)


def test_job_commands_import_only_what_they_use(
    stack_env: dict[str, str], database_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    # A stopped job with a target: `job start` reads the decision at once (no coordinator).
    factories.target(engine, factories.job(engine, "probe", start=False), "probe-server")
    with engine.begin() as conn:
        alerts.create(conn, "probe", "http://127.0.0.1:9/", allow_networks=factories.LOOPBACK)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    env = {**base, **stack_env, "SPARKRING_DATABASE_URL": database_url}
    modules = tmp_path / "modules.txt"
    for args, prints_through_rich in JOB_COMMANDS:
        result = subprocess.run(
            [sys.executable, "-c", PROBE, str(modules), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, (args, result.stderr)
        assert "probe" in result.stdout, (args, result.stdout)
        loaded = set(modules.read_text().split())
        assert {"sqlalchemy", "psycopg", "typer"} <= loaded, args  # the probe sees imports
        assert not loaded & NOT_FOR_JOB_COMMANDS, (args, sorted(loaded & NOT_FOR_JOB_COMMANDS))
        assert ("rich" in loaded) is prints_through_rich, args
