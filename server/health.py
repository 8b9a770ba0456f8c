"""The health monitor: what each local driver's Spark application is doing, and flags.

A side thread of the server. Every ``interval`` seconds, for each run this server's
runner has in phase ``running``, it reads the new bytes of the driver's log (the UI
port, streaming progress: ``server/spark_status.py``), asks the driver's REST API for
the application and its executors, and records what it saw in ``run_health``
(``scheduler/run_health.py``). Two flags, from :func:`assess`:

- ``waiting_for_resources``: the application has had no executor cores for the job's
  resource-wait timeout (a full standalone cluster: "Initial job has not accepted any
  resources");
- ``stalled``: once a streaming query has started, no new batch completed for the
  job's stall timeout (a query that failed while its driver lives on included).

Raising or clearing a flag appends an event and moves a metric; nothing is restarted
unless the job opted in (``sparkring.health.restartOnStall``), in which case a stall
restarts the job (a new generation, as ``sparkring job restart``), at most once per run,
with ``jobs.restart_run``: fenced by this incarnation and the run's epoch (a run that
moved on is never restarted from here) and paid from the job's restart budget (a query
that can never finish a batch within the timeout is restarted ``max_restarts`` times;
its next stall ends it FAILED, event ``failed`` with cause ``stalled``, as a crash past
the budget does, and the monitor kills that driver: the one driver it ever touches).
The restart counts as asked only once its write committed.

Durations ("no batch for ...", "no cores for ...") are measured on the lease clock
(``watchdog.lease_clock``, CLOCK_BOOTTIME), never on the wall clock: a clock step must
not flag, let alone restart, every job of a host. Wall times are only shown and
recorded (``run_health``, events).

Apart from that failed run's driver, the monitor never touches a lease or a driver: it
writes with its own connection, and
an error in one pass (PostgreSQL, a driver's UI) is logged and the next pass runs.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import statistics
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from scheduler import distribution, health_policy, job_spec, jobs, loop, run_health
from server import metrics, reconcile, rundir, spark_status, watchdog
from server.runs import Run
from sql.states import HealthFlag

log = logging.getLogger(__name__)

# The most log bytes read per run and pass: a driver logging faster than this is
# caught up over several passes (progress is never lost, only later).
MAX_READ_BYTES = 8 * 1024 * 1024
# The UI port is logged while the SparkContext starts: within this many first bytes.
HEAD_BYTES = 1024 * 1024
# A row is written when something changed, and at least this often, seconds.
REWRITE_INTERVAL_S = 30.0
# Drivers' UIs probed at once, and how long a pass waits for them: a probe is bounded at
# about 1.5 x spark_status.REST_TIMEOUT_S a request (server/bounded_http.py).
PROBE_WORKERS = 8
PROBE_WAIT_S = 1.5 * spark_status.REST_TIMEOUT_S


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Instant:
    """One moment of a pass on both clocks."""

    wall: dt.datetime  # shown and recorded only
    mono: float  # watchdog.lease_clock(), seconds: every duration is measured on it


# A streaming query is stalled when no batch completed for the policy's stall timeout,
# or for STALL_INTERVALS of its typical interval between batches if that is longer: a
# query triggered every 10 minutes is not stalled 5 minutes after its last batch (the
# Flink operator's false restarts, FLINK-37354 and FLINK-34131, came from one fixed
# number). Typical: the median of the last BATCH_GAPS gaps, so one long pause does not
# stretch the window; at least two gaps are needed.
STALL_INTERVALS = 3
BATCH_GAPS = 10


def stall_timeout(configured: float, gaps: Sequence[float]) -> float:
    """The stall window of a query whose recent gaps between batches were ``gaps``."""
    interval = batch_interval(gaps)
    return configured if interval is None else max(configured, STALL_INTERVALS * interval)


def batch_interval(gaps: Sequence[float]) -> float | None:
    """The typical interval between a query's batches (seconds), None while unknown."""
    recent = list(gaps)[-BATCH_GAPS:]
    return statistics.median(recent) if len(recent) >= 2 else None


