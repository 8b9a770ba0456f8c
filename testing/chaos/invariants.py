"""The safety invariants S1-S5 (DESIGN.md), checked from the evidence a cluster leaves.

Pure functions over three kinds of records, so that each check is unit-tested
(``tests/chaos/test_invariants.py``) before the campaign trusts it:

- heartbeats the light driver appends every 0.2 s:
  ``{"job","epoch","server","pid","t","mono"}``;
- watchdog lifetime records: one ``started`` and one ``ended`` per driver, whose
  interval contains the driver's whole life (``docs/drivers.md``), with ``t`` and
  ``mono``;
- ``job_events`` rows (``id``, ``job_name``, ``kind``, ``server``, ``epoch``, ``detail``),
  every fenced write of a server and every operator command included.

Each check returns a list of human-readable problems; an empty list means it holds.

Clocks: ``t`` is the wall clock (``time.time()``), which an NTP step or an operator
moves; ``mono`` is CLOCK_BOOTTIME (:func:`server.watchdog.lease_clock`, the clock of
every lease deadline), which never steps and is one clock for every process of the
host. Records are compared with each other on ``mono`` whenever every record of the
comparison has it (:func:`records_clock`): heartbeat against heartbeat, life against
life, a heartbeat's age against the check's time. Only :func:`early_handoffs` still
compares on the wall clock: its events carry PostgreSQL's ``now()``, which has no
BOOTTIME (the stack runs on the watchdogs' host, so both read one wall clock). A record
written under a stepped clock (the fault ``clock_step``) is placed there by its
BOOTTIME (:func:`host_wall`).

Generations come from the events alone: an operator command that gives a job a new
generation (``start_requested`` of a terminal job, ``restart_requested``, and a
``revised`` whose new revision rolled the live run: ``scheduler/job_revisions.py``) records it in
its detail, and a claim runs the newest generation commanded before it (a claim copies
``jobs.generation`` in the same statement). The restart count, on the other hand,
survives every new generation but a re-run of a job at rest (``start_requested`` with a
generation, ``restart_requested`` with ``rerun``) and a new run of a batch job whose
old one waits unowned (``restart_requested`` with ``retries_reset``):
:func:`failed_with_cause` counts from there.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from server import spark_master, watchdog

# A driver is observed alive (S3) with a heartbeat at most this long before the check:
# the light drivers beat every 0.2 s; the rest is room for a loaded 2-core machine.
HEARTBEAT_WINDOW_S = 5.0
# Events only the owner of an epoch may write (each one a statement fenced by
# owner and epoch in scheduler/distribution/fencing.py).
OWNER_WRITES = frozenset(
    {"driver_started", "stopping", "released", "finished", "crashed", "failed", "deferred"}
)
# Events that mean a driver was (about to be) started for a job.
START_EVENTS = frozenset({"claimed", "driver_started"})
# Operator commands (scheduler/jobs.py) whose detail names the new generation they gave
# the job: the only way a job that ended may run again (S4). A ``revised`` event names
# one only when the revision rolled a live run (stop, then a claim of the new generation).
GENERATION_COMMANDS = frozenset({"start_requested", "restart_requested", "revised"})
# A driver that failed on its own: the error server/runner.py records when the driver
# process exited abnormally ("driver exited with exit code N: <log tail>"). Deferrals,
# lease losses and start-up errors are not the job's own failures.
DRIVER_FAILURE = re.compile(r"^driver exited with exit code -?\d+")
# Reasons that make FAILED legitimate without a restart budget: the artifact failed
# verification or is gone (server/runner.py "artifact refused: ..."), or the job's spec
# can never start (server/driver.py's spec validation).
INVALID_JOB = re.compile(
    r"^artifact refused: |^invalid job spec: "
    r"|invalid Spark conf key|has a newline or NUL|contains a NUL byte"
    r"|--py-files apply to Python mains|must be an absolute path|empty job name"
)


# A record whose wall clock (``t``) is further than this from its BOOTTIME (``mono``)
# moved onto the wall clock was written under a stepped clock (``host_wall``), seconds.
STEPPED_CLOCK_S = 2.0
# A freeze of a whole host (``freeze``: a server SIGSTOPped together with its watchdogs
# and drivers, as ``podman pause`` or a cgroup freeze would) is outside the fencing
# model once it outlasts the lease: the frozen watchdog cannot kill its driver in time.
# It is frozen too, so it runs nothing while frozen; on the thaw its watchdog sees its
# BOOTTIME deadline passed and SIGKILLs it at once, but the driver may be scheduled first
# and beat for a moment beside its successor. That moment, up to this bound after the
# thaw, is the model's documented margin (docs/chaos.md); anything longer is reported.
FREEZE_THAW_BOUND_S = 1.0
# A batch driver that exits 0 just before its host freezes: its watchdog records the
# exit (importing what it writes with, connecting, committing: about a second on a busy
# 2-core host) and may be frozen before it commits. The lease then lapses, another server
# claims the job, and the generation runs again: a host lost between a batch driver's
# exit and its record is outside the model (docs/drivers.md, "What a batch job may see
# twice"). Excused only when that exit was never recorded and the freeze began within
# this bound after it.
FREEZE_RECORD_BOUND_S = 5.0
# A batch driver that exits 0 while its server is cut off from PostgreSQL (a partition,
# or a link dropping most packets): neither its watchdog nor its server can record the
# exit; the lease lapses, another server reaps and claims the job, and once claimed the
# old owner's record is refused (docs/distribution.md: the reap keeps who it reaped, so
# a record that lands before the claim still counts). A claim made before the cut healed
# runs the generation again: the outcome was unknowable to it. Excused only when the exit
# was never recorded, came within the cut or this bound before it (the record's import,
# connect and commit), and the generation's next driver started before the heal or within
# this bound after it (the owner, back on PostgreSQL, records at its next poll; the next
# driver starts a moment after its claim).
CUT_RECORD_BOUND_S = 5.0


@dataclasses.dataclass(frozen=True)
class Cut:
    """One cut of ``server`` from PostgreSQL, from ``start`` (just before it) to ``end``
    (just after the heal), on ``clock`` (``t`` or ``mono``), as :class:`Freeze`."""

    server: str
    start: float
    end: float
    clock: str = "t"


@dataclasses.dataclass(frozen=True)
class Freeze:
    """One freeze of ``server``'s host: from ``start`` (every process stopped) to ``end``
    (just before the SIGCONT), on ``clock`` (``t`` or ``mono``: a comparison uses the
    freezes on its records' clock)."""

    server: str
    start: float
    end: float
    clock: str = "t"


def _running(
    server: str, start: float, end: float, freezes: Sequence[Freeze]
) -> tuple[list[tuple[float, float]], Freeze | None]:
    """The parts of a driver's span [start, end] on ``server`` in which it could run:
    the span minus, for each freeze of its server that it was alive for (it started
    before the thaw), the frozen time and FREEZE_THAW_BOUND_S after the thaw. Also the
    last such freeze, to name in a report."""
    pieces = [(start, end)]
    excused = None
    for f in freezes:
        if f.server != server or start >= f.end or end <= f.start:
            continue
        excused = f
        cut_from, cut_to = f.start, f.end + FREEZE_THAW_BOUND_S
        pieces = [
            part
            for a, b in pieces
            for part in ((a, min(b, cut_from)), (max(a, cut_to), b))
            if part[1] > part[0]
        ]
    return pieces, excused


Span = tuple[str, str, float, float]  # label, server, start, end


def _frozen_through(life: _Life, t: float, freezes: Sequence[Freeze]) -> bool:
    """Whether ``life`` counts as not running at ``t`` because a freeze of its server
    (on the clock of ``t`` and the life) covered it: it was alive when its server froze,
    ``t`` falls in the freeze or within FREEZE_THAW_BOUND_S after the thaw, and its
    ``ended`` record came within that bound after the thaw."""
    return life.end is not None and any(
        f.server == life.server
        and life.start < f.end
        and f.start <= t <= f.end + FREEZE_THAW_BOUND_S
        and life.end <= f.end + FREEZE_THAW_BOUND_S
        for f in freezes
    )


def _overlapping(
    spans: Mapping[str, list[Span]], margin: float, freezes: Sequence[Freeze] = ()
) -> list[str]:
    problems = []
    for job, items in sorted(spans.items()):
        items = sorted(items, key=lambda item: item[2])
        for a, b in itertools.combinations(items, 2):
            if not freezes:
                overlap = min(a[3], b[3]) - max(a[2], b[2])
                if overlap > margin:
                    problems.append(f"{job}: {a[0]} and {b[0]} overlap by {overlap:.3f} s")
                continue
            a_runs, a_freeze = _running(a[1], a[2], a[3], freezes)
            b_runs, b_freeze = _running(b[1], b[2], b[3], freezes)
            overlap = sum(
                max(0.0, min(x[1], y[1]) - max(x[0], y[0])) for x in a_runs for y in b_runs
            )
            if overlap > margin:
                problem = f"{job}: {a[0]} and {b[0]} overlap by {overlap:.3f} s"
                for f in (a_freeze, b_freeze):
                    if f is not None:
                        problem += (
                            f" (beyond the freeze of {f.server} and the "
                            f"{FREEZE_THAW_BOUND_S:g} s allowed after the thaw at {f.end:.3f})"
                        )
                problems.append(problem)
    return problems


def heartbeat_overlaps(
    records: Iterable[Mapping[str, Any]], margin: float = 0.0, freezes: Sequence[Freeze] = ()
) -> list[str]:
    """S1 from heartbeats: two driver processes of one job beating in the same instant.

    A driver's span runs from its first to its last heartbeat; two spans of one job
    that overlap by more than ``margin`` seconds are a double run. A driver is
    (job, server, pid): pids of different servers (hosts, namespaces) may coincide.
    Beats are compared on ``mono`` (BOOTTIME) when every one carries it, else on ``t``.
    ``freezes`` (on that clock) excuse what :func:`_running` says, nothing more.
    """
    records = list(records)
    clock = records_clock(records)
    first_last: dict[tuple[str, str, int], list[float]] = {}
    for r in records:
        key = (r["job"], str(r.get("server")), r["pid"])
        span = first_last.setdefault(key, [r[clock], r[clock]])
        span[0], span[1] = min(span[0], r[clock]), max(span[1], r[clock])
    spans: dict[str, list[Span]] = defaultdict(list)
    for (job, server, pid), (start, end) in first_last.items():
        spans[job].append((f"pid {pid} on {server}", server, start, end))
    return _overlapping(spans, margin, [f for f in freezes if f.clock == clock])


def lifetime_overlaps(
    records: Iterable[Mapping[str, Any]],
    margin: float = 0.0,
    now: float | None = None,
    freezes: Sequence[Freeze] = (),
) -> list[str]:
    """S1 from the watchdogs' lifetime records; a driver with no ``ended`` record is
    alive until ``now`` (on the records' clock, :func:`records_clock`; default: that
    clock read now). A driver is (job, epoch, server, pid): two incarnations of one
    server id may each start a driver for the same epoch. ``freezes`` as in
    :func:`heartbeat_overlaps`."""
    records = list(records)
    clock = records_clock(records)
    if now is None:
        now = watchdog.lease_clock() if clock == "mono" else time.time()
    spans: dict[str, list[Span]] = defaultdict(list)
    for life in _lives(records, clock):
        end = now if life.end is None else life.end
        spans[life.job].append((life.label, life.server, life.start, end))
    return _overlapping(spans, margin, [f for f in freezes if f.clock == clock])


@dataclasses.dataclass
class _Life:
    """One driver's life from its watchdog's records."""

    job: str
    epoch: int
    server: str
    pid: int | None
    start: float
    end: float | None = None  # None: no ``ended`` record (alive, or its end unproven)
    reason: str | None = None
    exit_code: int | None = None
    stopping: bool = False  # its watchdog's word: it ended while being stopped

    @property
    def label(self) -> str:
        return f"epoch {self.epoch} on {self.server} (pid {self.pid})"

    @property
    def ran_to_its_end(self) -> bool:
        return self.reason == "exited" and self.exit_code == 0

    @property
    def ending(self) -> str:
        """How its records say it ended, for a problem's message."""
        if self.end is None:
            return "no ended record"
        return f"{self.reason} (exit code {self.exit_code})"


def records_clock(records: Iterable[Mapping[str, Any]]) -> str:
    """The one clock a set of records can be compared on: ``mono`` (CLOCK_BOOTTIME,
    :func:`server.watchdog.lease_clock`: never steps) when every record carries it,
    else ``t`` (the wall clock), never a mix of the two."""
    return "mono" if all("mono" in r for r in records) else "t"


def host_wall(record: Mapping[str, Any], boot_to_wall: float) -> float:
    """A record's time on the host's true wall clock (PostgreSQL's, the harness's): its
    ``t``, unless that disagrees with its ``mono`` by more than STEPPED_CLOCK_S (it was
    written under a stepped clock: the fault ``clock_step``); then ``mono`` moved onto
    the wall clock by ``boot_to_wall`` (true wall minus BOOTTIME, read at the check).
    Below the bound ``t`` wins: NTP slews the wall clock against BOOTTIME by
    milliseconds over a run, and ``t`` is the clock PostgreSQL reads."""
    t = float(record["t"])
    if "mono" not in record:
        return t
    placed = float(record["mono"]) + boot_to_wall
    return placed if abs(t - placed) > STEPPED_CLOCK_S else t


def boot_to_wall_now() -> float:
    """The host's wall clock minus BOOTTIME, now (read by the checker, whose clock no
    fault steps)."""
    return time.time() - watchdog.lease_clock()


def _lives(
    records: Iterable[Mapping[str, Any]], clock: str = "auto", boot_to_wall: float | None = None
) -> list[_Life]:
    """Pair each ``started`` record with its first ``ended`` record (same job, epoch,
    server and driver pid); an ``ended`` record without a start is ignored. A driver its
    watchdog killed stops running at the ``killed`` record (the first SIGKILL round:
    nothing signalled runs another instruction of its own), however much later it was
    reaped or, its watchdog hung, swept; unless an ``ended`` record counts
    ``late_kills`` (a descendant outside the group, killed only later). Times are on
    ``clock`` (``auto``: :func:`records_clock` of the records; ``wall``: the host's true
    wall clock, :func:`host_wall`)."""
    records = list(records)
    if clock == "auto":
        clock = records_clock(records)
    if clock == "wall":
        offset = boot_to_wall_now() if boot_to_wall is None else boot_to_wall
        records = [{**r, "wall": host_wall(r, offset)} for r in records]
    lives: dict[tuple[str, int, str, Any], _Life] = {}
    ends: dict[tuple[str, int, str, Any], Mapping[str, Any]] = {}
    kills: dict[tuple[str, int, str, Any], float] = {}
    late: set[tuple[str, int, str, Any]] = set()
    for r in records:
        key = (r["job"], int(r["epoch"]), str(r["server"]), r.get("pid"))
        if r["event"] == "started":
            lives[key] = _Life(key[0], key[1], key[2], key[3], float(r[clock]))
        elif r["event"] == "ended":
            # The first: the watchdog's own, written once it reaped its driver. A later
            # one is the server's sweep, which writes one when it finds no result file
            # (the watchdog died before its own, or after it: a full disk), and knows
            # less about how the driver ended.
            if key not in ends:
                ends[key] = r
                if r.get("late_kills"):
                    late.add(key)
        elif r["event"] == "killed":
            kills.setdefault(key, float(r[clock]))
    for key, r in ends.items():
        life = lives.get(key)
        if life is not None:
            life.end, life.reason, life.exit_code = (
                float(r[clock]),
                r.get("reason"),
                r.get("exit_code"),
            )
            life.stopping = bool(r.get("stopping"))
    for key, killed in kills.items():
        life = lives.get(key)
        if life is not None and key not in late:
            life.end = killed if life.end is None else min(life.end, killed)
            life.reason = life.reason or "killed"
    return sorted(lives.values(), key=lambda life: (life.job, life.start))


def double_runs(
    heartbeats: Sequence[Mapping[str, Any]],
    lifetimes: Sequence[Mapping[str, Any]],
    margin: float = 0.0,
    freezes: Sequence[Freeze] = (),
) -> list[str]:
    """Every S1 violation either kind of evidence shows (``freezes``: both clocks)."""
    return heartbeat_overlaps(heartbeats, margin, freezes) + lifetime_overlaps(
        lifetimes, margin, freezes=freezes
    )


def stale_writes(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """S2 from ``job_events`` (each job's events oldest first): an owner write by an
    epoch older than the newest claim, or by a server that did not claim that epoch."""
    by_job: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for e in events:
        by_job[e["job_name"]].append(e)
    problems = []
    for job, items in sorted(by_job.items()):
        newest = 0
        claimer: dict[int, str] = {}
        for e in sorted(items, key=lambda e: e["id"]):
            if e["kind"] == "claimed":
                claimer[e["epoch"]] = e["server"]
                newest = max(newest, e["epoch"])
            elif e["kind"] in OWNER_WRITES:
                if e["epoch"] < newest:
                    problems.append(
                        f"{job}: {e['kind']} by {e['server']} at epoch {e['epoch']} "
                        f"after epoch {newest} was claimed"
                    )
                elif claimer.get(e["epoch"]) != e["server"]:
                    problems.append(
                        f"{job}: {e['kind']} by {e['server']} at epoch {e['epoch']}, "
                        f"claimed by {claimer.get(e['epoch'])}"
                    )
    return problems


def _by_job(events: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    by_job: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for e in events:
        by_job[e["job_name"]].append(e)
    return {job: sorted(items, key=lambda e: e["id"]) for job, items in by_job.items()}


def _detail(event: Mapping[str, Any]) -> Mapping[str, Any]:
    return event.get("detail") or {}


def _commanded_generation(event: Mapping[str, Any]) -> int | None:
    """The generation an operator command gave the job, or None (a command that gave
    none: ``created``, ``stop_requested``, a start that only resumed a stopping job)."""
    if event["kind"] in GENERATION_COMMANDS and "generation" in _detail(event):
        return int(_detail(event)["generation"])
    return None


def claim_generations(items: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """epoch -> generation of every claim of one job (its events, oldest first): the
    newest generation commanded before the claim."""
    generation, out = 0, {}
    for e in items:
        commanded = _commanded_generation(e)
        if commanded is not None:
            generation = max(generation, commanded)
        elif e["kind"] == "claimed":
            out[int(e["epoch"])] = generation
    return out


def _resets_restarts(event: Mapping[str, Any], at_rest: bool) -> bool:
    """Whether a command set the job's restart count back to 0 (``_RERUN`` in
    scheduler/jobs.py: only a job at rest is re-run). ``start_requested`` with a
    generation always re-ran the job; ``restart_requested`` says so in ``rerun`` (events
    written before that key existed: inferred from ``at_rest``, the job's last end or
    claim being an end). A restart of a batch job whose run waits unowned (backoff,
    pending) resets it too (``runs.fresh_retries``: ``retries_reset``). A restart of a
    live run (an operator's, or a stall's ``restart_run``) and a rolling revision keep
    the count."""
    if event["kind"] == "start_requested":
        return _commanded_generation(event) is not None
    if event["kind"] == "restart_requested":
        if _detail(event).get("retries_reset"):
            return True  # a new batch run with no driver of the old one left (M4)
        rerun = _detail(event).get("rerun")
        return bool(rerun) if rerun is not None else at_rest and "by" not in _detail(event)
    return False


def _since_restarts_reset(items: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The events since the newest command that reset the job's restart count."""
    last, at_rest = -1, False
    for i, e in enumerate(items):
        if _resets_restarts(e, at_rest):
            last, at_rest = i, False
        elif e["kind"] == "claimed":
            at_rest = False
        elif _terminal(e):
            at_rest = True
    return list(items[last + 1 :])


def restart_window(job: Mapping[str, Any]) -> float:
    """A job's restart window in seconds, as the product applies it (scheduler/
    distribution.py IN_WINDOW): a streaming job's ``restart_window_s``; 0 (none: every
    crash since the count was last reset counts) for a batch job or a row without it."""
    if job.get("kind") != "streaming":
        return 0.0
    return float(job.get("restart_window_s") or 0.0)


def spent_in_one_window(times: Iterable[float], budget: int, window: float) -> bool:
    """Whether ``budget`` spends of a restart budget (PostgreSQL times, seconds) fall
    inside one restart window: at some spend, it and the earlier spends after its time
    minus ``window`` number ``budget`` or more (the product counts, at a crash, the
    crashes after now() - window, then this one). ``window`` 0: all of them count."""
    ordered = sorted(times)
    if window <= 0:
        return len(ordered) >= budget
    return any(
        sum(1 for earlier in ordered[: i + 1] if earlier > t - window) >= budget
        for i, t in enumerate(ordered)
    )


def failed_with_cause(job: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the FAILED job ``job`` (a row with ``max_restarts``) is legitimately FAILED
    according to its events, or None if it is not: its own driver failed
    ``max_restarts + 1`` times since its restart count was last reset (a start or
    restart of the job at rest; a restart of a live run or a rolling revision keeps the
    count, so failures before it count too; a restart on a stall spends one as a failure
    does), or its artifact or spec is invalid. Batch
    and streaming alike: a batch job's ``--max-retries`` is its ``max_restarts``, so a
    batch job FAILED with retries left was failed too early. Deferrals (S3 away, a
    stall) and errors of the server never justify it."""
    current = _since_restarts_reset(items)
    ends = [e for e in current if e["kind"] in ("crashed", "failed")]
    # A restart the run's owner asked (restart-on-stall: ``restart_run``, detail "by")
    # spends one restart of the same budget, with no driver failure; a stall past the
    # budget ends the job (``failed``, cause "stalled": server/health.py) as a failure.
    spent = sum(1 for e in current if _stall_spent(e))
    errors = [str(_detail(e).get("error") or "") for e in ends]
    # The runner says why it gave up (event detail "cause": driver | invalid).
    if any(_detail(e).get("cause") == "invalid" for e in ends):
        return "invalid artifact or spec"
    if any(INVALID_JOB.search(error) for error in errors):
        return "invalid artifact or spec"
    failures = sum(1 for error in errors if DRIVER_FAILURE.match(error))
    # When each was spent (PostgreSQL's clock): a streaming job's restart window counts
    # only those inside one window (restart_window).
    times = [
        float(e.get("at_s", "nan"))
        for e in current
        if (
            e["kind"] in ("crashed", "failed")
            and DRIVER_FAILURE.match(str(_detail(e).get("error") or ""))
        )
        or _stall_spent(e)
    ]
    budget, window = int(job["max_restarts"]) + 1, restart_window(job)
    if window > 0 and len(times) == failures + spent and not any(map(math.isnan, times)):
        if spent_in_one_window(times, budget, window):
            return (
                f"its driver failed {failures} times, restarted on a stall {spent} times, "
                f"{budget} of them inside one {window:g} s restart window"
            )
        return None
    if failures + spent >= budget:
        return f"its driver failed {failures} times, restarted on a stall {spent} times"
    return None


def _stall_spent(event: Mapping[str, Any]) -> bool:
    """A stall that spent the budget: its restart on a stall, or its failure past it."""
    if event["kind"] == "restart_requested":
        return "by" in _detail(event)
    return event["kind"] == "failed" and _detail(event).get("cause") == "stalled"


def lost_jobs(
    jobs: Iterable[Mapping[str, Any]],
    live: Iterable[str],
    events: Iterable[Mapping[str, Any]],
    *,
    lifetimes: Sequence[Mapping[str, Any]],
    heartbeats: Sequence[Mapping[str, Any]],
    now: float | None = None,
    now_mono: float | None = None,
    window: float = HEARTBEAT_WINDOW_S,
) -> list[str]:
    """S3, once faults healed and the recovery bound passed: a job wanted running that
    is neither running on a live server with a driver observed behind it, nor finished,
    nor FAILED for a cause its events prove (:func:`failed_with_cause`). A FAILED job
    whose events show no such cause was lost to a fault (a transient error made
    terminal).

    The row alone proves no driver (holes H3(b), H4: a lease renewed with nothing
    behind it): a ``running`` row (``epoch`` and ``owner``) needs an un-ended lifetime
    record at (job, epoch, owner), or a heartbeat of that driver at most ``window``
    seconds before the check (``now_mono`` on BOOTTIME, ``now`` on the wall clock for
    a heartbeat without ``mono``; both default to the clocks read now). Read the rows
    before the records: a driver that ended between the two reads still has a recent
    heartbeat."""
    live = set(live)
    by_job = _by_job(events)
    observed = _observed_drivers(lifetimes, heartbeats, now, now_mono, window)
    problems = []
    for j in jobs:
        if j["desired"] != "running" or j["state"] == "finished":
            continue
        if j["state"] == "failed":
            if failed_with_cause(j, by_job.get(j["name"], [])):
                continue
            window = restart_window(j)
            inside = f" inside one {window:g} s restart window" if window > 0 else ""
            problems.append(
                f"{j['name']}: failed without its driver failing "
                f"{int(j['max_restarts']) + 1} times{inside} or an invalid artifact "
                f"(last_error {str(j.get('last_error'))[:120]!r})"
            )
            continue
        if j["state"] == "running" and j["owner"] in live:
            if (j["name"], str(j["epoch"]), j["owner"]) in observed:
                continue
            problems.append(
                f"{j['name']}: running on {j['owner']} at epoch {j['epoch']} with no live "
                f"driver observed (no un-ended lifetime record there, no heartbeat in the "
                f"last {window:g} s)"
            )
            continue
        problems.append(f"{j['name']}: {j['state']} (owner {j['owner']}, target {j['target']})")
    return problems


def _observed_drivers(
    lifetimes: Sequence[Mapping[str, Any]],
    heartbeats: Sequence[Mapping[str, Any]],
    now: float | None,
    now_mono: float | None,
    window: float,
) -> set[tuple[str, str, str]]:
    """(job, epoch as text, server) of every driver with an un-ended lifetime record or a
    heartbeat within ``window`` of the check time (heartbeats carry the epoch as text)."""
    now = time.time() if now is None else now
    now_mono = watchdog.lease_clock() if now_mono is None else now_mono
    out = {
        (life.job, str(life.epoch), life.server)
        for life in _lives(lifetimes, clock="t")
        if life.end is None
    }
    for beat in heartbeats:
        # One clock per comparison: BOOTTIME where the heartbeat has it (immune to a
        # wall-clock step), else the wall clock (a heartbeat of an older driver).
        age = now_mono - beat["mono"] if "mono" in beat else now - beat["t"]
        if age <= window:
            out.add((beat["job"], str(beat["epoch"]), str(beat.get("server"))))
    return out


def resurrections(
    before: Mapping[str, Mapping[str, Any]],
    after: Mapping[str, Mapping[str, Any]],
    events_since: Iterable[Mapping[str, Any]],
) -> list[str]:
    """S4: a job that was finished, stopped or failed before the fault changed state,
    epoch or attempt, or was claimed or started again, without an operator command."""
    problems = []
    started_again = {e["job_name"] for e in events_since if e["kind"] in START_EVENTS}
    for name, was in sorted(before.items()):
        now = after[name]
        keys = ("state", "epoch", "attempt")
        if any(was[k] != now[k] for k in keys):
            changed = ", ".join(f"{k} {was[k]} -> {now[k]}" for k in keys if was[k] != now[k])
            problems.append(f"{name}: {changed}")
        elif name in started_again:
            problems.append(f"{name}: claimed or started again")
    return problems


def early_handoffs(
    events: Iterable[Mapping[str, Any]],
    lifetimes: Iterable[Mapping[str, Any]],
    freezes: Sequence[Freeze] = (),
    boot_to_wall: float | None = None,
) -> list[str]:
    """S1 before it shows as an overlap: a lease given up, or taken, while a driver it
    fences was still alive. Events need ``at_s`` (PostgreSQL's clock, seconds since the
    epoch; the stack runs on the same host as the watchdogs).

    - ``released`` by a server at an epoch while that epoch's driver on that server had
      not ended (a release must follow the driver's end, or wait for the lease to
      expire: the watchdog kills the driver first);
    - ``claimed`` at an epoch while a driver of an older epoch of the job had not ended
      (a claim may follow only a release or an expired lease, both after the old
      driver's end).

    A driver counts as alive until its ``ended`` record, which its watchdog (or
    ``Driver.kill``) writes once every process of the group is gone: a correct hand-off
    writes it before the release, so no tolerance is needed. One exception, outside
    the model (``FREEZE_THAW_BOUND_S``): a claim while the old driver's whole host was
    frozen (``freezes`` on the wall clock), that driver having been alive at the
    freeze and ended within the bound after the thaw."""
    wall_freezes = [f for f in freezes if f.clock == "t"]

    lives_of: dict[str, list[_Life]] = defaultdict(list)
    # PostgreSQL has no BOOTTIME of this host: events and lives meet on the wall clock,
    # the true one (a record written under a stepped clock is placed by its BOOTTIME).
    for life in _lives(lifetimes, clock="wall", boot_to_wall=boot_to_wall):
        lives_of[life.job].append(life)
    problems = []

    def alive_at(life: _Life, t: float) -> bool:
        return life.start < t and (life.end is None or life.end > t)

    def late(life: _Life, t: float) -> str:
        if life.end is None:
            return "no ended record"
        return f"its ended record came {life.end - t:.3f} s later"

    for e in sorted(events, key=lambda e: e["id"]):
        if e.get("at_s") is None or e.get("epoch") is None:
            continue
        t, epoch = float(e["at_s"]), int(e["epoch"])
        job = e["job_name"]
        if e["kind"] == "released":
            for life in lives_of.get(job, []):
                if life.epoch == epoch and life.server == e["server"] and alive_at(life, t):
                    problems.append(
                        f"{job}: released by {e['server']} at epoch {epoch} (event {e['id']}) "
                        f"before its driver {life.label} provably ended ({late(life, t)})"
                    )
        elif e["kind"] == "claimed":
            for life in lives_of.get(job, []):
                frozen = _frozen_through(life, t, wall_freezes)
                if life.epoch < epoch and alive_at(life, t) and not frozen:
                    problems.append(
                        f"{job}: claimed by {e['server']} at epoch {epoch} (event {e['id']}) "
                        f"before driver {life.label} provably ended ({late(life, t)})"
                    )
    return problems


def runs_before_claim(
    events: Iterable[Mapping[str, Any]],
    lifetimes: Iterable[Mapping[str, Any]],
    boot_to_wall: float | None = None,
) -> list[str]:
    """A driver ran the job's code before its server claimed its epoch: its lifetime
    (``started`` record: for a warm driver, its go signal; docs/drivers.md "Warm
    hand-off") began before every ``claimed`` event of its job, epoch and server, or
    no such claim exists. The warm hand-off starts the next driver's JVM while the old
    one runs; only its go, written after the claim committed, lets it touch the
    checkpoint. The claim's ``at_s`` is its transaction's ``now()``, taken before the
    commit, so a correct start is never earlier: no tolerance."""
    claims: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for e in events:
        if e["kind"] == "claimed" and e.get("at_s") is not None and e.get("epoch") is not None:
            claims[(e["job_name"], int(e["epoch"]), str(e["server"]))].append(float(e["at_s"]))
    problems = []
    for life in _lives(lifetimes, clock="wall", boot_to_wall=boot_to_wall):
        times = claims.get((life.job, life.epoch, life.server), [])
        if not any(t <= life.start for t in times):
            problems.append(
                f"{life.job}: driver of epoch {life.epoch} on {life.server} ({life.label}) ran "
                f"before its claim (claims of that epoch there: {sorted(times) or 'none'})"
            )
    return problems


# Events after which a generation has ended for good: finished, failed, or released as
# stopped (detail.state, scheduler/distribution/stopping.py's release).
def _terminal(event: Mapping[str, Any]) -> bool:
    if event["kind"] in ("finished", "failed"):
        return True
    return event["kind"] == "released" and _detail(event).get("state") == "stopped"


def terminal_resurrections(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """S4 from the events alone, for every job, including those that became terminal
    while the fault lasted: once a generation ended (finished, failed, released as
    stopped), no claim may follow unless an operator command gave the job a newer
    generation in between."""
    problems = []
    for job, items in sorted(_by_job(events).items()):
        generation = 0
        gen_of_epoch: dict[int, int] = {}
        ended: tuple[int, Mapping[str, Any]] | None = None  # (generation, event)
        for e in items:
            commanded = _commanded_generation(e)
            if commanded is not None:
                generation = max(generation, commanded)
            elif e["kind"] == "claimed":
                epoch = int(e["epoch"])
                gen_of_epoch[epoch] = generation
                if ended is not None and generation > ended[0]:
                    ended = None  # an operator started a new generation: a legal run
                elif ended is not None:
                    was = ended[1]
                    problems.append(
                        f"{job}: claimed by {e['server']} at epoch {epoch} (event {e['id']}) "
                        f"after generation {ended[0]} ended ({was['kind']} by {was['server']} "
                        f"at epoch {was['epoch']}, event {was['id']}) with no start or "
                        "restart since"
                    )
            elif _terminal(e) and e.get("epoch") is not None:
                ended = (gen_of_epoch.get(int(e["epoch"]), generation), e)
    return problems


def batch_generations(
    kinds: Mapping[str, str],
    lifetimes: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    freezes: Sequence[Freeze] = (),
    cuts: Sequence[Cut] = (),
) -> list[str]:
    """S1/S4 for batch jobs (``kinds``: job -> kind), from lifetime records and claims:
    in each generation at most one driver ran to its end (exit 0), no driver of a
    generation started after one of it ran to its end, every earlier driver of a
    generation provably ended (an ``ended`` record) before the next one started (it
    failed and was retried, or its owner was lost and its watchdog killed it), and a
    generation recorded ``finished``
    had a driver that ran to its end. A host freeze excuses what :func:`_frozen_through`
    says (the earlier driver frozen with its server, ended just after the thaw); a freeze
    or a cut from PostgreSQL that kept an exit 0 from being recorded excuses the run
    after it (:func:`_exit_lost_to_a_freeze`, :func:`_exit_lost_to_a_cut`)."""
    by_job = _by_job(events)
    lifetimes = list(lifetimes)
    clock = records_clock(lifetimes)
    frozen = [f for f in freezes if f.clock == clock]
    cut_off = [c for c in cuts if c.clock == clock]
    lives_of: dict[str, list[_Life]] = defaultdict(list)
    for life in _lives(lifetimes, clock):
        lives_of[life.job].append(life)
    problems = []
    for job in sorted(name for name, kind in kinds.items() if kind == "batch"):
        items = by_job.get(job, [])
        gen_of_epoch = claim_generations(items)
        per_gen: dict[int, list[_Life]] = defaultdict(list)
        for life in lives_of.get(job, []):
            if life.epoch not in gen_of_epoch:
                problems.append(f"{job}: driver {life.label} ran at an epoch nobody claimed")
                continue
            per_gen[gen_of_epoch[life.epoch]].append(life)
        finished: dict[int | None, Mapping[str, Any]] = {
            gen_of_epoch.get(int(e["epoch"])): e
            for e in items
            if e["kind"] == "finished" and e.get("epoch") is not None
        }
        recorded = {
            int(e["epoch"]) for e in items if e["kind"] == "finished" and e.get("epoch") is not None
        }
        for gen in sorted(set(per_gen) | (set(finished) - {None})):
            lives = sorted(per_gen.get(gen, []), key=lambda life: life.start)
            lost = {
                id(a)
                for a, b in itertools.pairwise(lives)
                if _exit_lost_to_a_freeze(a, b.start, recorded, frozen)
                or _exit_lost_to_a_cut(a, b.start, recorded, cut_off)
            }
            done = [life for life in lives if life.ran_to_its_end and id(life) not in lost]
            if len(done) > 1:
                problems.append(
                    f"{job}: generation {gen} ran to its end {len(done)} times: "
                    + ", ".join(life.label for life in done)
                )
            if gen in finished and not done:
                was = finished[gen]
                seen = ", ".join(f"{life.label}: {life.ending}" for life in lives) or "none"
                problems.append(
                    f"{job}: generation {gen} finished (event {was['id']} by {was['server']} "
                    f"at epoch {was['epoch']}) with no driver that exited 0; its drivers: {seen}"
                )
            for a, b in itertools.pairwise(lives):
                if id(a) in lost:
                    continue
                if a.ran_to_its_end:
                    problems.append(
                        f"{job}: generation {gen} started again ({b.label}) after "
                        f"{a.label} ran to its end"
                    )
                elif (a.end is None or a.end > b.start) and not _frozen_through(a, b.start, frozen):
                    end = (
                        "no ended record"
                        if a.end is None
                        else f"ended {a.end - b.start:.3f} s later"
                    )
                    problems.append(
                        f"{job}: generation {gen}: {b.label} started before {a.label} "
                        f"provably ended ({end})"
                    )
    return problems


def _exit_lost_to_a_freeze(
    life: _Life, next_start: float, recorded: set[int], freezes: Sequence[Freeze]
) -> bool:
    """``life`` exited 0, no ``finished`` was ever recorded at its epoch, and its host
    froze within FREEZE_RECORD_BOUND_S after that exit and before the generation's next
    driver started: its watchdog was frozen before it could record the exit."""
    if not life.ran_to_its_end or life.epoch in recorded or life.end is None:
        return False
    return any(
        f.server == life.server
        and life.end <= f.start <= life.end + FREEZE_RECORD_BOUND_S
        and f.start <= next_start
        for f in freezes
    )


def _exit_lost_to_a_cut(
    life: _Life, next_start: float, recorded: set[int], cuts: Sequence[Cut]
) -> bool:
    """``life`` exited 0, no ``finished`` was ever recorded at its epoch, the exit came
    while its server was cut off from PostgreSQL (or CUT_RECORD_BOUND_S before the cut),
    and the generation's next driver started before the cut healed or within the bound
    after: the exit could not be recorded before another server claimed the job."""
    if not life.ran_to_its_end or life.epoch in recorded:
        return False
    return _end_lost_to_a_cut(life, next_start, cuts)


def _end_lost_to_a_cut(life: _Life, next_start: float, cuts: Sequence[Cut]) -> bool:
    """``life`` ended while its server was cut off from PostgreSQL (or CUT_RECORD_BOUND_S
    before the cut), and the generation's next driver started (``next_start``) before
    the cut healed or within the bound after."""
    if life.end is None:
        return False
    return any(
        c.server == life.server
        and c.start - CUT_RECORD_BOUND_S <= life.end <= c.end
        and next_start <= c.end + CUT_RECORD_BOUND_S
        for c in cuts
    )


def _driver_failures(lives: Sequence[_Life], items: Sequence[Mapping[str, Any]]) -> set[int]:
    """Epochs of one job whose driver failed on its own: its watchdog recorded it
    ``exited`` with a non-zero code, or the server recorded ``driver exited with exit
    code N`` (a ``crashed`` or ``failed`` event). Either is enough: the watchdog's record
    is lost when it is killed, the server's when the owner stalls (hole H5)."""
    failing = {
        life.epoch
        for life in lives
        if life.reason == "exited"
        and life.exit_code is not None
        and life.exit_code != 0
        and not life.stopping  # an exit during a stop spends no budget (the watchdog's word)
    }
    failing |= {
        int(e["epoch"])
        for e in items
        if e["kind"] in ("crashed", "failed")
        and e.get("epoch") is not None
        and DRIVER_FAILURE.match(str(_detail(e).get("error") or ""))
    }
    return failing


def budget_overruns(
    jobs: Iterable[Mapping[str, Any]],
    lifetimes: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    cuts: Sequence[Cut] = (),
) -> list[str]:
    """A job run past its budget (hole H5): within one generation, a driver started after
    ``max_restarts + 1`` drivers of that generation had failed on their own
    (:func:`_driver_failures`). Batch and streaming alike: a batch job's
    ``--max-retries`` is its ``max_restarts``, and the last allowed failure makes the
    job FAILED, so no driver of the generation may follow it.

    Drivers are ordered by epoch (every claim takes the next one), so no clock is
    involved but for the cuts below (the records' own clock, as the batch check). The
    budget is counted per generation, which is the most it can be (a restart of a
    running job gives a new generation but keeps the restart count), so the check never
    reports a legal run; it takes the job's current ``max_restarts``.
    A failure never recorded that a cut from PostgreSQL hid from the next claim (as an
    exit 0: :func:`_end_lost_to_a_cut`) spends none: the claim could not know of it."""
    by_job = _by_job(events)
    lifetimes = list(lifetimes)
    lives_of: dict[str, list[_Life]] = defaultdict(list)
    for life in _lives(lifetimes, clock="t"):
        lives_of[life.job].append(life)
    clock = records_clock(lifetimes)
    cut_off = [c for c in cuts if c.clock == clock]
    on_clock: dict[tuple[str, int], _Life] = {
        (life.job, life.epoch): life for life in _lives(lifetimes, clock)
    }
    problems = []
    for j in sorted(jobs, key=lambda j: j["name"]):
        job, budget, window = j["name"], int(j["max_restarts"]) + 1, restart_window(j)
        items = by_job.get(job, [])
        gen_of_epoch = claim_generations(items)
        failing = _driver_failures(lives_of[job], items)
        # When the product counted each failure (its crashed/failed event, PostgreSQL's
        # clock); one it never recorded (H5) is placed before any window, so that a
        # restart window never makes the check report a legal run.
        failed_at = {
            int(e["epoch"]): float(e["at_s"])
            for e in items
            if e["kind"] in ("crashed", "failed") and e.get("epoch") is not None and "at_s" in e
        }
        started = {life.epoch: life for life in lives_of[job]}
        recorded = {
            int(e["epoch"])
            for e in items
            if e["kind"] in ("crashed", "failed") and e.get("epoch") is not None
        }
        per_gen: dict[int, list[int]] = defaultdict(list)
        for epoch in sorted(failing | set(started)):
            if epoch in gen_of_epoch:  # a driver at an unclaimed epoch: batch_generations
                per_gen[gen_of_epoch[epoch]].append(epoch)
        for gen, epochs in sorted(per_gen.items()):
            failures: list[int] = []
            for epoch in epochs:
                if epoch in started and cut_off:
                    following = on_clock.get((job, epoch))
                    failures = [
                        f
                        for f in failures
                        if f in recorded
                        or following is None
                        or (job, f) not in on_clock
                        or not _end_lost_to_a_cut(on_clock[(job, f)], following.start, cut_off)
                    ]
                spent = (
                    spent_in_one_window(
                        [failed_at.get(f, float("-inf")) for f in failures], budget, window
                    )
                    if window > 0
                    else len(failures) >= budget
                )
                if spent and epoch in started:
                    problems.append(
                        f"{job}: generation {gen} run past its budget: driver "
                        f"{started[epoch].label} started after {len(failures)} driver "
                        f"failures (epochs {failures}; max_restarts {budget - 1})"
                    )
                    break
                if epoch in failing:
                    failures.append(epoch)
    return problems


def corrupt_starts(
    names: Iterable[str],
    lifetimes: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
) -> list[str]:
    """S5: a driver of a job whose artifact is corrupt or missing was started."""
    names = set(names)
    problems = [
        f"{r['job']}: driver started at epoch {r['epoch']} on {r['server']}"
        for r in lifetimes
        if r["job"] in names and r["event"] == "started"
    ]
    problems += [
        f"{e['job_name']}: driver_started event at epoch {e['epoch']}"
        for e in events
        if e["job_name"] in names and e["kind"] == "driver_started"
    ]
    return problems


# Events after which a job's next claim is not a restart a fault cost it: its own
# driver ended (crashed, failed, finished: the restart budget governs what follows), its
# start was deferred (no driver ran: the next claim is the same restart, retried), or an
# operator command gave it a new run (``scheduler/jobs.py``).
NOT_A_FAULTS_RESTART = frozenset(
    {
        "crashed",
        "failed",
        "finished",
        "deferred",
        "created",
        "start_requested",
        "stop_requested",
        "restart_requested",
        "revised",
        "deleted",
    }
)


# A ``retargeted`` event's ``why`` for a move an operator planned, not a fault: a drain
# of the job's live server (``sparkring server drain``; scheduler/coordinator.py). Its
# claim is a planned move (warm for a streaming job), never a fault's restart.
PLANNED_MOVES = frozenset({"drained"})
# A ``retargeted`` event's ``why`` when the job's server was lost (left ZooKeeper, or
# kept a live registration but let its lease lapse): the server went away.
LOST_MOVES = frozenset({"orphaned", "avoided"})


@dataclasses.dataclass(frozen=True)
class Drain:
    """An operator's drain of ``server`` (``sparkring server drain``), asked at
    ``start`` and undone (``--undo``) at ``undone`` (None: not undone), on the wall
    clock of the events' ``at_s``; ``undone`` may be taken just before the undo is
    sent. The drain's own moves say so in their events (``drained``), but a job the
    drain stops for want of room elsewhere is retargeted to no server (``waiting``) and
    claimed when room comes: only the drain's time tells that one apart. The undo
    makes the server a joiner again (docs/distribution.md), and the streaming jobs its
    join moves to it (``joined``) are the operator's moves too, until the server is
    next lost (a ``retargeted`` away from it in :data:`LOST_MOVES`): a move back to a
    server that returned after a fault is a fault's second restart, which the checker
    must see."""

    server: str
    start: float
    undone: float | None = None


def _planned_moves(events: Sequence[Mapping[str, Any]], drains: Sequence[Drain]) -> set[int]:
    """Ids of the ``retargeted`` events a drain made: away from a server while it was
    drained (to another server, ``drained``, or to none: ``waiting``, when no other
    server had room), and, after its undo, the join's (``joined``) moves to it with no
    loss of that server in between."""
    retargets = sorted(
        (e for e in events if e["kind"] == "retargeted"), key=lambda e: (float(e["at_s"]), e["id"])
    )
    planned = set()
    for e in retargets:
        detail, t = _detail(e), float(e["at_s"])
        if any(
            d.server == detail.get("from")
            and d.start <= t <= (math.inf if d.undone is None else d.undone)
            for d in drains
        ):
            planned.add(e["id"])
            continue
        if detail.get("why") != "joined":
            continue
        server = detail.get("to")
        undos = [d.undone for d in drains if d.server == server and d.undone is not None]
        undone = max((u for u in undos if u <= t), default=None)
        if undone is None:
            continue
        lost = any(
            _detail(x).get("from") == server
            and _detail(x).get("why") in LOST_MOVES
            and undone < float(x["at_s"]) <= t
            for x in retargets
        )
        if not lost:
            planned.add(e["id"])
    return planned


@dataclasses.dataclass(frozen=True)
class FaultWindow:
    """When a fault may have made a job restart: from its injection (``start``) to its
    healing plus the recovery bound (``end``), on the wall clock of the events' ``at_s``
    (PostgreSQL's ``now()``; the stack runs on the harness's host)."""

    start: float
    end: float


def fault_restarts(
    events: Iterable[Mapping[str, Any]], since_id: int = 0, drains: Sequence[Drain] = ()
) -> dict[str, list[Mapping[str, Any]]]:
    """job -> its claims after event ``since_id`` that restarted a driver for no reason
    of its own: the job's previous claim had started a driver (a ``driver_started`` at
    that epoch), and nothing in :data:`NOT_A_FAULTS_RESTART` happened since, nor a
    planned move: a ``retargeted`` for a drain (:data:`PLANNED_MOVES`, or away from a
    server while it was drained) or for the join of a server whose drain was undone
    (:class:`Drain`)."""
    events = list(events)
    planned = _planned_moves(events, drains) if drains else set()
    out: dict[str, list[Mapping[str, Any]]] = {}
    for job, items in sorted(_by_job(events).items()):
        epoch, had_driver, excused = None, False, False
        for e in items:
            if e["kind"] == "claimed":
                if e["id"] > since_id and had_driver and not excused:
                    out.setdefault(job, []).append(e)
                epoch, had_driver, excused = e.get("epoch"), False, False
            elif e["kind"] == "driver_started" and e.get("epoch") == epoch:
                had_driver = True
            elif e["kind"] in NOT_A_FAULTS_RESTART:
                excused = True
            elif e["kind"] == "retargeted" and (
                _detail(e).get("why") in PLANNED_MOVES or e["id"] in planned
            ):
                excused = True
    return out


def restarts_per_fault(
    events: Iterable[Mapping[str, Any]],
    faults: Sequence[FaultWindow],
    since_id: int = 0,
    drains: Sequence[Drain] = (),
) -> list[str]:
    """One fault, one restart (DESIGN.md): each fault costs each affected job at most one
    restart. Every restart a fault may have caused (:func:`fault_restarts`) must be
    matched to a fault of its own, one whose window contains the restart and that no
    other restart of the same job was matched to. Restarts are matched in time order,
    each to the open window that ends first (optimal for points and intervals), so a
    problem means no assignment exists: some fault cost the job two restarts, such as a
    failover and then a move back to the server that returned. A drain's moves, and
    the moves of the join its undo starts (``drains``), are planned, not restarts."""
    problems = []
    windows = sorted(faults, key=lambda w: (w.start, w.end))
    for job, restarts in fault_restarts(events, since_id, drains).items():
        used: set[int] = set()
        for e in sorted(restarts, key=lambda e: (float(e["at_s"]), e["id"])):
            t = float(e["at_s"])
            open_ = [i for i, w in enumerate(windows) if w.start <= t <= w.end and i not in used]
            if open_:
                used.add(min(open_, key=lambda i: windows[i].end))
                continue
            count = sum(1 for w in windows if w.start <= t <= w.end)
            problems.append(
                f"{job}: restarted again at epoch {e['epoch']} by {e['server']} (event "
                f"{e['id']}): {len(restarts)} restarts after the faults, more than one per "
                f"fault ({count} fault window{'s' if count != 1 else ''} cover this one)"
            )
    return problems


# ---------------------------------------------------------------- Spark master faults (S9)

# How long a SIGKILLed master may still answer after the harness noted its fault (the
# note comes just before the kill), seconds, on the events' clock (PostgreSQL's now(),
# the harness's host).
MASTER_KILL_SLACK_S = 1.0


@dataclasses.dataclass(frozen=True)
class MasterOutage:
    """A Spark master fault: ``masters`` (each ``host:port``) killed at ``start`` and
    started again at ``end`` (the moment the harness spawned it: it cannot answer
    before), on the wall clock of the events' ``at_s``. A standby taking over is no end:
    the killed master itself is still down."""

    masters: frozenset[str]
    start: float
    end: float


def job_masters(urls: Mapping[str, str | None]) -> dict[str, frozenset[str]]:
    """job -> the ``host:port`` of each master of its ``spark://`` URL (jobs on another
    cluster manager, or on none, are left out: no master fault can touch them)."""
    out = {}
    for job, url in urls.items():
        found = frozenset(str(e) for e in spark_master.endpoints(url or ""))
        if found:
            out[job] = found
    return out


def _hit(
    job: str,
    t: float,
    outages: Sequence[MasterOutage],
    masters: Mapping[str, frozenset[str]],
    bound: float,
) -> MasterOutage | None:
    """The first outage of one of ``job``'s masters whose window (start to end + bound)
    holds ``t``."""
    for o in outages:
        if o.masters & masters.get(job, frozenset()) and o.start <= t <= o.end + bound:
            return o
    return None


def _other_fault(t: float, others: Sequence[FaultWindow]) -> bool:
    return any(w.start <= t <= w.end for w in others)


def master_fault_costs(
    events: Iterable[Mapping[str, Any]],
    outages: Sequence[MasterOutage],
    masters: Mapping[str, frozenset[str]],
    others: Sequence[FaultWindow] = (),
    bound: float = 0.0,
    since_id: int = 0,
) -> list[str]:
    """S9 for the Spark master: a master fault never costs a job its budget, nor makes
    it FAILED. Every ``crashed`` or ``failed`` event (each one spends a restart, or ends
    the job) of a job on a master that was down, from the fault to ``bound`` seconds
    after the master was back, is reported, unless another fault's window (``others``)
    holds it too: then that fault may be its cause. ``masters``: :func:`job_masters`,
    for jobs whose driver never fails on its own (the chaos jobs on a master)."""
    problems = []
    for e in events:
        if e["id"] <= since_id or e["kind"] not in ("crashed", "failed"):
            continue
        t = float(e["at_s"])
        outage = _hit(e["job_name"], t, outages, masters, bound)
        if outage is None or _other_fault(t, others):
            continue
        problems.append(
            f"{e['job_name']}: {e['kind']} at epoch {e['epoch']} (event {e['id']}: "
            f"{_detail(e).get('error', '')!s:.120}) while its master {sorted(outage.masters)} "
            "was down: a master fault spent its budget"
        )
    return problems


def master_fault_restarts(
    events: Iterable[Mapping[str, Any]],
    outages: Sequence[MasterOutage],
    masters: Mapping[str, frozenset[str]],
    others: Sequence[FaultWindow] = (),
    bound: float = 0.0,
    since_id: int = 0,
    drains: Sequence[Drain] = (),
) -> list[str]:
    """A job whose driver was running when its master went down (a standby takes over,
    or the only master is away for minutes) keeps that driver: Spark's running
    applications do not need the master, and sparkring must not touch them. Every claim
    that replaced a running driver (:func:`fault_restarts`: nothing of the job's or an
    operator's in between, no drain's move) from the fault to ``bound`` after the master
    was back is reported, unless another fault's window holds it."""
    problems = []
    for job, restarts in fault_restarts(events, since_id, drains).items():
        for e in restarts:
            t = float(e["at_s"])
            outage = _hit(job, t, outages, masters, bound)
            if outage is None or _other_fault(t, others):
                continue
            problems.append(
                f"{job}: its running driver was replaced at epoch {e['epoch']} by "
                f"{e['server']} (event {e['id']}) while its master {sorted(outage.masters)} "
                "was down: a master fault restarted it"
            )
    return problems


def started_without_master(
    events: Iterable[Mapping[str, Any]],
    outages: Sequence[MasterOutage],
    masters: Mapping[str, frozenset[str]],
    slack: float = MASTER_KILL_SLACK_S,
    since_id: int = 0,
) -> list[str]:
    """A job due while every one of its masters is down waits (``deferred``, cause
    ``spark-master-unreachable``) and runs once one is back. The server probes the
    masters after its claim committed and before it writes ``driver_started``: a run
    whose claim (its transaction's ``now()``) came ``slack`` or more after a master's
    fault and whose ``driver_started`` came before that master was spawned again probed
    it while it was down. When that holds for every master of the job, the driver was
    started with none to register with: a real Spark driver fails then, and its failure
    would be counted. No load-dependent margin: the probe lies between the two events."""
    problems = []
    for job, items in _by_job(events).items():
        own = masters.get(job)
        if not own:
            continue
        claimed = {e["epoch"]: float(e["at_s"]) for e in items if e["kind"] == "claimed"}
        for e in items:
            if e["id"] <= since_id or e["kind"] != "driver_started" or e["epoch"] not in claimed:
                continue
            first, last = claimed[e["epoch"]], float(e["at_s"])
            if all(
                any(m in o.masters and o.start + slack <= first and last <= o.end for o in outages)
                for m in own
            ):
                problems.append(
                    f"{job}: driver started at epoch {e['epoch']} by {e['server']} (event "
                    f"{e['id']}) although none of its masters {sorted(own)} was up from its "
                    "claim to its start"
                )
    return problems


# ---------------------------------------------------------------- schedules (S6)

# Why a fire may be recorded skipped (scheduler/schedule.py SkipReason); a DST gap's
# reason names the local time after its prefix.
ALLOWED_SKIPS = frozenset({"misfire", "previous run still running"})
DST_GAP_PREFIX = "dst-gap: "
# How a stop records a backfilled run still waiting for its turn (scheduler/runs.py
# cancel_queued), and the prefix a skip keeps once a backfill queued it (requeue_skipped).
STOPPED_BEFORE_ITS_TURN = "job stopped before its turn"
BACKFILLED_AFTER_SKIP = "backfilled after a skip: "


@dataclasses.dataclass(frozen=True)
class Piece:
    """One stretch of a schedule as operators changed it: ``spec`` in ``timezone``, in
    force after ``start`` (seconds since the epoch: its switch-on, or the time of the
    change that made it, as the change left ``fires_checked_until``) up to the next
    piece's start. A change takes effect at its time (docs/schedules.md "Changing a
    schedule"): the old schedule's fire times up to it are the old piece's (handled at
    the change at the latest), its later ones are dropped, and the new schedule fires
    from its first time after the change."""

    spec: str
    timezone: str
    start: float


def piece_fire_times(pieces: Sequence[Piece], until: Any) -> tuple[float, ...]:
    """The fire times of a schedule made of ``pieces``: each piece's strictly after its
    start and at or before the next one's (the last: ``until``)."""
    end = _seconds(until)
    assert end is not None
    ordered = sorted(pieces, key=lambda p: p.start)
    out: list[float] = []
    for piece, following in itertools.zip_longest(ordered, ordered[1:]):
        stop = end if following is None else min(following.start, end)
        if stop > piece.start:
            out += fire_times(piece.spec, piece.timezone, piece.start, stop)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class OffPeriod:
    """A schedule switched off by ``job stop`` at ``stopped`` and on again by ``job
    start`` at ``until`` (math.inf: not yet). ``after`` is how far its fires had been
    handled at the stop (``fires_checked_until``). Its fire times in (after, until] are
    misfires (docs/schedules.md "job start, job stop"): recorded ``misfire`` (a change
    while it is off records the old schedule's at once: ``fires.close_off_period``), and
    the switch-on lets only the latest of those after the last change run, late, under
    ``run-once``."""

    stopped: float
    after: float
    until: float = math.inf


@dataclasses.dataclass(frozen=True)
class Backfill:
    """A committed ``job backfill`` at ``at`` (its transaction's time): ``checked`` is
    how far the schedule had handled its fires then (every fire time up to it has its
    row), ``queued`` the times it queued and ``before`` the state of every row its range
    had just before it, (time, state) pairs."""

    at: float
    checked: float
    queued: tuple[float, ...]
    before: tuple[tuple[float, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class ScheduleWindow:
    """Where a scheduled job's fires are checked (Chronos-style): every fire time of
    ``fire_times`` (its schedule's, strictly inside the window in which it was active,
    computed with ``scheduler/schedule.py``: :func:`piece_fire_times` when operators
    changed it, ``changes`` holding the time of each change) must have one run row.
    ``concurrency`` is its policy; ``excused``: (start, end) spans in seconds since the
    epoch (faults that stopped the whole cluster: PostgreSQL down) inside which a fire
    may be later than the bound, or recorded ``misfire``; ``off``: the periods in which
    an operator had it switched off (:class:`OffPeriod`); ``backfills``: the operators'
    backfills of it (:class:`Backfill`)."""

    job: str
    fire_times: tuple[float, ...]
    concurrency: str = "forbid"
    excused: tuple[tuple[float, float], ...] = ()
    changes: tuple[float, ...] = ()
    off: tuple[OffPeriod, ...] = ()
    backfills: tuple[Backfill, ...] = ()


def fire_times(spec: str, timezone: str, after: Any, until: Any) -> tuple[float, ...]:
    """The fire times (seconds since the epoch) of a schedule strictly after ``after``
    and at or before ``until`` (datetimes, ISO texts or seconds): what the cluster had to
    fire while the schedule was on (computed by scheduler/schedule.py, which the fire
    tests check on its own)."""
    from datetime import UTC, datetime

    from scheduler import schedule

    start, end = _seconds(after), _seconds(until)
    assert start is not None and end is not None
    the_schedule = schedule.parse(spec, timezone=timezone)
    out = []
    for slot in schedule.slots(the_schedule, datetime.fromtimestamp(start, UTC)):
        if slot.gap:
            continue
        at = slot.at.timestamp()
        if at > end:
            return tuple(out)
        if at > start:
            out.append(at)
    raise AssertionError("unreachable: slots never ends")


def _seconds(value: Any) -> float | None:
    """An ISO-8601 time (``...Z``), a datetime or seconds since the epoch -> seconds."""
    from datetime import datetime

    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _gap(row: Mapping[str, Any]) -> bool:
    """A DST gap's row: no fire time, though it has an instant (just before the zone's
    jump: scheduler/schedule.py gap_instant)."""
    return row.get("state") == "skipped" and str(row.get("reason") or "").startswith(DST_GAP_PREFIX)


def _excused(t: float, window: ScheduleWindow) -> bool:
    return any(start <= t <= end for start, end in window.excused)


def _off(t: float, window: ScheduleWindow) -> OffPeriod | None:
    return next((p for p in window.off if p.after < t <= p.until), None)


def _may_run_after_off(period: OffPeriod, window: ScheduleWindow) -> float | None:
    """The one fire time of ``period`` that may run: the latest after the last change
    within it (the switch-on handles its fire times from there), if it ended."""
    if period.until == math.inf:
        return None
    opened = max([period.after, *(c for c in window.changes if period.after < c <= period.until)])
    mine = [t for t in window.fire_times if opened < t <= period.until]
    return max(mine) if mine else None


def fire_problems(
    window: ScheduleWindow,
    runs: Iterable[Mapping[str, Any]],
    *,
    lateness_bound: float,
    now: float | None = None,
) -> list[str]:
    """S6 for one scheduled job, from its run rows (``job runs --json``):

    - every fire time ran exactly once, or is recorded skipped with an allowed reason
      (a ``misfire`` only inside an excused span or while the schedule was off;
      ``previous run still running`` only while a run of the job was in progress under
      ``forbid``), or was backfilled (its row's trigger ``backfill``);
    - no run row names a fire time the schedule does not have (an early or extra fire,
      such as one of an old schedule after the change that replaced it);
    - while the schedule was off none of its fire times ran, but the latest one its
      switch-on handled (:class:`OffPeriod`);
    - under ``forbid`` no two runs overlap (started_at .. ended_at, unended: open),
      backfilled ones included;
    - a fire's run started at most ``lateness_bound`` seconds after its time, unless
      its time lies in an excused span or an off period (a run not started by ``now``,
      the check's time, counts as started then);
    - the backfills (:func:`backfill_problems`)."""
    name = window.job
    rows = [dict(r) for r in runs]
    at_time: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        at = _seconds(r.get("scheduled_time"))
        if at is not None and r.get("trigger", "schedule") in ("schedule", "backfill"):
            at_time[at].append(r)
    expected = set(window.fire_times)
    lo, hi = (min(expected), max(expected)) if expected else (0.0, -1.0)
    problems = []
    # Runs that started a driver, by start; and every run from its creation (a pending
    # run is in progress too: a fire meanwhile is skipped under forbid).
    intervals = sorted(
        (
            (_seconds(r.get("started_at")), _seconds(r.get("ended_at")), r)
            for r in rows
            if r.get("state") != "skipped" and r.get("started_at") is not None
        ),
        key=lambda item: item[0] or 0.0,
    )
    in_progress = [
        (_seconds(r.get("created_at") or r.get("started_at")), _seconds(r.get("ended_at")), r)
        for r in rows
        if r.get("state") not in ("skipped", "queued")
    ]
    for at, mine in sorted(at_time.items()):
        if len(mine) > 1:
            ids = ", ".join(f"{r.get('run_id')} ({r.get('trigger', 'schedule')})" for r in mine)
            problems.append(
                f"{name}: the fire at {_iso_seconds(at)} ran {len(mine)} times (runs {ids})"
            )
    for at in sorted(expected):
        mine = at_time.get(at, [])
        when = _iso_seconds(at)
        if not mine:
            problems.append(f"{name}: the fire at {when} was missed (no run, not recorded)")
            continue
        row = mine[0]
        if row.get("trigger", "schedule") != "schedule":
            continue  # a backfilled run, checked with its backfill
        off = _off(at, window)
        if row.get("state") == "skipped":
            problems += _skip_problem(window, row, at, when, in_progress)
            continue
        if off is not None and at != _may_run_after_off(off, window):
            problems.append(
                f"{name}: the fire at {when} ran (run {row.get('run_id')}) while its schedule "
                f"was off (stopped at {_iso_seconds(off.stopped)}, "
                + (
                    "not on again)"
                    if off.until == math.inf
                    else f"on again at {_iso_seconds(off.until)})"
                )
            )
            continue
        started = _seconds(row.get("started_at"))
        if started is None and now is not None:
            started = now  # not started yet: at least this late
        late = started is not None and started - at > lateness_bound
        if late and not _excused(at, window) and off is None:
            problems.append(
                f"{name}: the fire at {when} started {started - at:.1f} s late "
                f"(bound {lateness_bound:g} s)"
            )
    for at, mine in sorted(at_time.items()):
        fired = [r for r in mine if r.get("trigger", "schedule") == "schedule"]
        if fired and at not in expected and lo <= at <= hi and not all(_gap(r) for r in fired):
            problems.append(
                f"{name}: run {fired[0].get('run_id')} fired at {_iso_seconds(at)}, "
                "not a fire time of its schedule"
            )
    if window.concurrency == "forbid":
        for (_, a_end, a), (b_start, _, b) in itertools.pairwise(intervals):
            if a_end is None or a_end > b_start:
                problems.append(
                    f"{name}: runs {a.get('run_id')} and {b.get('run_id')} overlap under "
                    f"forbid ({a.get('run_id')} "
                    + ("never ended" if a_end is None else f"ended {a_end - b_start:.1f} s late")
                    + ")"
                )
    return problems + backfill_problems(window, rows)


def backfill_problems(window: ScheduleWindow, runs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The backfills of one scheduled job (docs/schedules.md "Backfill"), from its run
    rows and the operators' backfills (``window.backfills``):

    - a backfill queues no fire time that had already run (its row, before the
      backfill, was one that ran: only a ``skipped`` one may be queued again);
    - a fire time of the schedule that the schedule had handled by then
      (``Backfill.checked``) has a row when a backfill comes: one queued with none was
      missed, and the backfill does not excuse that;
    - every queued time has its one row (several: :func:`fire_problems` says so), with
      trigger ``backfill``, and no run has trigger ``backfill`` at a time no backfill
      queued;
    - a queued time recorded ``skipped`` was dropped by a stop after it was queued
      (``job stopped before its turn``), nothing else."""
    name = window.job
    at_time: dict[float, list[Mapping[str, Any]]] = defaultdict(list)
    for r in runs:
        at = _seconds(r.get("scheduled_time"))
        if at is not None:
            at_time[at].append(r)
    expected = set(window.fire_times)
    queued_at: dict[float, list[Backfill]] = defaultdict(list)
    problems = []
    for b in sorted(window.backfills, key=lambda b: b.at):
        before = dict(b.before)
        for at in b.queued:
            queued_at[at].append(b)
            when, asked = _iso_seconds(at), _iso_seconds(b.at)
            state = before.get(at)
            if state is not None and state != "skipped":
                problems.append(
                    f"{name}: the backfill at {asked} queued the fire at {when}, which had "
                    f"already run (its row was {state})"
                )
            if state is None and at in expected and at <= b.checked:
                problems.append(
                    f"{name}: the fire at {when} was missed: it had no row when the backfill "
                    f"at {asked} queued it"
                )
            rows = at_time.get(at, [])
            if not rows:
                problems.append(
                    f"{name}: the fire at {when} queued by the backfill at {asked} has no row"
                )
            elif all(r.get("trigger") != "backfill" for r in rows):
                problems.append(
                    f"{name}: the fire at {when} queued by the backfill at {asked} has no "
                    "backfilled run"
                )
    for at, rows in sorted(at_time.items()):
        for r in rows:
            if r.get("trigger") != "backfill":
                continue
            when = _iso_seconds(at)
            queued = queued_at.get(at)
            if not queued:
                problems.append(
                    f"{name}: run {r.get('run_id')} was backfilled at {when}, which no "
                    "backfill queued"
                )
                continue
            if r.get("state") != "skipped":
                continue
            reason = str(r.get("reason") or "")
            last = max(b.at for b in queued)
            stopped = any(p.stopped > last for p in window.off)
            if reason != STOPPED_BEFORE_ITS_TURN or not stopped:
                problems.append(
                    f"{name}: the backfilled run {r.get('run_id')} at {when} was skipped "
                    f"({reason!r}) " + ("" if stopped else "with no stop after it was queued")
                )
    return problems


def _skip_problem(
    window: ScheduleWindow,
    row: Mapping[str, Any],
    at: float,
    when: str,
    intervals: Sequence[tuple[float | None, float | None, Mapping[str, Any]]],
) -> list[str]:
    reason = str(row.get("reason") or "")
    if reason.startswith(DST_GAP_PREFIX):
        return [f"{window.job}: the fire at {when} exists but was skipped as {reason!r}"]
    if reason not in ALLOWED_SKIPS:
        return [f"{window.job}: the fire at {when} was skipped for {reason!r}"]
    if reason == "misfire" and not _excused(at, window) and _off(at, window) is None:
        return [f"{window.job}: the fire at {when} was a misfire on a healthy cluster"]
    if reason == "previous run still running":
        if window.concurrency != "forbid":
            return [f"{window.job}: the fire at {when} was skipped under {window.concurrency}"]
        busy = any(
            start is not None and start <= at and (end is None or end >= at)
            for start, end, _ in intervals
        )
        if not busy:
            return [f"{window.job}: the fire at {when} was skipped while no run was running"]
    return []


def _iso_seconds(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------- alerts (issue 26)


def alert_kind_of(event: Mapping[str, Any]) -> str | None:
    """The alert kind a job event raises (docs/alerts.md), restated here from the docs
    rather than read from migration 0013's trigger, so the check does not share its bug."""
    kind, detail = event["kind"], event.get("detail") or {}
    if kind == "failed":
        return "failed"
    if kind == "crashed":
        return "restarted"
    if kind == "reaped":
        return "failed_over"
    if kind == "claimed" and "taken_over_from" in detail:
        return "failed_over"
    if kind == "health_flagged" and detail.get("flag") in ("stalled", "waiting_for_resources"):
        return str(detail["flag"])
    if kind == "health_cleared":
        return "recovered"
    if kind == "rolled_back":
        return "rolled_back"
    return None


def unraised_alerts(
    events: Iterable[Mapping[str, Any]],
    deliveries: Iterable[Mapping[str, Any]],
    alert: str,
    since_id: int = 0,
) -> list[str]:
    """Events after ``since_id`` that should have raised a delivery of ``alert`` (which
    listens to every kind, for every job) and did not, or raised another kind; and
    deliveries of events that should have raised none, or raised more than one."""
    raised: dict[int, list[str]] = defaultdict(list)
    for d in deliveries:
        if d["alert_name"] == alert and d.get("event_id") is not None:
            raised[int(d["event_id"])].append(str(d["kind"]))
    problems = []
    for e in events:
        if e["id"] <= since_id:
            continue
        want = alert_kind_of(e)
        got = raised.pop(int(e["id"]), [])
        if want is None and got:
            problems.append(f"alert {alert}: event {e['id']} ({e['kind']}) raised {got}")
        elif want is not None and got != [want]:
            problems.append(
                f"alert {alert}: event {e['id']} ({e['kind']} of {e['job_name']}) raised "
                f"{got or 'nothing'}, not one {want}"
            )
    return problems


# The status the harness gives a delivery that a prune deleted (sent or given up: which
# one, only the receiver can tell).
PRUNED = "pruned"


def undelivered_alerts(
    deliveries: Iterable[Mapping[str, Any]],
    accepted_ids: Iterable[str],
    later_ids: Iterable[str] = (),
) -> list[str]:
    """Deliveries the receiver never accepted, or not recorded delivered (a delivery
    pruned, :data:`PRUNED`, was sent or given up: the receiver says which); and ids the
    receiver accepted that no delivery has (a body made up or corrupted). ``later_ids``:
    deliveries written after the checked ones (still in flight: not checked, but
    known)."""
    accepted = set(accepted_ids)
    known = {str(i) for i in later_ids}
    problems = []
    for d in deliveries:
        did = str(d["id"])
        known.add(did)
        what = f"delivery {did} ({d['kind']} of {d.get('job_name')})"
        if did not in accepted:
            problems.append(
                f"{what} never reached the receiver: {d['status']} after {d['attempts']} "
                f"attempts ({d.get('last_error')})"
            )
        elif d["status"] not in ("delivered", PRUNED):
            problems.append(f"{what} reached the receiver but is recorded {d['status']}")
    for did in sorted(accepted - known):
        problems.append(f"the receiver accepted {did}, which no delivery has")
    return problems


# ---------------------------------------------------------------- auto-rollback


def _iso_to_s(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def auto_rollback_problems(
    events: Iterable[Mapping[str, Any]],
    now_s: float | None = None,
    *,
    never_healthy: Iterable[str] = (),
    slack_s: float = 30.0,
) -> list[str]:
    """Updates that roll themselves back (scheduler/auto_rollback.py), from the events
    of every job: a ``rolled_back`` event names a revision an update watched (its
    ``revised`` event has ``watched_until``), once: never twice, never a rollback's
    revision (a rollback is never watched: no loop), and the rollback it names
    (``as_revision``, ``rollback_of`` = ``to``) is recorded. With ``now_s`` (the end of
    the run, on the events' clock), the last watch of each job of ``never_healthy``
    (its drivers complete no micro-batch, so no watch of it may end healthy, the one
    verdict without an event) must have been judged (rolled back, or superseded by a
    newer revision) unless its deadline is less than ``slack_s`` behind."""
    problems = []
    judged = set(never_healthy)
    for job, items in sorted(_by_job(events).items()):
        watched: dict[int, Mapping[str, Any]] = {}
        rolled: dict[int, Mapping[str, Any]] = {}
        revisions: dict[int, Mapping[str, Any]] = {}
        latest = 0
        for e in items:
            detail = _detail(e)
            if e["kind"] == "revised" and detail.get("revision") is not None:
                revision = int(detail["revision"])
                revisions[revision] = detail
                latest = max(latest, revision)
                if detail.get("watched_until") is not None:
                    if detail.get("rollback_of") is not None:
                        problems.append(f"{job}: revision {revision}, a rollback, was watched")
                    watched[revision] = e
            elif e["kind"] == "rolled_back":
                revision = int(detail.get("revision", 0))
                if revision not in watched:
                    problems.append(
                        f"{job}: revision {revision} rolled back (event {e['id']}) but it "
                        "was not watched by an update (a rollback rolled back: a loop?)"
                    )
                elif revision in rolled:
                    problems.append(
                        f"{job}: revision {revision} rolled back twice (events "
                        f"{rolled[revision]['id']} and {e['id']})"
                    )
                rolled[revision] = e
                made = revisions.get(int(detail.get("as_revision", 0)))
                if made is None or made.get("rollback_of") != detail.get("to"):
                    problems.append(
                        f"{job}: rolled_back (event {e['id']}) names no revision "
                        f"{detail.get('as_revision')} rolling back to {detail.get('to')}"
                    )
        if now_s is None or job not in judged or latest not in watched or latest in rolled:
            continue
        until = _iso_to_s(_detail(watched[latest]).get("watched_until"))
        if until is not None and until < now_s - slack_s:
            problems.append(
                f"{job}: the watch of revision {latest} (deadline "
                f"{_detail(watched[latest]).get('watched_until')}) was never judged"
            )
    return problems


def stale_secret_problems(
    job: str,
    beats: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    values: Sequence[tuple[str, float]],
) -> list[str]:
    """No driver of ``job`` runs with a secret's value older than the value current when
    its run was claimed (docs/secrets.md: a driver gets the value as stored when it
    starts; a warm driver whose secret changed is not taken).

    ``values``: each value the secret had, in order, as (its hash as the heartbeats carry
    it, a database time at or after its commit). A driver's value is read after its
    epoch's claim committed, and a claim event is dated at its transaction's start: a
    driver of an epoch claimed after value k+1's time that still holds value k is stale.
    A beat whose hash is no value the secret had is a driver that got something else."""
    order = {digest: i for i, (digest, _) in enumerate(values)}
    claimed: dict[int, float] = {}
    for event in events:
        if event["job_name"] == job and event["kind"] == "claimed" and event["epoch"] is not None:
            claimed.setdefault(int(event["epoch"]), float(event["at_s"]))
    problems: list[str] = []
    seen: set[tuple[Any, Any, Any]] = set()
    for beat in beats:
        if beat.get("job") != job:
            continue
        key = (beat.get("epoch"), beat.get("pid"), beat.get("secret"))
        if key in seen:
            continue
        seen.add(key)
        digest = beat.get("secret")
        if digest not in order:
            problems.append(
                f"{job} epoch {beat.get('epoch')}: its driver got no value of the secret"
            )
            continue
        k = order[digest]
        at = claimed.get(int(beat["epoch"])) if beat.get("epoch") is not None else None
        # A value whose put's outcome is unknown is dated +inf: it ages none before it.
        later = min((t for _, t in values[k + 1 :]), default=math.inf)
        if at is not None and later < at:
            problems.append(
                f"{job} epoch {beat['epoch']}: claimed {at - later:.1f} s after the secret "
                f"had a newer value than value {k + 1}, which its driver ran with"
            )
    return problems


def missing_module_problems(
    job: str, beats: Sequence[Mapping[str, Any]], version: str
) -> list[str]:
    """Every driver of ``job`` imported its dependency at ``version`` (heartbeat.py
    --import: ``module`` is the version it found, None when the import failed)."""
    wrong = sorted(
        {
            (beat.get("epoch"), beat.get("module"))
            for beat in beats
            if beat.get("job") == job and beat.get("module") != version
        },
        key=str,
    )
    return [
        f"{job} epoch {epoch}: its driver imported {found!r}, not {version}"
        for epoch, found in wrong
    ]


def unresolved_flag_problems(
    events: Sequence[Mapping[str, Any]], health_epochs: Mapping[str, int]
) -> list[str]:
    """Every health flag of a run that a later run replaced is cleared (docs/alerts.md:
    ``recovered`` follows ``stalled`` whatever replaced the run). ``health_epochs``: job
    name -> the epoch of its ``run_health`` row now (the latest run that reported)."""
    flagged: dict[tuple[str, int], bool] = {}
    for event in events:
        if event["kind"] not in ("health_flagged", "health_cleared") or event["epoch"] is None:
            continue
        flagged[(event["job_name"], int(event["epoch"]))] = event["kind"] == "health_flagged"
    return [
        f"{job}: the health flag of epoch {epoch} was never cleared, though epoch "
        f"{health_epochs[job]} reported since"
        for (job, epoch), still in sorted(flagged.items())
        if still and health_epochs.get(job, epoch) > epoch
    ]


RUN_EVENTS = frozenset({"claimed", "started", "deferred", "crashed", "failed", "reaped", "stopped"})


def rollback_while_deferred_problems(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """No update is rolled back as not healthy while its run waits on a deferral (a cause
    outside the job): its latest run event before the ``rolled_back`` is no ``deferred``
    (docs/jobs.md, "Updates that roll themselves back")."""
    latest: dict[str, str] = {}
    problems = []
    for event in events:
        job, kind = event["job_name"], event["kind"]
        if kind in RUN_EVENTS:
            latest[job] = kind
        elif kind == "rolled_back" and (event.get("detail") or {}).get("cause") == "not_healthy":
            if latest.get(job) == "deferred":
                problems.append(f"{job}: rolled back as not healthy while its run was deferred")
    return problems
