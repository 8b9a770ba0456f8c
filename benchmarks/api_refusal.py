"""How soon the HTTP API refuses a large body without a token, and what it costs the
server's memory (issue 23, item 2).

Runs in a throwaway database copied from the migrated test template
(``testing/services.py``) and dropped at the end::

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.api_refusal [--mib 64] [--requests 5]

It serves ``server/web/api.py`` in a child process through ``server/web/httpd.py`` (the
listener a server runs), then POSTs ``--requests`` bodies of ``--mib`` MiB of zeros to
``/api/v1/jobs`` with no token, one at a time, on a raw socket (``testing/rawhttp.py``):
the head first, the body fed from a side thread until the server closes. It prints the
time from the head sent to the status line (median and max) and the child's RSS growth
(VmRSS after minus before) and peak growth (VmHWM after minus before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sql import database
from testing import rawhttp, services, waiting

REPO = Path(__file__).resolve().parent.parent

MIB = 1024 * 1024


def serve(database_url: str, port: int) -> None:
    """The child process: the API app behind the server's own listener."""
    from server.web import api, dependencies, httpd

    engine = database.create_engine(database_url, pool_size=2)
    backend = dependencies.Backend(
        server_id="bench",
        engine=engine,
        status=lambda: (True, {"server": "bench"}),
        members=lambda: {},
        log_file=lambda job: None,
        shipped_log=lambda job, epoch, lines: None,
        placement_epsilon=0.05,
        vnodes=640,
    )
    listener = httpd.HttpServer(api.create_app(backend), port, host="127.0.0.1")
    listener.start()
    while listener.is_alive():
        time.sleep(1)


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def measure(url: str, pid: int, mib: int, requests: int) -> dict:
    # One small refusal first: the code paths are loaded before the baseline.
    rawhttp.post(url, "/api/v1/jobs", headers={}, body_bytes=1024)
    rss, hwm = _status_kib(pid, "VmRSS"), _status_kib(pid, "VmHWM")
    seconds, statuses = [], []
    for _ in range(requests):
        answer = rawhttp.post(url, "/api/v1/jobs", headers={}, body_bytes=mib * MIB, timeout=30)
        statuses.append(answer.status)
        seconds.append(answer.seconds)
    return {
        "mib": mib,
        "requests": requests,
        "statuses": sorted(set(statuses), key=str),
        "refusal_ms_median": round(statistics.median(seconds) * 1000, 1),
        "refusal_ms_max": round(max(seconds) * 1000, 1),
        "rss_growth_mib": round((_status_kib(pid, "VmRSS") - rss) / 1024, 1),
        "peak_rss_growth_mib": round((_status_kib(pid, "VmHWM") - hwm) / 1024, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="body size, MiB")
    parser.add_argument("--requests", type=int, default=5, help="bodies sent, one at a time")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--serve", nargs=2, metavar=("URL", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    if args.mib < 1 or args.requests < 1:
        parser.error("--mib and --requests must be at least 1")
    url = services.stack_env().get("SPARKRING_DATABASE_URL")
    if not url:
        parser.error("no database: set SPARKRING_DATABASE_URL (eval scripts/stack.py env)")
    url = database.parse_url(url).render_as_string(hide_password=False)
    services.create_template(url)
    scratch = services.create_test_database(url, prefix="bench")
    child = None
    try:
        port = services.free_port()
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.api_refusal", "--serve", scratch, str(port)],
            cwd=REPO,
        )
        waiting.wait_until(lambda: services.reachable(f"127.0.0.1:{port}"), 30, interval=0.1)
        report = measure(f"http://127.0.0.1:{port}", child.pid, args.mib, args.requests)
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=10)
        services.drop_database(scratch)
        services.drop_template(url)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{report['requests']} POSTs of {report['mib']} MiB without a token: "
        f"answered {report['statuses']} in median {report['refusal_ms_median']} ms "
        f"(max {report['refusal_ms_max']} ms); server RSS grew "
        f"{report['rss_growth_mib']} MiB, peak RSS {report['peak_rss_growth_mib']} MiB"
    )


if __name__ == "__main__":
    main()