@dataclass
class Tracker:
    """What the monitor knows of one run (job at epoch); see :func:`assess`.

    Its ``float`` times are lease-clock seconds (:class:`Instant`), its ``datetime``
    ones wall-clock times, only shown and recorded."""

    job_id: int
    name: str
    kind: str
    epoch: int
    log_file: Path
    policy: health_policy.Policy
    # When tracking began (the run was seen running): waits are counted from it.
    since: float
    # The incarnation holding the run (the runner's): a restart is fenced by it and epoch.
    owner: distribution.Owner | None = None
    offset: int = 0
    rest: bytes = b""
    ui_port: int | None = None
    # The UI port its server gave the driver (rundir.UI_FILE); None: not known (a run of
    # the older code, a job's own spark.ui.port), and any port its log names is taken.
    ui_base: int | None = None

    def take_ui_port(self, port: int | None) -> None:
        """The port the driver's log names, if it is one its server gave (or one Spark
        moved on to from there): a line the job printed itself names any port at all,
        and the monitor would probe it."""
        if port is None:
            return
        base = self.ui_base
        if base is None or base <= port <= base + rundir.UI_PORT_RETRIES:
            self.ui_port = port
        elif self.ui_port is None:
            log.warning(
                "job %s: its log names the UI port %d, not the %d its server gave it: not probed",
                self.name,
                port,
                base,
            )

    app: spark_status.Application | None = None
    reachable: bool = True
    cores_seen_at: float | None = None
    # When executor cores came (back): a query cannot progress without them, so a stall
    # is counted from then at the earliest.
    cores_came_at: float | None = None
    # A streaming query has started (or reported progress): from then on it is judged.
    query_seen: bool = False
    query_started_at: float | None = None
    query_error: str | None = None  # the last query's failure, until another starts
    last_batch_id: int | None = None
    last_batch_at: dt.datetime | None = None  # its completion as the driver logged it
    last_batch_done: float | None = None  # the same on the lease clock (observe_progress)
    # Seconds between consecutive batches' completions, as the driver logged them (a
    # heuristic for the stall window: a wall clock step makes one gap an outlier).
    batch_gaps: list[float] = field(default_factory=list)
    input_rate: float | None = None
    processing_rate: float | None = None
    flag: HealthFlag | None = None
    flagged_at: dt.datetime | None = None
    looked_at: float | None = None  # the previous pass
    restart_asked: bool = False  # a restart was decided (done, fenced or refused)
    written: tuple[Any, ...] | None = None
    written_at: float | None = None
    notes: list[str] = field(default_factory=list)

    def observe_queries(self, scan: spark_status.LogScan, now: Instant) -> None:
        """Queries that started or failed in the newly read log (before its progress)."""
        if scan.queries_started:
            self.query_seen = True
            self.query_started_at = now.mono
            self.query_error = None
        if scan.query_errors:
            self.query_seen = True
            self.query_error = scan.query_errors[-1]

    def observe_progress(self, events: list[spark_status.Progress], now: Instant) -> None:
        """Progress events in the newly read log.

        A batch's completion on the lease clock is this pass minus its age by the
        driver's timestamp (the host's wall clock), the age taken as no more than the
        time since the previous pass: it completed after that pass read the log. So a
        wall clock step moves it by one pass interval at most, and a run's first pass
        (an adopted driver's old batches) counts its batches as completed now."""
        since_look = now.mono - (self.since if self.looked_at is None else self.looked_at)
        for event in events:
            self.query_seen = True
            self.input_rate = event.input_rows_per_second
            self.processing_rate = event.processed_rows_per_second
            if self.last_batch_id is None or event.batch_id > self.last_batch_id:
                if self.last_batch_at is not None:
                    gap = (event.completed_at - self.last_batch_at).total_seconds()
                    if gap >= 0:
                        self.batch_gaps = [*self.batch_gaps[-(BATCH_GAPS - 1) :], gap]
                self.last_batch_id = event.batch_id
                self.last_batch_at = event.completed_at
                age = (now.wall - event.completed_at).total_seconds()
                self.last_batch_done = now.mono - min(max(age, 0.0), max(since_look, 0.0))

    def observe_application(self, app: spark_status.Application | None, now: Instant) -> None:
        self.reachable = app is not None
        if app is None:
            return
        had_cores = self.app is not None and self.app.cores > 0
        self.app = app
        if app.cores > 0:
            self.cores_seen_at = now.mono
            if not had_cores:
                self.cores_came_at = now.mono

    @property
    def app_state(self) -> str:
        if self.ui_port is None:
            return "starting"
        if not self.reachable:
            return "unreachable"
        if self.app is not None and self.app.completed:
            return "completed"
        return "running" if self.app is not None else "starting"


