"""CPU time of short CLI commands: ``job list``, ``job show``, ``job start`` and the bare
import of the CLI, as a user's shell runs them (one process each).

Two reference rows come with them: ``job list --json`` through the installed console
script (``sparkring``, which imports the checkout's code first on ``PYTHONPATH``) to show
what ``python -m`` adds, and the floor: a bare import of the libraries every database
command loads (SQLAlchemy and its PostgreSQL dialect, psycopg, pydantic-settings, typer).

Runs in a throwaway database copied from the migrated test template
(``testing/services.py``) with one job in it, and dropped at the end::

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.cli_startup [--runs 9] [--checkout DIR ...] [--json]

Each command runs ``--runs`` times after one warm-up run; the figure is the child's user
+ system CPU seconds (``os.wait4``), median and minimum. ``--checkout DIR`` (repeatable;
default this checkout) runs the CLI of that checkout of the repository (e.g. ``git
worktree add /tmp/before <commit>``) with this virtualenv: several checkouts are run in
turn, one run of each before the next, so that they share the machine's load and can be
compared side by side. ``job start`` is measured on a stopped job that has a target, so
the command returns as soon as it has read the decision (it does not wait for a
coordinator). The children may write bytecode (``PYTHONDONTWRITEBYTECODE`` is dropped),
so after the warm-up run each checkout is measured with its ``.pyc`` files, as an
installed package runs. The load average is recorded before and after. Only PostgreSQL
is needed.

``--breakdown`` (no database needed) splits the import of ``server.cli.main`` of the first
checkout into the libraries it loads, in the order ``job list`` loads them: the CPU
seconds of each group measured inside one process (``getrusage`` before and after),
median of ``--runs`` processes. Each group's figure excludes what earlier groups loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from scheduler import jobs
from testing import factories, services

REPO = Path(__file__).resolve().parent.parent

JOB = "bench-job"
# The console script of this virtualenv, run with its interpreter like ``-m server``.
CONSOLE_SCRIPT = str(Path(sys.executable).parent / "sparkring")
# What every database command imports before any code of sparkring runs.
LIBRARIES = "sqlalchemy.dialects.postgresql.psycopg, psycopg, pydantic_settings, typer"
# --breakdown: groups of modules, imported in this order (comma-separated in a group).
IMPORT_GROUPS: dict[str, str] = {
    "python + site": "",
    "sqlalchemy": "sqlalchemy",
    "sqlalchemy postgresql dialect": "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg": "psycopg",
    "pydantic": "pydantic,pydantic.types,pydantic.functional_validators",
    "pydantic-settings": "pydantic_settings",
    "typer": "typer",
    "rich": "rich.console,rich.table",
    "sparkring tables, jobs, settings": "sql.tables,scheduler.jobs,server.settings",
    "sparkring CLI modules": "server.cli.main",
}
# Prints the CPU seconds spent before the first group, then those of each group (JSON).
BREAKDOWN_PROBE = """
import importlib, json, resource, sys
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
spent = [cpu()]
for group in sys.argv[1:]:
    before = cpu()
    for module in filter(None, group.split(",")):
        importlib.import_module(module)
    spent.append(cpu() - before)
