"""A streaming job whose query stops progressing on demand, for the health monitor's
end-to-end test (tests/e2e/test_health.py).

A `rate` source (1 row/s) to foreachBatch, checkpointed in SPARKRING_CHECKPOINT_DIR,
one micro-batch per second. While the file STALL exists, the batch in progress waits
inside foreachBatch: the driver and its SparkSession live on, but no batch completes
(as a sink that hangs would do). Removing the file lets the batch finish. SIGTERM
stops the query (removing STALL first) and exits 0.

    spark-submit stallable_stream.py STALL
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession


def main() -> int:
    stall = Path(sys.argv[1])
    spark = SparkSession.builder.appName("stallable_stream").getOrCreate()

    def each_batch(frame, batch_id: int) -> None:
        while stall.exists():
            time.sleep(0.2)
        frame.count()

    stop = threading.Event()
    # The handler only sets the event (calling into the JVM from it could re-enter py4j).
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 1)
        .load()
        .writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", os.environ["SPARKRING_CHECKPOINT_DIR"])
        .trigger(processingTime="1 second")
        .start()
    )
    while not stop.is_set():
        if query.awaitTermination(0.5):
            print(f"stallable_stream: query ended: {query.exception()}", file=sys.stderr)
            return 1
    stall.unlink(missing_ok=True)  # a batch waiting in foreachBatch must end for stop()
    try:
        query.stop()
        spark.stop()
    except Exception as exc:  # the JVM got SIGTERM too and may be gone first
        print(f"stallable_stream: JVM shut down during stop: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
