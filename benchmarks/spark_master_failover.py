"""A Spark standalone master failover under sparkring: kill -9 of the active master while
a standby waits (Spark's ZooKeeper recovery mode), measured with real PySpark drivers.

Starts two masters of its own (free ports, ``spark.deploy.zookeeper.dir`` of its own on
the stack's ZooKeeper: ``testing/chaos/faults.SparkMasters``) and one worker registered
with both, one sparkring server (``testing/cluster.py``) and ``--streams`` Structured
Streaming jobs (``examples/jobs/streaming_counter.py``) on ``spark://m1,m2``. Then,
``--trials`` times: SIGKILL of the active master, and at once ``sparkring job start`` of
a new batch job (``examples/jobs/batch_sum.py``) on the same URL. Per trial:

- ``kill_to_registered``: from the kill until the new job's driver registered with a
  master (the application's ``starttime`` in the new active master's ``/json``);
- ``kill_to_takeover``: from the kill until the standby reports ``ALIVE``;
- ``streams_interrupted``: streams whose driver was replaced (a claim, a crash, a
  deferral after the kill) or whose query committed no new micro-batch within
  ``--progress-s`` after the new job registered;
- ``new_job_crashes``: ``crashed``/``failed`` events of the new job (a driver that gave up
  registering before the standby took over would spend its budget).

The killed master is started again (it stands by) before the next trial. The takeover
waits for the dead master's ZooKeeper session to expire: Spark asks for 60 s, the
ensemble grants at most its ``maxSessionTimeout``, printed with the figures.

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.spark_master_failover [--trials 5] [--streams 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks import failover  # benchmarks/failover.py: its cluster set-up
from scheduler import job_spec, jobs
from sql.states import JobKind
from testing import services, sink, waiting
from testing.chaos import faults
from testing.chaos import trial as trial_module

REPO = Path(__file__).resolve().parent.parent

STREAMING_JOB = REPO / "examples" / "jobs" / "streaming_counter.py"
BATCH_JOB = REPO / "examples" / "jobs" / "batch_sum.py"
CONF = {"spark.cores.max": "1", "spark.executor.memory": "512m"}
# A master's and a driver's JVM start on a loaded 2-core machine, and a takeover after a
# 60 s ZooKeeper session.
UP_S = 300.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def master_json(masters: faults.SparkMasters, i: int) -> dict[str, Any]:
    try:
        url = f"http://127.0.0.1:{masters.ports[i][1]}/json"
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):
        return {}


def registered_at(masters: faults.SparkMasters, name: str, since: float) -> float | None:
    """When a master registered an application called ``name`` after ``since`` (epoch
    seconds), as the master recorded it; None if none has."""
    for i in range(len(masters.ports)):
        state = master_json(masters, i)
        for app in state.get("activeapps", []) + state.get("completedapps", []):
            at = app.get("starttime", 0) / 1000
            if app.get("name") == name and at > since:
                return at
    return None


def start_worker(masters: faults.SparkMasters, folder: Path) -> subprocess.Popen[bytes]:
    env = masters.env()
    argv = [
        str(Path(env["SPARK_HOME"]) / "bin" / "spark-class"),
        "org.apache.spark.deploy.worker.Worker", masters.url(),
        "--host", "127.0.0.1", "--cores", "4", "--memory", "4g",
        "--webui-port", str(services.free_port()), "--work-dir", str(folder / "work"),
    ]  # fmt: skip
    with (folder / "worker.log").open("ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def worker_registered(masters: faults.SparkMasters) -> bool:
    return any(
        w.get("state") == "ALIVE"
        for i in range(len(masters.ports))
        for w in master_json(masters, i).get("workers", [])
    )


def max_session_timeout(zk_hosts: str) -> str:
    """The ensemble's ``maxSessionTimeout`` (its ``conf`` four-letter command)."""
    host, port = zk_hosts.split(",")[0].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(b"conf")
            text = b"".join(iter(lambda: conn.recv(4096), b"")).decode()
    except OSError:
        return "unknown"
    for line in text.splitlines():
        if line.startswith("maxSessionTimeout="):
            return line.split("=", 1)[1]
    return "unknown"


def create(t: trial_module.Trial, name: str, kind: JobKind, resource_id: int, args: list[str],
           master: str) -> None:  # fmt: skip
    with t.cluster.engine.begin() as conn:
        jobs.create(
            conn,
            job_spec.JobSpec(name=name, kind=kind, resource_id=resource_id, args=args, conf=CONF,
                         spark_master=master, max_restarts=3),
        )  # fmt: skip
        jobs.start(conn, name)