def assess(tracker: Tracker, now: float) -> tuple[HealthFlag | None, dict[str, Any]]:
    """The flag the run deserves at ``now`` (lease clock), and the facts behind it (for
    its event).

    Waiting for resources comes first: a query without executors cannot progress."""
    policy = tracker.policy
    app = tracker.app
    if tracker.reachable and app is not None and not app.completed and app.cores == 0:
        cores_seen = tracker.since if tracker.cores_seen_at is None else tracker.cores_seen_at
        without = now - cores_seen
        if without >= policy.resource_wait_timeout:
            return HealthFlag.WAITING_FOR_RESOURCES, {
                "without_cores_s": round(without, 1),
                "timeout_s": policy.resource_wait_timeout,
                "executors": app.executors,
            }
    if tracker.kind == "streaming" and tracker.query_seen:
        starts = (
            tracker.since,
            tracker.last_batch_done,
            tracker.cores_came_at,
            tracker.query_started_at,
        )
        idle = now - max(t for t in starts if t is not None)
        timeout = stall_timeout(policy.stall_timeout, tracker.batch_gaps)
        if idle >= timeout:
            detail: dict[str, Any] = {
                "last_batch_id": tracker.last_batch_id,
                "last_batch_at": (
                    None if tracker.last_batch_at is None else str(tracker.last_batch_at)
                ),
                "no_batch_for_s": round(idle, 1),
                "timeout_s": timeout,
            }
            if (interval := batch_interval(tracker.batch_gaps)) is not None:
                detail["batch_interval_s"] = round(interval, 1)
            if tracker.query_error is not None:
                detail["query_error"] = tracker.query_error
            return HealthFlag.STALLED, detail
    return None, {}


