"""The run directory: where a run of a job keeps its files on this host, and the files'
names, readers and writers, shared by the server (``server/driver.py``, the runner) and
the run's watchdog (``server/watchdog.py``, a process of its own).

Layout of a work dir: ``jobs/<job id>/<epoch>/`` (:func:`run_dir`); the older code's
``runs/<name>/<epoch>/`` (:func:`legacy_run_dir`) is still read for runs it started.

Files of one run, and who writes them:

- ``driver.log`` (:data:`LOG_FILE`): the driver's stdout and stderr, and the watchdog's
  own lines; opened by the launcher, appended to by the driver and its watchdog;
- ``lease.json`` (:data:`LEASE_FILE`): ``{"deadline": D}``, the confirmed lease
  deadline on ``watchdog.lease_clock()``; written by the server (:func:`write_lease`),
  read by the watchdog (:func:`read_lease`);
- ``stop.json`` (:data:`STOP_FILE`): ``{"grace": G}``, the grace of a requested stop;
  written by the server (:func:`write_stop`), read by the watchdog (:func:`read_grace`);
- ``watchdog.json`` (:data:`STATE_FILE`): the watchdog's and the driver's pids and the
  run's identity; written by the watchdog, read by the server to adopt or sweep a run;
- ``result.json`` (:data:`RESULT_FILE`): why and when the driver ended; written by the
  watchdog once everything is dead, read by the server (``driver.Driver.outcome_of``);
- ``go.json`` (:data:`GO_FILE`): a warm driver's go signal (docs/drivers.md, "Warm
  hand-off"): ``{"t": wall clock, "mono": lease clock}`` when its server wrote it, after
  its claim committed; written by the server (:func:`write_go`), read by the warm
  entry point (``server/warm_entry.py``) and the watchdog (``--go-file``);
- ``warm.json`` (:data:`WARM_FILE`): the warm entry point's settings (the job's main,
  how long to wait for the go signal); written by the server before the launch;
- ``ui.json`` (:data:`UI_FILE`): ``{"port": N}``, the Spark UI port the server gave the
  driver (``spark.ui.port``); written by the server before the launch, read by its
  health monitor (:func:`read_ui_port`), which probes no port the driver's log names
  outside ``N`` to ``N`` + :data:`UI_PORT_RETRIES` (where Spark may move when ``N`` is
  taken);
- ``cwd/`` (:data:`WORKING_DIR`): the driver's working directory, so that nothing it
  writes there can touch the files above; ``artifacts/`` (:data:`ARTIFACTS_DIR`): the
  run's own links to its verified artifacts.

The optional lifetime records (``--records``, one JSON line when a driver started and
one when it ended) are appended with :func:`append_record`, by the watchdog, or by the
server for a watchdog that died first.

Every JSON file is replaced atomically (:func:`write_json_atomically`): a reader sees
the old file or the new one, never half of one. This module imports nothing of ours:
the watchdog process loads it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

LOG_FILE = "driver.log"
LEASE_FILE = "lease.json"
STATE_FILE = "watchdog.json"
STOP_FILE = "stop.json"
RESULT_FILE = "result.json"
GO_FILE = "go.json"  # a warm driver may run the job's main
WARM_FILE = "warm.json"  # the warm entry point's settings
UI_FILE = "ui.json"  # the Spark UI port the server gave the driver
# Spark tries this many ports after a taken one (spark.port.maxRetries, its default).
UI_PORT_RETRIES = 16
WORKING_DIR = "cwd"  # the driver's working directory, below the run directory
ARTIFACTS_DIR = "artifacts"  # the run's own links to its verified artifacts


def job_dir(work_dir: Path, job_id: int) -> Path:
    """The runs of one job on this host. Keyed by id, not name: a job deleted and
    created again under its name starts again at epoch 1, and its deleted namesake's
    run directories must never be taken for its own (hole H6). Created before this
    server first claims the job, so its existence also says that no run of the job here
    is in the layout of the older code (:func:`run_trace`)."""
    return work_dir / "jobs" / str(job_id)


def run_dir(work_dir: Path, job_id: int, epoch: int) -> Path:
    return job_dir(work_dir, job_id) / str(epoch)


def legacy_run_dir(work_dir: Path, name: str, epoch: int) -> Path:
    """Where the code before :func:`job_dir` kept a run (``runs/<name>/<epoch>``)."""
    return work_dir / "runs" / name / str(epoch)


def run_trace(work_dir: Path, job_id: int, name: str, epoch: int) -> Path:
    """The run directory to look for a run's trace in: its own (:func:`run_dir`), or,
    for a job this code never claimed here, the older code's (a driver started before
    an upgrade is adopted, its result recorded). Whatever is found there is still
    checked against the run's identity (``driver.RunIdentity``)."""
    if job_dir(work_dir, job_id).exists():
        return run_dir(work_dir, job_id, epoch)
    return legacy_run_dir(work_dir, name, epoch)


def write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` so that readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        json.dump(payload, handle)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing or not a JSON object."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def write_lease(path: Path, deadline: float) -> None:
    """Atomically record that the lease is confirmed until ``deadline`` (on
    ``watchdog.lease_clock()``)."""
    if not math.isfinite(deadline):
        raise ValueError(f"lease deadline must be a finite monotonic time, not {deadline!r}")
    write_json_atomically(path, {"deadline": deadline})


def read_lease(path: Path) -> float | None:
    payload = read_json(path)
    if payload is None:
        return None
    deadline = payload.get("deadline")
    if isinstance(deadline, bool) or not isinstance(deadline, int | float):
        return None
    return float(deadline) if math.isfinite(deadline) else None


def write_stop(path: Path, grace: float) -> None:
    """Ask the run's watchdog for a stop with ``grace`` seconds before SIGKILL."""
    write_json_atomically(path, {"grace": grace})


def read_grace(path: Path) -> float | None:
    """The grace a stop file asks for, or None (missing, unreadable or invalid)."""
    payload = read_json(path) or {}
    grace = payload.get("grace")
    if isinstance(grace, int | float) and not isinstance(grace, bool) and grace >= 0:
        return float(grace)
    return None


def write_go(path: Path) -> float:
    """Tell a warm driver to run the job's main; returns the wall-clock time written
    (the run's start in its lifetime records: taken before the file exists)."""
    # time and the lease clock are read here, not imported from the watchdog: this
    # module imports nothing of ours.
    import time

    went_at = time.time()
    write_json_atomically(path, {"t": went_at, "mono": time.clock_gettime(time.CLOCK_BOOTTIME)})
    return went_at


def read_go(path: Path) -> tuple[float, float] | None:
    """The (wall clock, lease clock) times of a go signal, or None if there is none."""
    payload = read_json(path)
    if payload is None:
        return None
    t, mono = payload.get("t"), payload.get("mono")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (t, mono)):
        return None
    return float(t), float(mono)  # type: ignore[arg-type]


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one lifetime record as a JSON line."""
    # One O_APPEND write per line: lines of concurrent writers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def read_ui_port(run_dir: Path) -> int | None:
    """The UI port the server gave the run's driver (:data:`UI_FILE`); None when it gave
    none (a run of the older code, or a job that chose its own)."""
    try:
        with open(run_dir / UI_FILE, "rb") as handle:
            port = json.loads(handle.read(4096)).get("port")
    except (OSError, ValueError, AttributeError):
        return None
    return port if isinstance(port, int) and 0 < port < 65536 else None
