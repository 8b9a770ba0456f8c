#!/usr/bin/env python3
"""The HA demo (``make demo``): a real sparkring cluster on the local stack.

Three servers, a real PySpark streaming job (Structured Streaming with a checkpoint), a
PySpark batch job, a few light streaming drivers and a light batch job on a schedule
(``@every 5s``); an alert to a local webhook receiver arrives, signed, when a batch job
fails; then one server is killed with -9 and the recovery is shown (the
scheduled job's fires continue: each fire time once, printed from ``job runs``), a
fourth server joins and the migration is shown, and a summary gives the measured times.
Everything it started is stopped at the end.

Runs against the stack started by scripts/stack.py, in a database, ZooKeeper root and
bucket of its own (``sparkring_demo``), so it can be run again and again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from server import defaults
from testing import services, sink, waiting
from testing.chaos import invariants
from testing.cluster import Cluster
from testing.webhook_receiver import Receiver

REPO = Path(__file__).resolve().parent.parent

# Piped (make demo | tee demo.log, CI logs): as wide as a wide terminal, and no line of
# the CLI's own output (printed as text) is wrapped; Rich would assume 80 columns.
PIPED_WIDTH = 160


def make_console(terminal: bool) -> Console:
    return Console() if terminal else Console(width=PIPED_WIDTH, soft_wrap=True)


console = make_console(sys.stdout.isatty())
JOBS_DIR = REPO / "examples" / "jobs"
LIGHT_JOB = REPO / "testing" / "jobs" / "heartbeat.py"
LIGHT_JOBS = [f"ingest-{i}" for i in range(1, 6)]
# The scheduled job: a light batch driver every 5 s (docs/schedules.md).
TICK = "tick"
TICK_SPEC = "@every 5s"
# A batch job whose driver fails (exit 2, no retry), and the alert that tells a local
# webhook receiver so (docs/alerts.md).
BROKEN = "broken-report"
ALERT = "oncall"


def step(text: str) -> None:
    console.rule(f"[bold]{text}")


def show_jobs(c: Cluster) -> None:
    table = Table(show_edge=False, header_style="bold")
    for column in ("job", "kind", "state", "owner", "target", "epoch", "attempt"):
        table.add_column(column)
    for name in ["clicks", "daily-sum", *LIGHT_JOBS]:
        j = c.job(name)
        table.add_row(
            name, j["kind"], j["state"], j["owner"] or "-", j["target"] or "-",
            str(j["epoch"]), str(j["attempt"]),
        )  # fmt: skip
    console.print(table)


def record_time(c: Cluster, job: str, epoch: int, event: str, timeout: float = 30.0) -> float:
    """When the watchdog of ``job``'s run at ``epoch`` wrote its ``event`` record
    (``started``, ``ended``). Waited for: the server records a run ``running`` as soon
    as it has spawned the watchdog, which appends ``started`` only after the driver's
    spawn, so reading at once sometimes found nothing and the summary lost its figure."""

    def found() -> float | None:
        for r in c.driver_records():
            if r["job"] == job and r["epoch"] == epoch and r["event"] == event:
                return float(r["t"])
        return None

    waiting.wait_until(
        lambda: found() is not None,
        timeout,
        interval=0.1,
        message=f"the watchdog's {event} record of {job} at epoch {epoch}",
    )
    t = found()
    assert t is not None
    return t


def started_at(c: Cluster, job: str, epoch: int) -> float:
    return record_time(c, job, epoch, "started")


def ended_at(c: Cluster, job: str, epoch: int) -> float:
    return record_time(c, job, epoch, "ended")


def claimed_warm(c: Cluster, job: str, epoch: int) -> bool:
    """The claim of ``epoch`` took a warm driver (docs/drivers.md, "Warm hand-off")."""
    return any(
        e["kind"] == "claimed" and e["epoch"] == epoch and e["detail"].get("warm", False)
        for e in c.events(job)
    )


def fires_through_kill(c: Cluster, switched_on: Any, summary: dict[str, str]) -> None:
    """Two more fires of the scheduled job ran after the kill; its runs are printed, and
    every fire time since it was switched on is checked: once, or skipped with its
    cause (the chaos campaign's S6 checker)."""

    def finished() -> int:
        runs = json.loads(c.cli("job", "runs", TICK, "--json", "--limit", "1000").stdout)
        return sum(r["state"] == "finished" for r in runs)

    before = finished()
    waiting.wait_until(lambda: finished() >= before + 2, 120, interval=1)
    ((until,),) = c.sql("SELECT fires_checked_until FROM jobs WHERE name = :n", n=TICK)
    runs = json.loads(c.cli("job", "runs", TICK, "--json", "--limit", "1000").stdout)
    console.print(c.cli("job", "runs", TICK, "--limit", "12").stdout)
    expected = invariants.fire_times(TICK_SPEC, "UTC", switched_on, until)
    window = invariants.ScheduleWindow(TICK, expected, "forbid")
    problems = invariants.fire_problems(window, runs, lateness_bound=15.0)
    for problem in problems:
        console.print(f"[red]{problem}[/]")
    mine = [r for r in runs if r["scheduled_time"] is not None]
    ran = sum(r["state"] != "skipped" for r in mine)
    summary[f"{TICK} ({TICK_SPEC}) fire times through the kill -9"] = (
        f"{len(expected)}: {ran} ran, {len(mine) - ran} skipped (previous run still running), "
        f"{len(problems)} problems (missed or doubled)"
    )


def alert_on_failure(c: Cluster, receiver: Receiver, root: Path, summary: dict[str, str]) -> None:
    """An alert of failures to a local webhook receiver; a batch job that fails; the
    alert arriving, signed (docs/alerts.md)."""
    assert receiver.secret is not None
    secret = root / "alert-secret"
    secret.write_text(receiver.secret)
    secret.chmod(0o600)
    console.print(
        c.cli(
            "alert", "create", ALERT, "--webhook", receiver.url, "--secret-file", str(secret),
            "--on", "failed",
        ).stdout.strip()
    )  # fmt: skip
    c.cli(
        "job", "create", BROKEN, "--resource", "ingest", "--kind", "batch", "--max-retries", "0",
        f"--arg={root / 'broken.jsonl'}", "--arg=--run-for", "--arg=0.5",
        "--arg=--exit-code", "--arg=2",
    )  # fmt: skip
    c.cli("job", "start", BROKEN)
    c.wait_job(BROKEN, lambda j: j["state"] == "failed", 120, f"{BROKEN} failed")
    waiting.wait_until(
        lambda: bool(receiver.accepted_ids()), 60, interval=0.2, message="the alert arrived"
    )
    got = next(r for r in receiver.received if 200 <= r.status < 300)
    failed = next(e for e in c.events(BROKEN) if e["kind"] == "failed")
    body = got.body
    console.print(
        f"alert received at {receiver.url}: kind {body['kind']}, job {body['job']}, "
        f"on {body['server']}, epoch {body['epoch']}, signature "
        f"{'verified' if got.signature_ok else 'WRONG'}\n  detail: {body['detail']}\n"
        f"  console: {body['url']}"
    )
    console.print(c.cli("alert", "deliveries").stdout)
    failed_at = failed["at"].timestamp()
    summary["batch job failed -> alert received (signed)"] = (
        f"{got.wall - failed_at:.2f} s ({len(receiver.received)} request"
        f"{'s' if len(receiver.received) != 1 else ''})"
    )


def running(j: dict[str, Any]) -> bool:
    return j["state"] == "running" and j["owner"] is not None


def fresh_database(stack: dict[str, str]) -> str:
    url = sa.make_url(stack["SPARKRING_DATABASE_URL"]).set(database="sparkring_demo")
    admin = services.admin_engine(stack["SPARKRING_DATABASE_URL"])
    with admin.connect() as conn:
        conn.execute(sa.text("DROP DATABASE IF EXISTS sparkring_demo WITH (FORCE)"))
        conn.execute(sa.text("CREATE DATABASE sparkring_demo"))
    admin.dispose()
    rendered = url.render_as_string(hide_password=False)
    from sql import database, migrate

    engine = database.create_engine(rendered, pool_size=1)
    migrate.upgrade(engine)
    engine.dispose()
    return rendered


def summary_table(summary: dict[str, str]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    table.add_column("what")
    table.add_column("measured")
    for key, value in summary.items():
        table.add_row(key, value)
    return table


def main() -> int:
    stack = services.stack_env()
    root = Path(tempfile.mkdtemp(prefix="sparkring-demo-", dir=stack.get("SPARKRING_STACK_DIR")))
    c = Cluster(
        stack,
        fresh_database(stack),
        f"/sparkring-demo/{int(time.time())}",
        "sparkring-demo",
        root,
        # The product's wait for a warm driver (the harness's is shorter, for the chaos
        # campaign's recovery bound): the demo's roll shows the warm hand-off as shipped.
        extra_env={"SPARKRING_WARM_READY_WAIT": f"{defaults.WARM_READY_WAIT_S:g}"},
    )
    interrupted = False

    def on_signal(*_: object) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    summary: dict[str, str] = {}
    receiver = Receiver(secret=f"demo-{os.getpid()}-{time.time_ns()}").start()
    try:
        step("1. three servers")
        for sid in ("s1", "s2", "s3"):
            c.start_server(sid, capacity=4)
        c.wait_members(3, timeout=60)
        console.print(c.cli("server", "list").stdout)
        token = c.cli("token", "create", "demo", "--role", "operator").stdout.strip()
        first = json.loads(c.cli("server", "list", "--json").stdout)[0]
        console.print(
            f"web console: {first['health_url']}/console/ (any server's), token: {token}\n"
            "open it now to watch the failover below happen"
        )

        step("2. upload artifacts, create and start jobs; an alert when a job fails")
        c.cli("resource", "upload", "clicks", str(JOBS_DIR / "streaming_counter.py"))
        c.cli("resource", "upload", "daily-sum", str(JOBS_DIR / "batch_sum.py"))
        c.cli("resource", "upload", "ingest", str(LIGHT_JOB))
        output = root / "clicks-output"
        c.cli(
            "job", "create", "clicks", "--resource", "clicks", "--kind", "streaming",
            "--conf", "spark.sql.shuffle.partitions=1", f"--arg={output}",
            f"--arg=--heartbeats={c.heartbeats}",
        )  # fmt: skip
        c.cli(
            "job", "create", "daily-sum", "--resource", "daily-sum", "--kind", "batch",
            f"--arg={root / 'daily-sum-output'}",
        )  # fmt: skip
        for name in LIGHT_JOBS:
            c.cli("job", "create", name, "--resource", "ingest", f"--arg={root / 'ingest.jsonl'}")
        c.cli(
            "job", "create", TICK, "--resource", "ingest", "--kind", "batch",
            f"--arg={root / 'tick.jsonl'}", "--arg=--run-for", "--arg=0.5",
            "--schedule", TICK_SPEC,
        )  # fmt: skip
        console.print(c.cli("job", "start", TICK).stdout.strip())
        ((tick_on,),) = c.sql("SELECT fires_checked_until FROM jobs WHERE name = :n", n=TICK)
        t_start = time.time()
        for name in ["clicks", "daily-sum", *LIGHT_JOBS]:
            c.cli("job", "start", name)
        for name in ["clicks", *LIGHT_JOBS]:
            c.wait_job(name, running, 120, f"{name} running")
        first = c.job("clicks")
        spawn = started_at(c, "clicks", first["epoch"])
        summary["job start -> driver spawned (clicks)"] = f"{spawn - t_start:.2f} s"
        c.wait_job("daily-sum", lambda j: j["state"] == "finished", 180, "batch finished")
        alert_on_failure(c, receiver, root, summary)
        waiting.wait_until(lambda: sink.committed_batches(output) >= 3, 180, interval=0.5)
        show_jobs(c)
        console.print(f"clicks committed {sink.committed_batches(output)} micro-batches so far")

        step(f"3. kill -9 {first['owner']}, the owner of the streaming job 'clicks'")
        victim = first["owner"]
        owned_before = [n for n in ["clicks", *LIGHT_JOBS] if c.job(n)["owner"] == victim]
        killed_at = time.time()
        c.kill(victim)
        moved = c.wait_job(
            "clicks", lambda j: running(j) and j["owner"] != victim, 120, "clicks failed over"
        )
        new_spawn = started_at(c, "clicks", moved["epoch"])
        old_end = ended_at(c, "clicks", first["epoch"])
        for name in LIGHT_JOBS:
            c.wait_job(name, lambda j: running(j) and j["owner"] != victim, 120, f"{name} moved")
        show_jobs(c)
        summary["kill -9 -> new driver spawned"] = f"{new_spawn - killed_at:.2f} s"
        summary["kill -9 -> old driver killed by its watchdog"] = f"{old_end - killed_at:.2f} s"
        before = sink.committed_batches(output)
        waiting.wait_until(lambda: sink.committed_batches(output) >= before + 2, 180, interval=0.5)
        console.print(
            f"clicks resumed on {moved['owner']} from its checkpoint: "
            f"{sink.committed_batches(output)} micro-batches committed"
        )

        fires_through_kill(c, tick_on, summary)

        step(f"4. {victim}, killed in step 3, comes back: a return takes back no job")
        placed = {n: (c.job(n)["owner"], c.job(n)["epoch"]) for n in ["clicks", *LIGHT_JOBS]}
        c.start_server(victim, capacity=4)
        c.wait_members(3, timeout=60)

        def seen_back() -> bool:
            """The coordinator's rebalance that saw it back (left_at cleared) is done."""
            rows = c.sql("SELECT left_at FROM ring_members WHERE server = :s", s=victim)
            return bool(rows) and rows[0].left_at is None

        waiting.wait_until(seen_back, 60, interval=0.5, message=f"{victim} seen back")
        waiting.wait_until(
            lambda: all(running(j) and j["owner"] == j["target"] for j in map(c.job, placed)),
            60,
            interval=0.5,
            message="jobs settled after the return",
        )
        show_jobs(c)
        moved_back = [n for n in placed if (c.job(n)["owner"], c.job(n)["epoch"]) != placed[n]]
        summary[f"{victim}'s return: jobs moved (of {len(owned_before)} that failed over)"] = (
            f"{len(moved_back)}" + (f" ({', '.join(moved_back)})" if moved_back else "")
        )

        step("5. a fourth server joins")
        owners = {n: c.job(n)["owner"] for n in ["clicks", *LIGHT_JOBS]}
        epochs = {n: c.job(n)["epoch"] for n in owners}
        c.start_server("s4", capacity=4)
        c.wait_members(4, timeout=60)

        def settled() -> bool:
            jobs = [c.job(n) for n in owners]
            return all(running(j) and j["owner"] == j["target"] for j in jobs) and any(
                j["owner"] == "s4" for j in jobs
            )

        waiting.wait_until(settled, 180, interval=0.5, message="jobs settled after the join")
        show_jobs(c)
        moved_jobs = [n for n in owners if c.job(n)["owner"] != owners[n]]
        gaps = []
        for n in moved_jobs:
            new_epoch = c.job(n)["epoch"]
            gaps.append(started_at(c, n, new_epoch) - ended_at(c, n, epochs[n]))
        ideal = len(owners) / 4
        summary["jobs moved on the join (ideal K/(N+1))"] = f"{len(moved_jobs)} ({ideal:.1f})"
        if gaps:
            summary["hand-off gap, old driver ended -> new spawned"] = (
                f"max {max(gaps):.2f} s, mean {sum(gaps) / len(gaps):.2f} s"
            )

        if "clicks" in moved_jobs:
            moved_epoch = c.job("clicks")["epoch"]
            waiting.wait_until(
                lambda: moved_epoch in sink.written_by_epoch(output), 180, interval=0.5
            )
            summary["join: clicks's output gap, last batch on the old server -> first on s4"] = (
                f"{sink.output_gap(output, epochs['clicks'], moved_epoch):.2f} s"
                + (" (warm hand-off)" if claimed_warm(c, "clicks", moved_epoch) else " (cold)")
            )

        step("6. a new version of the streaming job: upload it, update the job, it rolls")
        v2 = root / "v2" / "streaming_counter.py"
        v2.parent.mkdir()
        v2.write_text((JOBS_DIR / "streaming_counter.py").read_text() + "# version 2\n")
        console.print(c.cli("resource", "upload", "clicks", str(v2)).stdout.strip())
        before_roll = c.job("clicks")
        console.print(c.cli("job", "update", "clicks", "--resource", "clicks").stdout.strip())
        rolled = c.wait_job(
            "clicks",
            lambda j: running(j) and j["run_revision"] == 2,
            180,
            "clicks rolled to revision 2",
        )
        before = sink.committed_batches(output)
        waiting.wait_until(lambda: sink.committed_batches(output) >= before + 2, 180, interval=0.5)
        console.print(c.cli("job", "history", "clicks").stdout)
        end = ended_at(c, "clicks", before_roll["epoch"])
        start = started_at(c, "clicks", rolled["epoch"])
        summary["version update: old driver ended -> revision 2 spawned"] = (
            f"{start - end:.2f} s ({rolled['epoch'] - before_roll['epoch']} move)"
        )
        waiting.wait_until(
            lambda: rolled["epoch"] in sink.written_by_epoch(output), 180, interval=0.5
        )
        summary["version update: output gap, last batch of v1 -> first of v2"] = (
            f"{sink.output_gap(output, before_roll['epoch'], rolled['epoch']):.2f} s"
            + (" (warm hand-off)" if claimed_warm(c, "clicks", rolled["epoch"]) else " (cold)")
        )
        console.print(
            f"clicks runs revision 2 on {rolled['owner']} from the same checkpoint: "
            f"{sink.committed_batches(output)} micro-batches committed"
        )

        step("7. stop: exactly-once check of the streaming output, then every server")
        c.cli("job", "stop", TICK)
        c.cli("job", "stop", "clicks")
        c.wait_job("clicks", lambda j: j["state"] == "stopped", 120, "clicks stopped")
        values = sink.committed_values(output)
        duplicates = len(values) - len(set(values))
        missing = (max(values) - min(values) + 1 - len(set(values))) if values else 0
        summary["streaming output values (duplicates, missing)"] = (
            f"{len(values)} ({duplicates}, {missing})"
        )
        summary["daily-sum (batch) runs"] = str(
            sum(1 for e in c.events("daily-sum") if e["kind"] == "claimed")
        )
        for sid in list(c.servers):
            code = c.terminate(sid, timeout=90)
            console.print(f"{sid} stopped with exit code {code}")
    except (KeyboardInterrupt, AssertionError) as exc:
        console.print(f"[red]demo stopped: {exc or 'interrupted'}[/]")
        for sid in ("s1", "s2", "s3", "s4"):
            log = c.log(sid)
            if log:
                console.print(
                    f"--- last lines of {sid}'s log ---\n" + "\n".join(log.splitlines()[-5:])
                )
        return 1
    finally:
        c.close()
        receiver.stop()
    step("summary (measured on this machine)")
    console.print(summary_table(summary))
    console.print(
        f"timeouts: ZooKeeper session {c.env['SPARKRING_ZK_SESSION_TIMEOUT']} s, "
        f"lease {c.env['SPARKRING_LEASE_TTL']} s, "
        f"watchdog margin {c.env['SPARKRING_WATCHDOG_MARGIN']} s"
    )
    console.print(f"logs and outputs: {root}\nstop the local stack with: make down")
    return 0 if not interrupted else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
