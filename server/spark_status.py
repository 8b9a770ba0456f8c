"""What a running Spark driver says about itself: its UI address and streaming progress
(read from its log), its application and executors (read from its monitoring REST API).

Pure parsing plus one small HTTP client; no state of sparkring's own. The health
monitor (``server/health.py``) feeds it the new bytes of each driver's log and asks the
REST API at the address found there.

Where each fact comes from (Spark 4, the default log4j profile, docs/drivers.md):

- the UI port: ``Utils: Successfully started service 'SparkUI' on port 4040.`` (INFO,
  logged while the SparkContext starts, before a job can lower the log level);
- the application id, name and whether it completed: ``GET /api/v1/applications``;
- executors and their cores: ``GET /api/v1/applications/<id>/executors`` (the entry
  ``driver`` has cores only in local mode; on a cluster the executors bring them);
- streaming progress: ``ProgressReporter: Streaming query made progress: {json}``
  (INFO, one multi-line JSON per trigger; Spark has no REST endpoint for it), and a
  query's start (``Starting new streaming query.``, INFO) and failure (``Query ...
  terminated with error``, ERROR). A job that lowers its log level below INFO hides
  the first two: its progress is then unknown.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field

from server import bounded_http

# "Utils: Successfully started service 'SparkUI' on port 4041."
_UI_PORT = re.compile(rb"Successfully started service 'SparkUI' on port (\d+)")
# StreamExecution, as a query starts and when it fails (its driver may well live on).
_QUERY_START = b"Starting new streaming query."
_QUERY_FAILED = re.compile(rb"Query .*terminated with error")
_PROGRESS_START = b"Streaming query made progress: {"
# The progress JSON is pretty-printed; its closing brace is alone on a line.
_PROGRESS_END = b"}"
# A progress block longer than this many lines is not one (a corrupt or cut log).
_MAX_PROGRESS_LINES = 2000
REST_TIMEOUT_S = 2.0
# The most of one REST answer read (the executors of a large application: ~1 KB each).
MAX_REST_BYTES = 4 << 20


@dataclass(frozen=True)
class Progress:
    """One streaming query progress event (``StreamingQueryProgress``)."""

    query_id: str
    batch_id: int
    # When the trigger of this batch started, and how long the batch took.
    timestamp: dt.datetime
    batch_duration_ms: int | None
    num_input_rows: int | None
    input_rows_per_second: float | None
    processed_rows_per_second: float | None

    @property
    def completed_at(self) -> dt.datetime:
        return self.timestamp + dt.timedelta(milliseconds=self.batch_duration_ms or 0)


@dataclass
class LogScan:
    """What one pass over new log bytes found; ``rest`` is an unfinished tail to keep."""

    ui_port: int | None
    progress: list[Progress]
    rest: bytes
    queries_started: int = 0
    # The log lines of queries that terminated with an error, in order.
    query_errors: list[str] = field(default_factory=list)


def _timestamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_progress(text: bytes) -> Progress | None:
    """The progress event of one JSON block, or None if it is not a usable one."""
    try:
        data = json.loads(text)
        batch_id = data["batchId"]
        timestamp = _timestamp(data["timestamp"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(batch_id, int) or isinstance(batch_id, bool):
        return None
    duration = data.get("batchDuration")
    rows = data.get("numInputRows")
    return Progress(
        query_id=str(data.get("id") or ""),
        batch_id=batch_id,
        timestamp=timestamp,
        batch_duration_ms=duration if isinstance(duration, int) else None,
        num_input_rows=rows if isinstance(rows, int) else None,
        input_rows_per_second=_number(data.get("inputRowsPerSecond")),
        processed_rows_per_second=_number(data.get("processedRowsPerSecond")),
    )


def scan_log(chunk: bytes) -> LogScan:
    """Scan ``chunk`` (a previous scan's ``rest`` followed by new bytes of the log).

    Only whole lines are read; a progress block whose end has not been written yet is
    returned in ``rest``, to be scanned again with the bytes that follow."""
    ui_port: int | None = None
    progress: list[Progress] = []
    started = 0
    errors: list[str] = []
    end = chunk.rfind(b"\n") + 1
    lines = chunk[:end].split(b"\n")[:-1]
    rest = chunk[end:]
    i = 0
    while i < len(lines):
        line = lines[i]
        if (match := _UI_PORT.search(line)) is not None:
            ui_port = int(match.group(1))
        if _QUERY_START in line:
            started += 1
        elif _QUERY_FAILED.search(line) is not None:
            errors.append(line.decode(errors="replace").strip()[:500])
        at = line.find(_PROGRESS_START)
        if at < 0:
            i += 1
            continue
        block = [b"{"]
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != _PROGRESS_END:
            block.append(lines[j])
            j += 1
            if len(block) > _MAX_PROGRESS_LINES:
                break
        if len(block) > _MAX_PROGRESS_LINES:
            i = j  # not a progress block after all: skip what was read
            continue
        if j >= len(lines):
            # Its closing brace is not written yet: keep the block for the next scan.
            rest = b"\n".join(lines[i:]) + b"\n" + rest
            break
        block.append(b"}")
        event = parse_progress(b"\n".join(block))
        if event is not None:
            progress.append(event)
        i = j + 1
    return LogScan(ui_port, progress, rest, queries_started=started, query_errors=errors)


@dataclass(frozen=True)
class Application:
    """The driver's application as its REST API reports it."""

    app_id: str
    name: str
    completed: bool
    executors: int  # active executors, the driver's own entry not counted
    cores: int  # cores of the active executors (in local mode: the driver's)


class UnreachableError(Exception):
    """The driver's REST API did not answer, or answered something unexpected."""


def _get(url: str, timeout: float) -> object:
    """The JSON at ``url`` (a driver's UI on this host: the job's own process, so its
    answer is bounded like any stranger's: server/bounded_http.py)."""
    try:
        with bounded_http.client(timeout=timeout, trust_env=False) as http:
            answer = bounded_http.request(
                http, "GET", url, deadline_s=timeout, max_bytes=MAX_REST_BYTES
            )
    except bounded_http.FetchError as exc:
        raise UnreachableError(f"{url}: {exc.kind}") from None
    if not answer.complete:
        raise UnreachableError(f"{url}: an answer over {MAX_REST_BYTES} bytes")
    if answer.status != 200:
        raise UnreachableError(f"{url}: HTTP {answer.status}")
    try:
        return json.loads(answer.body)
    except ValueError as exc:
        raise UnreachableError(f"{url}: {exc}") from None


def application(ui_url: str, timeout: float = REST_TIMEOUT_S) -> Application:
    """Read the application and its executors from the driver's UI at ``ui_url``."""
    apps = _get(f"{ui_url}/api/v1/applications", timeout)
    if not isinstance(apps, list) or not apps or not isinstance(apps[0], dict):
        raise UnreachableError(f"{ui_url}: no application listed")
    app = apps[0]
    app_id = str(app.get("id", ""))
    attempts = app.get("attempts") or [{}]
    completed = bool(isinstance(attempts, list) and attempts and attempts[-1].get("completed"))
    executors = _get(f"{ui_url}/api/v1/applications/{app_id}/executors", timeout)
    if not isinstance(executors, list):
        raise UnreachableError(f"{ui_url}: executors are not a list")
    active = [e for e in executors if isinstance(e, dict) and e.get("isActive", True)]
    cores = sum(int(e.get("totalCores") or 0) for e in active)
    return Application(
        app_id=app_id,
        name=str(app.get("name", "")),
        completed=completed,
        executors=sum(1 for e in active if e.get("id") != "driver"),
        cores=cores,
    )
