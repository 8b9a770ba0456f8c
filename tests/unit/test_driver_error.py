"""The one-line error of a failed driver (server/driver_error.py)."""

from __future__ import annotations

from pathlib import Path

from server import driver_error

DATA = Path(__file__).parents[1] / "data"

PYTHON = """\
26/11/25 11:02:18 INFO SparkContext: Running Spark version 4.3.0
Traceback (most recent call last):
  File "/work/job.py", line 9, in <module>
    main()
  File "/work/job.py", line 5, in main
    raise ValueError("bad row 17:\\tno key")
ValueError: bad row 17:	no key
2026-11-25 11:02:30,001 sparkring-watchdog[42] INFO driver ended: reason=exited exit_code=1
"""

PY4J = """\
Traceback (most recent call last):
  File "/work/job.py", line 3, in <module>
    spark.range(3).collect()
py4j.protocol.Py4JJavaError: An error occurred while calling o33.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:1)
"""


def test_the_master_outage_is_named_by_sparks_own_line() -> None:
    text = (DATA / "spark_driver_no_master.log").read_text()
    assert driver_error.first_exception(text) == (
        "SparkException: Failed to connect to master 127.0.0.1:27977: "
        "Exception thrown in awaitResult"
    )


def test_a_python_exception_is_its_last_traceback_line() -> None:
    assert driver_error.first_exception(PYTHON) == "ValueError: bad row 17:\tno key"


def test_a_py4j_error_names_the_java_exception() -> None:
    assert driver_error.first_exception(PY4J) == (
        "SparkException: Job aborted due to stage failure: Task 0 failed"
    )


def test_a_bare_exception_and_none_at_all() -> None:
    assert driver_error.first_exception(
        "Traceback (most recent call last):\n  x\nKeyboardInterrupt\n"
    ) == ("KeyboardInterrupt")
    assert (
        driver_error.first_exception(
            'Exception in thread "main" java.lang.OutOfMemoryError: Java heap space\n'
        )
        == "OutOfMemoryError: Java heap space"
    )
    assert driver_error.first_exception("all fine\nan Error of judgement: none\n") is None


def test_the_crash_error_is_one_line_without_the_watchdogs_own(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    assert driver_error.crash_error("exited", 1, log) == "driver exited with exit code 1"
    log.write_text(PYTHON)
    assert driver_error.crash_error("exited", 1, log) == (
        "driver exited with exit code 1: ValueError: bad row 17: no key"
    )
    log.write_text("starting\nnothing raised, just gave up\n" + PYTHON.splitlines()[-1] + "\n")
    assert driver_error.crash_error("exited", 3, log) == (
        "driver exited with exit code 3: nothing raised, just gave up"
    )


def test_a_long_error_is_cut_to_one_short_line(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text("Traceback (most recent call last):\nValueError: " + "x\t" * 500 + "\n")
    error = driver_error.crash_error("exited", 1, log)
    assert len(error) <= driver_error.MAX_CHARS
    assert "\n" not in error and "\t" not in error
    assert error.endswith("…")


def test_the_first_exception_is_found_in_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    filler = "26/11/25 11:02:18 INFO Noise: " + "n" * 100 + "\n"
    early = "Traceback (most recent call last):\nRuntimeError: early\n"
    log.write_text(early + filler * 20_000)
    assert driver_error.crash_error("exited", 1, log).endswith("RuntimeError: early")
    log.write_text(filler * 20_000 + early)
    assert driver_error.crash_error("exited", 1, log).endswith("RuntimeError: early")
