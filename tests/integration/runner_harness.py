"""What the runner's integration tests (``test_runner_<step>.py``) share.

One runner, no coordinator: a test targets its job at the runner's server itself. The
driver is a tiny PySpark-free Python main run by the real spark-submit, gated on files,
so every step happens when the test says (:data:`GATED_MAIN`, :func:`go`). Runners for
these tests are ``conftest.py``'s fixtures.
"""

from __future__ import annotations

import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from resource_center import cache, catalog, store
from scheduler import job_events, job_spec, jobs
from server import runner, runs, watchdog
from sql import database
from sql.states import JobKind
from testing import factories, waiting

# The driver: records its start, waits for a "go" file, then exits with the code in it.
GATED_MAIN = textwrap.dedent(
    """
    import os, sys, time
    here = sys.argv[1]
    with open(os.path.join(here, "starts"), "a") as f:
        f.write(os.environ["SPARKRING_EPOCH"] + "\\n")
    while not os.path.exists(os.path.join(here, "go")):
        time.sleep(0.05)
    sys.exit(int(open(os.path.join(here, "go")).read() or 0))
    """
)


def go(stage: Path, exit_code: object) -> None:
    """Let the gated driver exit with ``exit_code``: its "go" file written whole, then
    renamed into place. Written in place, the driver polling for it could read it empty
    (an exit 0 for a failure: a flaky failure of
    test_a_batch_failure_as_its_migration_begins_spends_its_budget)."""
    partial = stage / "go.partial"
    partial.write_text(str(exit_code))
    partial.rename(stage / "go")


SPARK_START_S = 90  # spark-submit of a plain Python main on a busy 2-core machine
TTL = 8.0


def started(stage: Path) -> bool:
    """The gated driver wrote its start line. Its "starts" file exists a moment before
    it holds one (CI at 18d03ea: read empty right after it appeared)."""
    starts = stage / "starts"
    return starts.exists() and starts.read_text().endswith("\n")


def wait_started(stage: Path) -> None:
    """Wait until the gated driver wrote its start line."""
    waiting.wait_until(lambda: started(stage), SPARK_START_S, message="the driver did not start")


def config(tmp_path: Path, margin: float) -> runner.RunnerConfig:
    """One server, s1, with the harness's lease timings and a work dir of the test's."""
    return runner.RunnerConfig(
        server="s1",
        incarnation=uuid.uuid4().hex,
        capacity=2,
        work_dir=tmp_path / "work",
        checkpoint_root=tmp_path / "checkpoints",
        spark_master="local[1]",
        lease_ttl=TTL,
        watchdog_margin=margin,
        renew_interval=1.0,
        poll_interval=0.5,
        stop_grace=5.0,
        backoff_base=0.5,
        backoff_max=2.0,
        fetch_retry=3.0,
        records=tmp_path / "records.jsonl",
    )


def batch_job(
    engine: sa.Engine,
    bucket: store.Store,
    stage: Path,
    tmp_path: Path,
    *,
    max_retries: int | None = None,
    kind: JobKind = JobKind.BATCH,
) -> int:
    main = tmp_path / "gated.py"
    main.write_text(GATED_MAIN)
    resource = catalog.upload(engine, bucket, name="gated", path=main, max_bytes=1 << 20)
    with engine.begin() as conn:
        job_id = jobs.create(
            conn,
            job_spec.JobSpec(
                name="b",
                kind=kind,
                resource_id=resource.id,
                args=[str(stage)],
                max_restarts=max_retries,
            ),
        )
        jobs.start(conn, "b")
    factories.target(engine, job_id, "s1")
    return job_id


def kinds(database_url: str) -> list[str]:
    engine = database.create_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            return [e["kind"] for e in job_events.events(conn, "b")]
    finally:
        engine.dispose()


def stepped(
    engine: sa.Engine, bucket: store.Store, config: runner.RunnerConfig, tmp_path: Path
) -> Iterator[runner.Runner]:
    the_runner = runner.Runner(
        engine, bucket, cache.Cache(root=tmp_path / "cache", max_bytes=1 << 30), config
    )
    the_runner.registered(settle=0.0)
    yield the_runner
    for run in the_runner.runs().values():
        if run.driver is not None:
            run.driver.kill()
    the_runner.stop()


def running_batch(
    engine: sa.Engine, bucket: store.Store, the_runner: runner.Runner, stage: Path, tmp_path: Path
) -> tuple[int, runs.Run]:
    """A batch job claimed by ``the_runner``, its gated driver started and recorded running."""
    job_id = batch_job(engine, bucket, stage, tmp_path)
    the_runner.poll_once()  # claims; the driver starts in a task
    wait_started(stage)
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "running" or the_runner.poll_once() < 0,
        30,
        message="the run was not recorded running",
    )
    (run,) = the_runner.runs().values()
    return job_id, run


class HungDriver:
    """A driver handle whose kill blocks (a driver in uninterruptible sleep)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.killed = threading.Event()

    def ended(self) -> bool:
        return False

    def confirm(self, deadline: float) -> None:
        pass

    def kill(self) -> None:
        self.killed.set()
        self.release.wait(60)


class ConfirmedDriver(HungDriver):
    """A driver handle that records its confirmations (its kill returns at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.release.set()
        self.deadlines: list[float] = []

    def confirm(self, deadline: float) -> None:
        self.deadlines.append(deadline)


def local_run(the_runner: runner.Runner, job_id: int, epoch: int, deadline_in: float) -> runs.Run:
    """A running batch run ``b`` of ``the_runner`` at ``epoch``, its driver a handle."""
    run = runs.Run(
        job_id=job_id, name="b", kind=JobKind.BATCH, epoch=epoch, attempt=1,
        claimed_at=watchdog.lease_clock(), deadline=watchdog.lease_clock() + deadline_in,
        owner=the_runner.owner, phase=runner.reconcile.Phase.RUNNING,
        driver=ConfirmedDriver(),  # type: ignore[arg-type]
    )  # fmt: skip
    the_runner.table.add(run)
    return run


def streaming_job(engine: sa.Engine, bucket: store.Store, tmp_path: Path) -> int:
    main = tmp_path / "stream.py"
    main.write_text("print('never run here')\n")
    resource = catalog.upload(engine, bucket, name="stream", path=main, max_bytes=1 << 20)
    with engine.begin() as conn:
        job_id = jobs.create(
            conn, job_spec.JobSpec(name="s", kind=JobKind.STREAMING, resource_id=resource.id)
        )
        jobs.start(conn, "s")
    factories.target(engine, job_id, "s1")
    return job_id


def events(database_url: str) -> list[dict[str, object]]:
    engine = database.create_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            return job_events.events(conn, "b")
    finally:
        engine.dispose()