def read_new(path: Path, offset: int, limit: int = MAX_READ_BYTES) -> tuple[bytes, int]:
    """Bytes of ``path`` from ``offset`` (at most ``limit``) and the next offset; a file
    that shrank (replaced) is read again from its start."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read(limit)
    except OSError:
        return b"", offset
    return data, offset + len(data)


class HealthMonitor(loop.Loop):
    def __init__(
        self,
        engine: sa.Engine,
        server: str,
        advertise_host: str,
        runs: Callable[[], dict[int, Run]],
        kill_as: Callable[[int, int, Callable[[sa.Connection], object]], Run | None],
        *,
        interval: float,
        stall_timeout: float,
        resource_wait_timeout: float,
        clock: Callable[[], float] = watchdog.lease_clock,
        wall_clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self.engine = engine
        self.server = server
        self.advertise_host = advertise_host
        self._runs = runs
        # Runner.kill_as: the run whose driver is to be killed, recorded as told after.
        self._kill_as = kill_as
        self.stall_timeout = stall_timeout
        self.resource_wait_timeout = resource_wait_timeout
        self._clock = clock
        self._wall_clock = wall_clock
        self.trackers: dict[tuple[int, int], Tracker] = {}
        # The UI probes in flight, one per run at most (_probe).
        self._probes: dict[tuple[int, int], futures.Future[spark_status.Application]] = {}
        self._pool = futures.ThreadPoolExecutor(PROBE_WORKERS, thread_name_prefix="health-probe")
        super().__init__(
            "health-monitor",
            join_timeout=spark_status.REST_TIMEOUT_S * 4,
            interval=interval,
            first_wait=interval,
        )

    # ------------------------------------------------------------------ thread

    def stop(self, timeout: float | None = None) -> None:
        super().stop(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def flagged(self, flag: HealthFlag) -> int:
        return sum(1 for t in self.trackers.values() if t.flag == flag)

    def step(self) -> None:
        try:
            self.check_once()
        except Exception:  # one bad pass must not end the monitor
            log.exception("health check failed; next pass in %.1f s", self.interval)

    # ------------------------------------------------------------------ one pass

    def check_once(self, now: dt.datetime | None = None, mono: float | None = None) -> None:
        """One pass over the local runs (tests call it directly, with both clocks' times:
        ``now`` the wall clock's, ``mono`` the lease clock's)."""
        at = Instant(
            self._wall_clock() if now is None else now, self._clock() if mono is None else mono
        )
        running = {
            (run.job_id, run.epoch): run
            for run in self._runs().values()
            if run.phase == reconcile.Phase.RUNNING and run.driver is not None
        }
        for key in list(self.trackers):
            if key not in running:
                del self.trackers[key]
                self._probes.pop(key, None)
        checked: list[tuple[tuple[int, int], Tracker]] = []
        for key, run in running.items():
            tracker = self.trackers.get(key)
            if tracker is None:
                tracker = self._track(run, at.mono)
                if tracker is None:
                    continue
                self.trackers[key] = tracker
            tracker.owner = run.owner
            self._read_log(tracker, at)
            checked.append((key, tracker))
        # Every driver's UI at once, each on a thread of its own: a driver whose UI
        # answers slowly (or never) cannot hold the others' checks.
        apps = self._probe([(key, t) for key, t in checked if t.ui_port is not None])
        for key, tracker in checked:
            self._judge(tracker, at, apps.get(key))

    def _track(self, run: Run, now: float) -> Tracker | None:
        assert run.driver is not None
        policy = self._policy(run)
        if policy is None:
            return None
        tracker = Tracker(
            job_id=run.job_id,
            name=run.name,
            kind=run.kind,
            epoch=run.epoch,
            log_file=run.driver.log_file,
            policy=policy,
            since=now,
            owner=run.owner,
            ui_base=rundir.read_ui_port(run.driver.run_dir),
        )
        # A long log (an adopted driver's): its head names the UI port, its last
        # MAX_READ_BYTES hold the recent progress; what lies between is history.
        try:
            size = tracker.log_file.stat().st_size
        except OSError:
            size = 0
        if size > MAX_READ_BYTES:
            head, _ = read_new(tracker.log_file, 0, HEAD_BYTES)
            tracker.take_ui_port(spark_status.scan_log(head).ui_port)
            tracker.offset = size - MAX_READ_BYTES
        return tracker

    def _policy(self, run: Run) -> health_policy.Policy | None:
        """The health policy of the run's revision (the job's conf if it has none)."""
        try:
            with self.engine.connect() as conn:
                conf = jobs.definition_of_run(conn, run.job_id, run.revision).conf
        except job_spec.JobNotFound:
            return None  # deleted meanwhile
        try:
            return health_policy.of(conf, self.stall_timeout, self.resource_wait_timeout)
        except health_policy.PolicyError as exc:
            log.warning("job %s: %s; using the server's defaults", run.name, exc)
            return health_policy.of({}, self.stall_timeout, self.resource_wait_timeout)

    def ui_url(self, tracker: Tracker) -> str | None:
        if tracker.ui_port is None:
            return None
        return f"http://{self.advertise_host}:{tracker.ui_port}"

    def _probe(
        self, targets: list[tuple[tuple[int, int], Tracker]]
    ) -> dict[tuple[int, int], spark_status.Application]:
        """The application of each target's UI that answered within PROBE_WAIT_S. A probe
        still running then is left running (bounded: server/bounded_http.py) and read at
        a later pass; none is asked twice at once."""
        for key, tracker in targets:
            if key not in self._probes:
                url = f"http://127.0.0.1:{tracker.ui_port}"
                self._probes[key] = self._pool.submit(spark_status.application, url)
        futures.wait([self._probes[key] for key, _ in targets], timeout=PROBE_WAIT_S)
        apps: dict[tuple[int, int], spark_status.Application] = {}
        for key, tracker in targets:
            probe = self._probes[key]
            if not probe.done():
                continue
            del self._probes[key]
            try:
                apps[key] = probe.result()
            except spark_status.UnreachableError as exc:
                log.debug("job %s: %s", tracker.name, exc)
        return apps

    def _read_log(self, tracker: Tracker, now: Instant) -> None:
        data, tracker.offset = read_new(tracker.log_file, tracker.offset)
        scan = spark_status.scan_log(tracker.rest + data)
        if len(scan.rest) > MAX_READ_BYTES:
            scan.rest = b""  # a line without end this long is no progress block
        tracker.rest = scan.rest
        tracker.take_ui_port(scan.ui_port)
        tracker.observe_queries(scan, now)
        tracker.observe_progress(scan.progress, now)

    def _judge(self, tracker: Tracker, now: Instant, app: spark_status.Application | None) -> None:
        """Flag (or clear) the run from what its log and its UI (``app``: None when it
        did not answer this pass) said, and record it."""
        if tracker.ui_port is not None:
            tracker.observe_application(app, now)
        tracker.looked_at = now.mono
        flag, detail = assess(tracker, now.mono)
        previous = tracker.flag
        if flag != previous:
            tracker.flag = flag
            tracker.flagged_at = now.wall if flag is not None else None
        self._write(tracker, now, previous, detail)
        if flag == HealthFlag.STALLED and tracker.policy.restart_on_stall:
            self._restart(tracker, detail)

    def _report(self, tracker: Tracker) -> run_health.Report:
        app = tracker.app
        return run_health.Report(
            job_id=tracker.job_id,
            epoch=tracker.epoch,
            server=self.server,
            app_state=tracker.app_state,
            app_id=app.app_id if app else None,
            ui_url=self.ui_url(tracker),
            executors=app.executors if app else None,
            cores=app.cores if app else None,
            last_batch_id=tracker.last_batch_id,
            last_batch_at=tracker.last_batch_at,
            input_rate=tracker.input_rate,
            processing_rate=tracker.processing_rate,
            flag=tracker.flag.value if tracker.flag else None,
            flagged_at=tracker.flagged_at,
        )

    def _write(
        self,
        tracker: Tracker,
        now: Instant,
        previous: HealthFlag | None,
        detail: dict[str, Any],
    ) -> None:
        report = self._report(tracker)
        changed = tracker.flag != previous
        key = (
            report.app_state,
            report.app_id,
            report.ui_url,
            report.executors,
            report.cores,
            report.last_batch_id,
            report.flag,
        )
        stale = tracker.written_at is None or now.mono - tracker.written_at >= REWRITE_INTERVAL_S
        if key == tracker.written and not stale and not changed:
            return
        with self.engine.begin() as conn:
            written = run_health.record(conn, report)
            if written and changed:
                was = previous.value if previous else None
                run_health.flag_changed(conn, report, tracker.name, was, detail)
        tracker.written, tracker.written_at = key, now.mono
        if written and changed:
            if tracker.flag is not None:
                metrics.REGISTRY.inc(f"sparkring_health_{tracker.flag.value}_total")
                log.warning(
                    "job %s flagged %s",
                    tracker.name,
                    tracker.flag.value,
                    extra={"action": "health_flagged", "job": tracker.name, **detail},
                )
            else:
                log.info(
                    "job %s no longer %s",
                    tracker.name,
                    previous.value if previous else "flagged",
                    extra={"action": "health_cleared", "job": tracker.name},
                )

    def _restart(self, tracker: Tracker, detail: dict[str, Any]) -> None:
        """The job opted in: a stall restarts it (a new generation), once per run.

        Only while this incarnation still holds the run at the epoch watched, and with
        restarts left (``jobs.restart_run``). Asked again at the next pass until the
        write committed or was refused; a retry after a commit whose outcome was lost
        is refused (the generation moved), never a second restart."""
        if tracker.restart_asked or tracker.owner is None:
            return
        why = f"server {self.server}: stalled, no batch for {detail.get('no_batch_for_s')} s"
        facts = {"job": tracker.name, "epoch": tracker.epoch, **detail}
        try:
            with self.engine.begin() as conn:
                done = jobs.restart_run(conn, tracker.job_id, tracker.owner, tracker.epoch, why)
        except sa.exc.DBAPIError as exc:
            log.warning(
                "job %s: restart on stall not recorded, next pass asks again: %s",
                tracker.name,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                extra={"action": "restart_on_stall_retry", **facts},
            )
            return
        except job_spec.RestartBudgetSpent as exc:
            metrics.REGISTRY.inc("sparkring_health_restarts_refused_total")
            self._fail(tracker, detail, str(exc), facts)
            return
        except (distribution.FencedError, job_spec.JobError) as exc:
            tracker.restart_asked = True
            log.warning(
                "job %s: restart on stall not done: %s",
                tracker.name,
                exc,
                extra={"action": "restart_on_stall_fenced", **facts},
            )
            return
        tracker.restart_asked = True
        metrics.REGISTRY.inc("sparkring_health_restarts_total")
        log.warning(
            "job %s restarted: stalled (restart %d of %d)",
            tracker.name,
            done.restarts,
            done.max_restarts,
            extra={
                "action": "restart_on_stall",
                "generation": done.generation,
                "restarts": done.restarts,
                "max_restarts": done.max_restarts,
                **facts,
            },
        )

    def _fail(
        self, tracker: Tracker, detail: dict[str, Any], spent: str, facts: dict[str, Any]
    ) -> None:
        """A stall past the restart budget ends the job FAILED, as a crash past it does.

        The run's driver is killed first, and only then is the run recorded
        (``distribution.record_crash`` without retry, cause ``stalled``, fenced by this
        incarnation and the run's epoch): the record releases the lease, so a driver
        still alive then could meet a new claim of its job (a restart or a start that
        follows). The runner records it once the driver is dead (``Runner.kill_as``),
        retrying while PostgreSQL is away with the lease kept, as for any run's end.
        Nothing is done for a run that is no longer this server's at that epoch; a read
        that failed is asked again at the next pass."""
        owner, epoch, job_id = tracker.owner, tracker.epoch, tracker.job_id
        assert owner is not None
        error = (
            f"stalled past its restart budget: no batch for {detail.get('no_batch_for_s')} s "
            f"({spent.partition(': ')[2] or spent})"
        )
        try:
            with self.engine.connect() as conn:
                ours = distribution.holds(conn, job_id, owner, epoch)
        except sa.exc.DBAPIError as exc:
            log.warning(
                "job %s: failing it on stall not done, next pass asks again: %s",
                tracker.name,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                extra={"action": "fail_on_stall_retry", **facts},
            )
            return
        tracker.restart_asked = True

        def failed(conn: sa.Connection) -> object:
            return distribution.record_crash(
                conn, job_id, owner, epoch, error,
                retry=False, backoff_base=0.0, backoff_max=0.0, cause="stalled",
            )  # fmt: skip

        run = self._kill_as(job_id, epoch, failed) if ours else None
        if run is None or run.driver is None:
            log.warning(
                "job %s: failing it on stall not done: the run is no longer this server's",
                tracker.name,
                extra={"action": "fail_on_stall_fenced", **facts},
            )
            return
        metrics.REGISTRY.inc("sparkring_health_failed_on_stall_total")
        log.error(
            "job %s stalled past its restart budget: its driver is killed, then the job "
            "recorded FAILED: %s",
            tracker.name,
            error,
            extra={"action": "fail_on_stall", **facts},
        )
        run.driver.kill()
