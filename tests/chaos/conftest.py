"""The chaos campaign's fixtures, its rounds and its summary.

- ``CHAOS_ROUNDS=N`` runs every fault case N times (default 1: the short campaign).
- ``CHAOS_SEED=N`` replays the randomized mode (``test_random.py``); without it a seed
  is drawn. Either way it is printed before the first test runs. ``CHAOS_MINUTES=M`` sets how
  long the randomized mode injects faults (default 2).
- ``trial`` gives each case its own cluster (database, ZooKeeper root, bucket, folders)
  and puts the case's :class:`~testing.chaos.trial.Outcome` into the campaign's results,
  whatever the case's own result.
- ``pg_pair_trial`` is ``trial`` on a PostgreSQL primary with a synchronous standby of
  the case's own (``pg_pair``), which the case may fail over.
- ``stack`` restores ZooKeeper and PostgreSQL after every case that stops them.
- At the end, a table of every case (faults injected, double runs, early hand-offs,
  stale writes accepted, lost jobs, resurrected jobs, corrupt starts, batch generations
  run twice or re-run unproven, generations run past their budget, restarts beyond one
  per fault and job, what a Spark master fault cost a job, alerts not raised or not
  delivered, recovery time) and
  the totals is printed; ``CHAOS_RESULTS=path.json`` also writes them as JSON. A case
  marked xfail (a known hole) shows ``xfail`` when it finds its violation, ``XPASS``
  when not.

Every test under ``tests/chaos`` is marked ``chaos``, and skipped unless the command line
names ``tests/chaos``: a plain ``pytest`` over ``tests/`` never stops shared services.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.chaos import faults
from testing.chaos.trial import Outcome, Trial
from tests import conftest

RESULTS = pytest.StashKey[list[Outcome]]()
SEED = pytest.StashKey[int]()
# One stack folder per pytest-xdist worker, comma-separated (scripts/test.sh).
CHAOS_STACKS = "SPARKRING_CHAOS_STACKS"


def _rounds() -> int:
    value = os.environ.get("CHAOS_ROUNDS", "1")
    if not value.isdigit() or int(value) < 1:
        raise pytest.UsageError(f"CHAOS_ROUNDS={value!r} must be a whole number of rounds >= 1")
    return int(value)


def _seed() -> int:
    value = os.environ.get("CHAOS_SEED")
    if value is None or value == "":
        return random.SystemRandom().randrange(1, 10**9)
    if not value.isdigit():
        raise pytest.UsageError(f"CHAOS_SEED={value!r} must be a whole number")
    return int(value)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RESULTS] = []
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        config.stash[SEED] = _seed()
        workers = getattr(config.option, "numprocesses", None) or 0
        if workers and _asked_for(config):
            _check_a_stack_per_worker(workers)
        elif _asked_for(config) and _stacks():
            # One process: the first stack named (scripts/test.sh runs the campaign on a
            # stack of its own, never the main one the suite runs on).
            _use_the_stack_of("gw0")
        return
    # A pytest-xdist worker: the controller's seed, and a stack of the worker's own.
    config.stash[SEED] = int(workerinput["chaos_seed"])
    _use_the_stack_of(workerinput["workerid"])


def _stacks() -> list[str]:
    return [s for s in os.environ.get(CHAOS_STACKS, "").split(",") if s]


def _check_a_stack_per_worker(workers: int) -> None:
    """Refuse a campaign with fewer stacks than workers (the controller, before any
    worker starts; each worker again, for its own)."""
    stacks = _stacks()
    if len(stacks) < workers:
        raise pytest.UsageError(
            f"the chaos campaign on {workers} workers needs a stack per worker: "
            f"{CHAOS_STACKS} names {len(stacks)} stack folder(s) (scripts/test.sh starts "
            "them; docs/chaos.md)"
        )


def _use_the_stack_of(worker: str) -> None:
    """Point this worker's tests at its own stack (``SPARKRING_CHAOS_STACKS``: one stack
    folder per worker, in worker order). The campaign stops ZooKeeper and PostgreSQL, so
    two workers on one stack would inject their faults into each other's cases."""
    index = int(worker.removeprefix("gw"))
    _check_a_stack_per_worker(index + 1)
    stacks = _stacks()
    record = Path(stacks[index]) / "env.json"
    if not record.exists():
        raise pytest.UsageError(f"chaos worker {worker}: {record} is missing (no stack there)")
    # Every value of that stack, over any SPARKRING_* exported for another one.
    os.environ.update(json.loads(record.read_text()))
    os.environ["SPARKRING_STACK_DIR"] = stacks[index]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # pytest-xdist, on the controller
    node.workerinput["chaos_seed"] = node.config.stash[SEED]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # pytest-xdist, on the controller
    """A worker's rows join the controller's summary."""
    rows = json.loads(getattr(node, "workeroutput", {}).get("chaos_results", "[]"))
    node.config.stash[RESULTS].extend(Outcome(**row) for row in rows)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        rows = [dataclasses.asdict(o) for o in session.config.stash[RESULTS]]
        workeroutput["chaos_results"] = json.dumps(rows)


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    return request.config.stash[SEED]


