"""Sample streaming job: the `rate` source to a file sink, resumable from its checkpoint.

Reads SPARKRING_CHECKPOINT_DIR (required), SPARKRING_JOB, SPARKRING_EPOCH and
SPARKRING_SERVER. Every micro-batch (trigger ~1 s) appends the new `value`s of the rate
source, with the epoch and server that wrote them, as JSON files under OUTPUT. The file
sink commits each batch in OUTPUT/_spark_metadata together with the checkpoint, so a
restart anywhere with the same checkpoint resumes without a duplicated or lost value.

    spark-submit streaming_counter.py OUTPUT [--heartbeats FILE] [--rows-per-second N]

--heartbeats appends {"job","epoch","server","pid","t"} every 0.5 s while the driver
lives (tests use it to prove that two drivers of one job never overlapped). SIGTERM
stops the query cleanly and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

HEARTBEAT_INTERVAL_S = 0.5


def heartbeat(path: str, stop: threading.Event) -> None:
    identity = {
        "job": os.environ.get("SPARKRING_JOB"),
        "epoch": os.environ.get("SPARKRING_EPOCH"),
        "server": os.environ.get("SPARKRING_SERVER"),
        "pid": os.getpid(),
    }
    parent = os.getppid()
    while not stop.is_set():
        if os.getppid() != parent:
            # Our JVM is gone (killed): a driver without its JVM must not look alive.
            os._exit(1)
        line = json.dumps({**identity, "t": time.time()}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        stop.wait(HEARTBEAT_INTERVAL_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--heartbeats", default=None)
    parser.add_argument("--rows-per-second", type=int, default=5)
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    args = parser.parse_args()
    checkpoint = os.environ.get("SPARKRING_CHECKPOINT_DIR")
    if not checkpoint:
        print("streaming_counter: SPARKRING_CHECKPOINT_DIR is not set", file=sys.stderr)
        return 2

    stop = threading.Event()
    # The handler only sets the event: calling into the JVM from a signal handler could
    # re-enter py4j in the middle of another call.
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    if args.heartbeats:
        threading.Thread(
            target=heartbeat, args=(args.heartbeats, stop), name="heartbeat", daemon=True
        ).start()

    from pyspark.sql import SparkSession, functions

    spark = SparkSession.builder.appName("streaming_counter").getOrCreate()
    stream = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", args.rows_per_second)
        .load()
        .select(
            "value",
            "timestamp",
            functions.lit(os.environ.get("SPARKRING_EPOCH", "")).alias("epoch"),
            functions.lit(os.environ.get("SPARKRING_SERVER", "")).alias("server"),
        )
    )
    query = (
        stream.writeStream.format("json")
        .option("path", args.output)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{args.trigger_seconds} seconds")
        .start()
    )
    print(f"streaming_counter: query {query.id} started, output {args.output}", flush=True)
    try:
        while not stop.is_set():
            if query.awaitTermination(0.5):
                # The query ended without being asked to: report its error.
                error = query.exception()
                print(f"streaming_counter: query ended: {error}", file=sys.stderr)
                return 1
        query.stop()
        spark.stop()
    except Exception as exc:
        if not stop.is_set():
            raise
        # SIGTERM reached the JVM too (same process group): its shutdown may win the race
        # with query.stop(). An uncommitted batch is redone by the next run.
        print(f"streaming_counter: JVM shut down during stop: {exc}", file=sys.stderr)
    print("streaming_counter: stopped on SIGTERM", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