print(json.dumps(spent))
"""
COMMANDS: dict[str, list[str]] = {
    "import server.cli": ["-c", "import server.cli"],
    "job list": ["-m", "server", "job", "list"],
    "job list --json": ["-m", "server", "job", "list", "--json"],
    "job show": ["-m", "server", "job", "show", JOB],
    "job show --json": ["-m", "server", "job", "show", JOB, "--json"],
    "job start": ["-m", "server", "job", "start", JOB],
    "sparkring job list --json": [CONSOLE_SCRIPT, "job", "list", "--json"],
    "floor: libraries": ["-c", f"import {LIBRARIES}"],
}


def cpu_seconds(args: list[str], checkout: Path, env: dict[str, str]) -> float:
    """User + system CPU seconds of one ``python ARGS`` run from ``checkout``."""
    child = subprocess.Popen(
        [sys.executable, *args],
        cwd=checkout,
        env={**env, "PYTHONPATH": str(checkout)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    stderr = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"python {' '.join(args)} failed ({child.returncode}): {stderr}")
    return usage.ru_utime + usage.ru_stime


def breakdown(checkout: Path, runs: int) -> dict[str, float]:
    """{group: median CPU seconds of its import} (:data:`IMPORT_GROUPS`)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    groups = list(IMPORT_GROUPS.values())[1:]
    samples = []
    for _ in range(runs + 1):  # the first run warms the page cache
        result = subprocess.run(
            [sys.executable, "-c", BREAKDOWN_PROBE, *groups],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        samples.append(json.loads(result.stdout))
    return {
        name: round(statistics.median(sample[i] for sample in samples[1:]), 3)
        for i, name in enumerate(IMPORT_GROUPS)
    }


def _stopped_with_a_target(engine: sa.Engine, job_id: int) -> None:
    with engine.begin() as conn:
        jobs.stop(conn, JOB)
    factories.target(engine, job_id, "bench-server")


def measure(
    database_url: str, checkouts: Sequence[Path], runs: int
) -> dict[str, dict[str, dict[str, float]]]:
    """{command: {checkout: {median_s, min_s}}}."""
    engine = sa.create_engine(sa.make_url(database_url).set(drivername="postgresql+psycopg"))
    job_id = factories.job(engine, JOB, start=False)
    env = {**os.environ, "SPARKRING_DATABASE_URL": database_url}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measured with .pyc files, as installed
    figures: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for name, args in COMMANDS.items():
            samples: dict[Path, list[float]] = {checkout: [] for checkout in checkouts}
            for _ in range(runs + 1):  # the first run warms the page cache
                for checkout in checkouts:
                    if name == "job start":
                        _stopped_with_a_target(engine, job_id)
                    samples[checkout].append(cpu_seconds(args, checkout, env))
            figures[name] = {
                str(checkout): {
                    "median_s": round(statistics.median(taken[1:]), 3),
                    "min_s": round(min(taken[1:]), 3),
                }
                for checkout, taken in samples.items()
            }
    finally:
        engine.dispose()
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="runs per command (default 9)")
    parser.add_argument(
        "--checkout",
        type=Path,
        action="append",
        help="checkout whose CLI runs; repeatable (default: this one)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="CPU of importing the CLI, split into the libraries it loads (no database)",
    )
    args = parser.parse_args(argv)
    checkouts = [path.resolve() for path in args.checkout or [REPO]]
    if args.breakdown:
        groups = breakdown(checkouts[0], args.runs)
        if args.json:
            print(json.dumps({"runs": args.runs, "groups": groups}, indent=2))
            return
        print(f"CPU seconds of each import group, median of {args.runs} runs ({checkouts[0]})")
        for name, seconds in groups.items():
            print(f"{name:<34}{seconds:.3f}")
        print(f"{'total':<34}{sum(groups.values()):.3f}")
        return
    url = services.stack_env().get("SPARKRING_DATABASE_URL")
    load_before = os.getloadavg()
    with services.scratch_database(url, prefix="bench_cli") as database_url:
        figures = measure(database_url, checkouts, args.runs)
    load = {"before": load_before, "after": os.getloadavg()}
    if args.json:
        print(json.dumps({"runs": args.runs, "load_average": load, "commands": figures}, indent=2))
        return
    print(f"CPU seconds (user + system) per command, median / min of {args.runs} runs")
    for when, averages in load.items():
        print(f"  load average {when}: " + " ".join(f"{a:.2f}" for a in averages))
    for number, checkout in enumerate(checkouts, 1):
        print(f"  [{number}] {checkout}")
    print(f"{'command':<28}" + "".join(f"{f'[{n}]':>16}" for n in range(1, len(checkouts) + 1)))
    for name, by_checkout in figures.items():
        cells = "".join(
            f"{figure['median_s']:.3f} / {figure['min_s']:.3f}".rjust(16)
            for figure in by_checkout.values()
        )
        print(f"{name:<28}{cells}")


if __name__ == "__main__":
    main()