def _asked_for(config: pytest.Config) -> bool:
    """True when the command line names tests/chaos (or something inside it)."""
    here = Path(__file__).parent.resolve()
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == here or here in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    # The campaign stops the shared ZooKeeper and PostgreSQL: a plain 'pytest' over
    # tests/ must not run it in the middle of other tests.
    alone = pytest.mark.skip(
        reason="the chaos campaign stops shared services: run it alone, "
        "'pytest tests/chaos' (scripts/test.sh does, on a stack of its own)"
    )
    asked = _asked_for(config)
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.chaos)
            if not asked:
                item.add_marker(alone)


def pytest_sessionstart(session: pytest.Session) -> None:
    """The seed, printed before anything runs, even with -q (a run killed midway stays
    replayable); by the controller only when workers run the cases."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if _asked_for(config) and reporter is not None and not hasattr(config, "workerinput"):
        reporter.write_line(
            f"chaos: CHAOS_SEED={config.stash[SEED]} (replay the randomized mode with it)"
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "chaos_round" in metafunc.fixturenames:
        rounds = _rounds()
        metafunc.parametrize("chaos_round", range(1, rounds + 1), ids=lambda r: f"round{r}")


@pytest.fixture
def stack(stack_env: dict[str, str], zk_hosts: str, postgres_url: str) -> Iterator[faults.Stack]:
    control = faults.Stack(stack_env)
    yield control
    control.restore()


@pytest.fixture
def trial(
    request: pytest.FixtureRequest,
    chaos_round: int,
    stack_env: dict[str, str],
    database_url: str,
    zk_root: str,
    s3_bucket: str,
    zk_hosts: str,
    tmp_path: Path,
) -> Iterator[Trial]:
    with _recorded(
        request, chaos_round, stack_env, database_url, zk_root, s3_bucket, tmp_path
    ) as t:
        yield t


@pytest.fixture
def pg_pair(tmp_path: Path) -> Iterator[faults.PgPair]:
    """A PostgreSQL primary with a synchronous standby of the case's own (the stack's
    single PostgreSQL stays intact for the other cases), brought down at the end."""
    reason = faults.PgPair.unavailable()
    if reason:
        conftest.unavailable(reason)
    pair = faults.PgPair(tmp_path / "pg-pair")
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


@pytest.fixture
def pg_pair_trial(
    request: pytest.FixtureRequest,
    chaos_round: int,
    stack_env: dict[str, str],
    pg_pair: faults.PgPair,
    zk_root: str,
    s3_bucket: str,
    zk_hosts: str,
    tmp_path: Path,
) -> Iterator[Trial]:
    """``trial`` on :func:`pg_pair`'s multi-host URL: the servers, the harness and the
    checker all follow the primary through a failover."""
    cluster_root = tmp_path / "cluster"
    cluster_root.mkdir()
    with _recorded(
        request, chaos_round, stack_env, pg_pair.url, zk_root, s3_bucket, cluster_root
    ) as t:
        yield t


@contextlib.contextmanager
def _recorded(
    request: pytest.FixtureRequest,
    chaos_round: int,
    stack_env: dict[str, str],
    database_url: str,
    zk_root: str,
    s3_bucket: str,
    root: Path,
) -> Iterator[Trial]:
    """A trial named after the case, whose outcome joins the campaign's results whatever
    the case's own result."""
    fault = request.node.originalname.removeprefix("test_").replace("_", " ")
    variant = re.sub(r"-?round\d+-?", "", request.node.callspec.id)
    if variant:
        fault += f" ({variant})"
    t = Trial(
        fault,
        chaos_round,
        stack_env,
        database_url,
        zk_root,
        s3_bucket,
        root,
        fork_servers=True,
    )
    try:
        yield t
    finally:
        outcome = t.outcome
        call = getattr(request.node, "chaos_call", None)
        # An xfail case (a known hole, named in its marker) reports as skipped.
        expected = getattr(call, "wasxfail", None)
        if expected is not None:
            outcome.expected = expected or "xfail"
        if call is not None and call.skipped and expected is None:
            outcome.skipped = str(call.longrepr[2]) if isinstance(call.longrepr, tuple) else "skip"
        elif call is not None and (call.failed or call.skipped) and not outcome.violations:
            crash = getattr(call.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(call.longrepr)
            outcome.error = message.strip().splitlines()[0][:200]
        request.config.stash[RESULTS].append(outcome)
        t.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.when == "call" or (report.when == "setup" and report.skipped):
        item.chaos_call = report  # type: ignore[attr-defined]
    return report


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    results = config.stash.get(RESULTS, [])
    if not results:
        return
    tr = terminalreporter
    tr.section("chaos campaign")
    header = (
        f"{'fault':<52} {'rnd':>3} {'inj':>3} {'jobs':>4} {'double':>6} {'early':>5} {'stale':>5} "
        f"{'lost':>4} {'resur':>5} {'corrupt':>7} {'batch':>5} {'budget':>6} {'restarts':>8} "
        f"{'2nd':>3} {'master':>6} {'fires':>5} {'alerts':>6} {'adopt':>5} {'warm':>4} "
        f"{'recovery s':>10}  result"
    )
    tr.write_line(header)
    tr.write_line("-" * len(header))
    for o in results:
        tr.write_line(
            f"{o.fault[:52]:<52} {o.round:>3} {o.injected:>3} {o.jobs:>4} {o.double_runs:>6} "
            f"{o.early:>5} "
            f"{o.stale_writes:>5} {o.lost:>4} {o.resurrected:>5} {o.corrupt_starts:>7} "
            f"{o.batch:>5} {o.budget:>6} "
            f"{o.restarts:>8} {o.double_restarts:>3} {o.master:>6} {o.fires:>5} {o.alerts:>6} "
            f"{o.adoptions:>5} {o.warm_claims:>4} "
            f"{_fmt(o.recovery_s):>10}  {o.verdict}"
        )
        for problem in o.problems[:12]:
            tr.write_line(f"    {problem}")
        for note in o.notes:
            tr.write_line(f"    note: {note}")
        if o.error:
            tr.write_line(f"    error: {o.error}")
        if o.skipped:
            tr.write_line(f"    skipped: {o.skipped}")
    ran = [o for o in results if not o.skipped]
    recoveries = [o.recovery_s for o in ran if o.recovery_s is not None]
    totals = {
        "cases": len(results),
        "skipped": len(results) - len(ran),
        "faults_injected": sum(o.injected for o in ran),
        "double_runs": sum(o.double_runs for o in ran),
        "early_handoffs": sum(o.early for o in ran),
        "stale_writes_accepted": sum(o.stale_writes for o in ran),
        "lost_jobs": sum(o.lost for o in ran),
        "resurrected_jobs": sum(o.resurrected for o in ran),
        "corrupt_starts": sum(o.corrupt_starts for o in ran),
        "batch_reruns": sum(o.batch for o in ran),
        "budget_overruns": sum(o.budget for o in ran),
        "second_restarts": sum(o.double_restarts for o in ran),
        "master_fault_costs": sum(o.master for o in ran),
        "fire_problems": sum(o.fires for o in ran),
        "alert_problems": sum(o.alerts for o in ran),
        "alert_deliveries": sum(o.deliveries for o in ran),
        "alerts_sent_again": sum(o.resent for o in ran),
        "adoptions": sum(o.adoptions for o in ran),
        "warm_claims": sum(o.warm_claims for o in ran),
        "events_pruned": sum(o.pruned for o in ran),
        "worst_recovery_s": max(recoveries) if recoveries else None,
    }
    tr.write_line("-" * len(header))
    tr.write_line("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    path = os.environ.get("CHAOS_RESULTS")
    if path:
        payload = {
            "totals": totals,
            "cases": [{**dataclasses.asdict(o), "verdict": o.verdict} for o in results],
        }
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")
        tr.write_line(f"results written to {path}")
