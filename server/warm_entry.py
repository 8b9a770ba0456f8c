"""The warm driver's entry point: spark-submit runs this file instead of the job's main.

Copied into the run directory as ``sparkring_warm.py`` (``driver.WARM_ENTRY_FILE``) for
a warm hand-off (docs/drivers.md, "Warm hand-off"); it imports nothing of sparkring's,
so the driver's user needs nothing but its run directory. It:

1. builds the SparkSession with the job's conf (spark-submit's ``--conf``): the JVM
   starts, the application registers with its master; then runs one tiny job of its own
   (:func:`warm_up`, on a thread of its own, awaited at most :data:`WARM_UP_WAIT_S`),
   writing only below its working directory, so that task scheduling, code generation
   and the file output path are loaded before the job's first batch needs them. A
   warm-up still waiting at the go signal (no executor yet) is cancelled then, and
   awaited (at most :data:`WARM_UP_CANCEL_WAIT_S`) before the job's main runs;
2. prints :data:`READY_LINE` to the driver log, where its server looks for it;
3. waits for ``go.json`` in the run directory (``SPARKRING_RUN_DIR``), which its server
   writes only once the old driver is gone and its claim committed (the epoch is its);
   exits with :data:`EXIT_NO_GO` if none comes within the time in ``warm.json`` (its
   watchdog kills it at the same bound anyway: nothing is recorded for either);
4. runs the job's main as ``python main.py args`` would: ``sys.argv`` is the main and
   the job's arguments, ``__name__ == "__main__"``, and the main's folder first on
   ``sys.path``. The job's ``SparkSession.builder.getOrCreate()`` returns the warm
   session. A job that builds its own ``SparkContext`` fails there ("Cannot run
   multiple SparkContexts"): it opts out with ``--conf sparkring.handoff.warm=false``.

No job code runs before step 4, so a warm driver that is never told to go never
touches the job's checkpoint or output.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

READY_LINE = "sparkring-warm: session ready"
EXIT_NO_GO = 75  # EX_TEMPFAIL: no go signal came in time; nothing of the job ran
GO_POLL_S = 0.05
# The longest the warm-up job is awaited before the session is called ready (seconds):
# on a cluster with no free executor it would wait for ever.
WARM_UP_WAIT_S = 20.0
# How long a cancelled warm-up is awaited before the job's main runs (seconds).
WARM_UP_CANCEL_WAIT_S = 10.0


def _wait_for_go(go_file: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not go_file.exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(GO_POLL_S)
    return True


def warm_up(spark: Any, done: threading.Event) -> None:
    """A tiny job of the warm session's own (a failure only means a colder start)."""
    try:
        frame = spark.range(16).selectExpr("id", "CAST(id AS STRING) AS s")
        frame.write.mode("overwrite").json(os.path.join(os.getcwd(), ".sparkring-warm-up"))
    except Exception as exc:
        print(f"sparkring-warm: warm-up job failed: {type(exc).__name__}", flush=True)
    finally:
        done.set()


def main() -> int:
    run_dir = Path(os.environ["SPARKRING_RUN_DIR"])
    settings = json.loads((run_dir / "warm.json").read_text())
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    warmed = threading.Event()
    threading.Thread(target=warm_up, args=(spark, warmed), name="warm-up", daemon=True).start()
    warmed.wait(float(settings.get("warm_up_wait", WARM_UP_WAIT_S)))
    print(READY_LINE, flush=True)
    if not _wait_for_go(run_dir / "go.json", float(settings["go_timeout"])):
        print("sparkring-warm: no go signal in time; exiting", flush=True)
        return EXIT_NO_GO
    if not warmed.is_set():
        spark.sparkContext.cancelAllJobs()  # only the warm-up's: no job code ran yet
        # Its thread prints the failure, then ends: awaited, so that it is not printing
        # when a short main returns. A daemon thread holding stdout's lock at the
        # interpreter's exit aborts it (SIGABRT), which the watchdog reads as a crash.
        warmed.wait(WARM_UP_CANCEL_WAIT_S)
    print("sparkring-warm: go: running the job's main", flush=True)
    main_path = str(settings["main"])
    sys.argv = [main_path, *sys.argv[1:]]
    sys.path[0] = os.path.dirname(main_path)
    runpy.run_path(main_path, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
