"""The driver log and REST parsing of server/spark_status.py, on a real Spark 4 driver log
(tests/data/spark_driver.log: a streaming_counter run on the standalone cluster; CUT is
it cut in the middle of its third progress block) and, for the REST part, testing/spark_ui.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from server import spark_status
from testing import spark_ui

LOG = (Path(__file__).parents[1] / "data" / "spark_driver.log").read_bytes()
CUT = LOG[: LOG.index(b'"batchId" : 2') + 20]


def test_the_ui_port_and_the_complete_progress_blocks_are_read() -> None:
    scan = spark_status.scan_log(CUT)
    assert scan.ui_port == 4040
    assert [p.batch_id for p in scan.progress] == [0, 1]
    first = scan.progress[0]
    assert first.timestamp == dt.datetime(2026, 11, 24, 8, 13, 52, 789000, tzinfo=dt.UTC)
    assert first.batch_duration_ms == 2650
    assert first.completed_at == first.timestamp + dt.timedelta(milliseconds=2650)
    assert first.query_id == "0252159e-2ed7-4084-ad9b-e944aab67e4d"
    # The unfinished third block is kept whole, for the next scan.
    assert scan.rest.startswith(b"26/11/24 08:13:56 INFO ProgressReporter: Streaming query")
    assert b'"batchId" : 2' in scan.rest


def test_a_log_fed_in_arbitrary_pieces_yields_each_block_once() -> None:
    for size in (1, 7, 100, 1000, 4096):
        rest, seen, port = b"", [], None
        for at in range(0, len(CUT), size):
            scan = spark_status.scan_log(rest + CUT[at : at + size])
            rest = scan.rest
            seen += [p.batch_id for p in scan.progress]
            port = scan.ui_port or port
        assert seen == [0, 1], size
        assert port == 4040
    # The third block, once its end is written, is read.
    scan = spark_status.scan_log(rest + LOG[len(CUT) :])
    assert [p.batch_id for p in scan.progress] == [2]
    assert scan.rest == b""


def test_a_block_that_is_not_progress_json_is_skipped() -> None:
    chunk = (
        b"x INFO ProgressReporter: Streaming query made progress: {\n"
        b'  "batchId" : "seven",\n'
        b"}\n"
        b"x INFO ProgressReporter: Streaming query made progress: {\n"
        b"  not json\n"
        b"}\n"
        b"x INFO ProgressReporter: Streaming query made progress: {\n"
        b'  "timestamp" : "2026-11-24T08:13:52.789Z",\n'
        b'  "batchId" : 9\n'
        b"}\n"
    )
    scan = spark_status.scan_log(chunk)
    assert [p.batch_id for p in scan.progress] == [9]
    assert scan.progress[0].input_rows_per_second is None


def test_a_header_without_a_closing_brace_for_too_long_is_given_up() -> None:
    lines = b"h INFO ProgressReporter: Streaming query made progress: {\n" + b"  x\n" * 3000
    scan = spark_status.scan_log(lines + b"tail\n")
    assert scan.progress == []
    assert len(scan.rest) < 100


@pytest.fixture
def driver_ui() -> Iterator[spark_ui.SparkUi]:
    with spark_ui.serving() as ui:
        yield ui


def test_the_application_and_its_cores_are_read_from_the_rest_api(
    driver_ui: spark_ui.SparkUi,
) -> None:
    url, handler = driver_ui.url, driver_ui
    handler.apps = [{"id": "app-1", "name": "etl", "attempts": [{"completed": False}]}]
    # As a standalone cluster reports it: the driver entry has no cores.
    handler.executors = [
        {"id": "driver", "isActive": True, "totalCores": 0},
        {"id": "0", "isActive": True, "totalCores": 2},
        {"id": "1", "isActive": False, "totalCores": 4},
    ]
    app = spark_status.application(url)
    assert app == spark_status.Application("app-1", "etl", False, executors=1, cores=2)
    handler.executors = [{"id": "driver", "isActive": True, "totalCores": 0}]
    assert spark_status.application(url).cores == 0


def test_a_ui_that_answers_nonsense_or_nothing_is_unreachable(
    driver_ui: spark_ui.SparkUi,
) -> None:
    url, handler = driver_ui.url, driver_ui
    handler.apps = {"not": "a list"}
    with pytest.raises(spark_status.UnreachableError, match="no application"):
        spark_status.application(url)
    with pytest.raises(spark_status.UnreachableError):
        spark_status.application("http://127.0.0.1:9", timeout=0.5)


def test_query_starts_and_failures_are_counted() -> None:
    # Lines as Spark 4 writes them (tests/data has the start of a healthy query).
    failed = (
        b"26/11/24 08:28:12 ERROR MicroBatchExecution: Query admission_control_test "
        b"[id = 2d9a9bb5-5dc2-4b21-8d74-4bfd27ba0364, runId = 4e6ae365] terminated with error\n"
        b"org.apache.spark.SparkException: Python worker failed to connect back.\n"
    )
    started = b"26/11/24 08:27:58 INFO MicroBatchExecution: Starting new streaming query.\n"
    scan = spark_status.scan_log(started + failed + started)
    assert scan.queries_started == 2
    assert len(scan.query_errors) == 1
    assert "admission_control_test" in scan.query_errors[0]
    assert spark_status.scan_log(LOG).queries_started == 0  # the excerpt starts later