def measure(
    trials: int,
    streams: int,
    progress_s: float,
    *,
    master_jvm_options: str = "",
) -> dict[str, Any]:
    """``master_jvm_options``: the masters' JVM options (Spark's defaults unless given;
    the test passes lighter ones)."""
    out: dict[str, Any] = {"kill_to_registered": [], "kill_to_takeover": [],
                           "streams_interrupted": [], "new_job_crashes": []}  # fmt: skip
    with failover.environment() as t:
        zk_hosts = t.stack_env["SPARKRING_ZK_HOSTS"]
        out["max_session_timeout_ms"] = max_session_timeout(zk_hosts)
        folder = t.cluster_root / "spark"
        masters = faults.SparkMasters(folder, 2, zk_hosts, jvm_options=master_jvm_options)
        t.masters = masters  # stopped with the trial
        masters.start()
        worker = None
        try:
            failover.start_servers(t, ("s1",), {})
            masters.wait_answering(timeout=UP_S)
            masters.wait_active(timeout=UP_S)
            worker = start_worker(masters, folder)
            waiting.wait_until(lambda: worker_registered(masters), UP_S, interval=1.0,
                               message="the worker registered")  # fmt: skip
            url = masters.url()
            counter = t.upload("counter", STREAMING_JOB)
            batch = t.upload("batch-sum", BATCH_JOB)
            outputs = {f"stream{k}": t.cluster.root / f"stream{k}-out" for k in range(streams)}
            for name, output in outputs.items():
                create(t, name, JobKind.STREAMING, counter.id, [str(output)], url)
            for output in outputs.values():
                waiting.wait_until(lambda o=output: sink.committed_batches(o) >= 2, UP_S,
                                   interval=1.0, message=f"{output.name} committing")  # fmt: skip
            for i in range(trials):
                last = i == trials - 1
                out_i = trial(t, masters, url, batch.id, outputs, i, progress_s, last)
                for key, value in out_i.items():
                    out[key].append(value)
                log(f"trial {i + 1}/{trials}: " + ", ".join(f"{k} {v}" for k, v in out_i.items()))
        finally:
            if worker is not None:
                worker.kill()
                worker.wait(timeout=30)
    return out


def trial(
    t: trial_module.Trial,
    masters: faults.SparkMasters,
    url: str,
    batch_id: int,
    outputs: dict[str, Path],
    i: int,
    progress_s: float,
    last: bool = False,
) -> dict[str, Any]:
    """One failover; the killed master is started again (to stand by for the next
    trial) unless this is the ``last``."""
    active = masters.wait_active(timeout=UP_S)
    epochs = failover.epochs(t)
    mark = max(e["id"] for e in t.events())
    killed = time.time()
    masters.kill(active)
    name = f"probe{i}"
    create(t, name, JobKind.BATCH, batch_id, [str(t.cluster.root / f"{name}.json")], url)
    takeover: list[float] = []

    def registered() -> float | None:
        if not takeover and masters.active() not in (None, active):
            takeover.append(time.time() - killed)
        return registered_at(masters, "batch_sum", killed)

    at = failover.wait_for(registered, UP_S, f"{name}'s driver registered")
    if not takeover:
        masters.wait_active(timeout=UP_S)
        takeover.append(time.time() - killed)
    t.wait_state(name, "finished", UP_S)
    # Each stream must go on committing from the driver it had before the kill.
    committed = {n: sink.committed_batches(o) for n, o in outputs.items()}
    deadline = time.monotonic() + progress_s
    waiting.wait_until(
        lambda: (
            time.monotonic() >= deadline
            or all(sink.committed_batches(o) >= committed[n] + 2 for n, o in outputs.items())
        ),
        progress_s + 5,
        interval=1.0,
    )
    later = [e for e in t.events() if e["id"] > mark]
    interrupted = 0
    for stream, output in outputs.items():
        touched = any(
            e["job_name"] == stream and e["kind"] in ("claimed", "crashed", "failed", "deferred")
            for e in later
        )
        stalled = sink.committed_batches(output) < committed[stream] + 2
        if touched or stalled or failover.epochs(t)[stream] != epochs[stream]:
            interrupted += 1
    crashes = sum(1 for e in later if e["job_name"] == name and e["kind"] in ("crashed", "failed"))
    if not last:
        masters.start(active)  # it comes back as a standby
        waiting.wait_until(lambda: masters.status(active) == "STANDBY", UP_S, interval=1.0,
                           message="the killed master back as a standby")  # fmt: skip
    return {
        "kill_to_registered": round(at - killed, 2),
        "kill_to_takeover": round(takeover[0], 2),
        "streams_interrupted": interrupted,
        "new_job_crashes": crashes,
    }


def summary(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "p50": round(statistics.median(samples), 2),
        "max": round(max(samples), 2),
        "min": round(min(samples), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument(
        "--progress-s",
        type=float,
        default=60.0,
        help="how long a stream may take to commit 2 batches after the failover",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (with raw samples)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    raw = measure(args.trials, args.streams, args.progress_s)
    result = {
        "trials": args.trials,
        "streams": args.streams,
        "max_session_timeout_ms": raw.pop("max_session_timeout_ms"),
        "raw": raw,
        "summary": {k: summary(raw[k]) for k in ("kill_to_registered", "kill_to_takeover")},
        "streams_interrupted": sum(raw["streams_interrupted"]),
        "new_job_crashes": sum(raw["new_job_crashes"]),
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"ZooKeeper maxSessionTimeout: {result['max_session_timeout_ms']} ms")
    print(f"{'measurement':<22} {'n':>3} {'p50 s':>7} {'max s':>7}")
    for key, s in result["summary"].items():
        if s["n"]:
            print(f"{key:<22} {s['n']:>3} {s['p50']:>7.2f} {s['max']:>7.2f}")
    print(
        f"streams interrupted: {result['streams_interrupted']} of "
        f"{args.streams} x {args.trials} failovers; new jobs' crashes: {result['new_job_crashes']}"
    )


if __name__ == "__main__":
    main()
