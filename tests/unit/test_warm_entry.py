"""The warm driver's entry point (server/warm_entry.py) with a stand-in pyspark: it says
ready once its session is built, runs no job code before go.json, then runs the job's
main as ``python main.py ARGS`` would; without go it exits EXIT_NO_GO, the main unrun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from server import rundir, warm_entry

# A stand-in pyspark: getOrCreate() returns one session and counts its builds.
FAKE_PYSPARK_SQL = textwrap.dedent(
    """
    import os, threading, time

    CANCELLED = threading.Event()

    class _Context:
        def cancelAllJobs(self):
            open(os.environ["RAN"] + ".cancelled", "w").close()
            CANCELLED.set()

    class _Frame:
        def selectExpr(self, *columns):
            return self

        @property
        def write(self):
            return self

        def mode(self, mode):
            return self

        def json(self, path):
            if os.environ.get("NO_EXECUTORS"):  # a cluster with no free core: waits
                CANCELLED.wait()
                time.sleep(float(os.environ.get("CANCEL_LATENCY", "0")))  # Spark's is async
                raise RuntimeError("cancelled")
            os.makedirs(path, exist_ok=True)

    class _Session:
        sparkContext = _Context()

        def range(self, n):
            return _Frame()

    class _Builder:
        session = None

        def getOrCreate(self):
            if _Builder.session is None:
                _Builder.session = _Session()
            return _Builder.session

    class SparkSession:
        builder = _Builder()
    """
)
MAIN = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession
    same = SparkSession.builder.getOrCreate() is SparkSession.builder.getOrCreate()
    with open(os.environ["RAN"], "w") as f:
        json.dump({"argv": sys.argv, "name": __name__, "same": same, "path0": sys.path[0]}, f)
    sys.exit(0 if __name__ == "__main__" else 9)
    """
)


def _start(tmp_path: Path, go_timeout: float, **env: str) -> tuple[subprocess.Popen[str], Path]:
    fake = tmp_path / "fake" / "pyspark"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "sql.py").write_text(FAKE_PYSPARK_SQL)
    run_dir = tmp_path / "run"
    (run_dir / "cwd").mkdir(parents=True)
    main = tmp_path / "job" / "main.py"
    main.parent.mkdir()
    main.write_text(MAIN)
    entry = run_dir / "sparkring_warm.py"
    shutil.copy(warm_entry.__file__, entry)
    rundir.write_json_atomically(
        run_dir / rundir.WARM_FILE,
        {"main": str(main), "go_timeout": go_timeout, "warm_up_wait": 0.5},
    )
    ran = tmp_path / "ran.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "fake"),
        "SPARKRING_RUN_DIR": str(run_dir),
        "RAN": str(ran),
        **env,
    }
    process = subprocess.Popen(
        [sys.executable, str(entry), "--rows", "5"],
        cwd=run_dir / "cwd",
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    return process, ran


def test_the_job_s_main_runs_only_after_the_go_signal_as_its_own_main(tmp_path: Path) -> None:
    process, ran = _start(tmp_path, go_timeout=60)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == warm_entry.READY_LINE
    time.sleep(0.5)
    assert not ran.exists(), "the job's main ran before its go signal"
    rundir.write_go(tmp_path / "run" / rundir.GO_FILE)
    process.communicate(timeout=30)
    assert process.returncode == 0
    seen = json.loads(ran.read_text())
    main = str(tmp_path / "job" / "main.py")
    assert seen == {"argv": [main, "--rows", "5"], "name": "__main__", "same": True,
                    "path0": str(tmp_path / "job")}  # fmt: skip


def test_without_a_go_signal_the_main_never_runs(tmp_path: Path) -> None:
    process, ran = _start(tmp_path, go_timeout=0.5)
    process.communicate(timeout=30)
    assert process.returncode == warm_entry.EXIT_NO_GO
    assert not ran.exists()


def test_a_warm_up_job_that_waits_for_executors_delays_neither_ready_nor_the_main(
    tmp_path: Path,
) -> None:
    """On a cluster with no free executor the warm-up job waits for ever: the session is
    called ready after the warm-up's wait, and the warm-up is cancelled at the go."""
    process, ran = _start(tmp_path, go_timeout=60, NO_EXECUTORS="1")
    assert process.stdout is not None
    assert process.stdout.readline().strip() == warm_entry.READY_LINE
    rundir.write_go(tmp_path / "run" / rundir.GO_FILE)
    process.communicate(timeout=30)
    assert process.returncode == 0 and ran.exists()
    assert Path(f"{ran}.cancelled").exists()


def test_a_cancelled_warm_up_ends_before_the_main_runs(tmp_path: Path) -> None:
    """The cancelled warm-up's thread prints its failure: it must be done before the
    job's main runs. A thread still printing when a short main returns aborts the
    interpreter's exit (CI, 2026-11-27: "Fatal Python error: _enter_buffered_busy",
    SIGABRT), which the watchdog reads as the driver's crash."""
    process, _ = _start(tmp_path, go_timeout=60, NO_EXECUTORS="1", CANCEL_LATENCY="0.5")
    assert process.stdout is not None
    assert process.stdout.readline().strip() == warm_entry.READY_LINE
    rundir.write_go(tmp_path / "run" / rundir.GO_FILE)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0, out
    lines = out.splitlines()
    failed = lines.index("sparkring-warm: warm-up job failed: RuntimeError")
    assert failed < lines.index("sparkring-warm: go: running the job's main"), lines
