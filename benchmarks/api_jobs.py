"""The HTTP API's job list at 10,000 jobs, and the console's jobs page in Chromium.

Runs in a throwaway database copied from the migrated test template
(``testing/services.py``) and dropped at the end::

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.api_jobs [--jobs 10000] [--requests 200] [--browser]

It inserts ``--jobs`` jobs in bulk (a third running with an owner and a lease, a third
pending, a third stopped), makes an operator token, and serves ``server/web/api.py`` with
uvicorn in a child process (the same app a server runs; ZooKeeper is not needed for the
job list, so the server list is empty). Then it times, one request at a time from this
process with httpx, each listing in :data:`QUERIES` (``--requests`` times, after 10
warm-up requests) and prints p50 / p95 / max in milliseconds.

``--screenshots DIR`` saves the console's main pages over that data (ten made-up
servers, none of them reachable, so their health shows as unknown) to DIR: the images
of docs/console.md.

``--browser`` also opens the console in headless Chromium (Debian's ``chromium`` and
``chromium-driver``), logs in, and times the jobs page with 1,000 rows per page: from
the request to the table drawn (``render()`` resolved and one animation frame), median
of 5.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import sqlalchemy as sa

from registry import servers
from scheduler import tokens
from sql import database
from testing import services, waiting

REPO = Path(__file__).resolve().parent.parent

# Made-up servers the jobs are spread over (owners and targets server-0 .. server-9).
SERVERS = 10
QUERIES = {
    "first page (100)": {"limit": 100},
    "page of 1,000": {"limit": 1000},
    "last page (offset 9,900)": {"limit": 100, "offset": 9900},
    "state=running (100)": {"state": "running", "limit": 100},
    "search q=job-0042 (100)": {"q": "job-0042", "limit": 100},
}


def populate(engine: sa.Engine, jobs: int) -> None:
    with engine.begin() as conn:
        resource_id = conn.execute(
            sa.text(
                """
                INSERT INTO resources (name, version, sha256, size, object_key, filename)
                VALUES ('bench', 1, repeat('0', 64), 9, 'sha256/bench', 'bench.py')
                RETURNING id
                """
            )
        ).scalar_one()
        conn.execute(
            sa.text(
                """
                INSERT INTO jobs (name, kind, resource_id, desired, max_restarts, generation)
                SELECT 'job-' || lpad(g::text, 6, '0'), 'streaming', :resource_id,
                       CASE WHEN g % 3 = 0 THEN 'stopped' ELSE 'running' END, 3, 1
                  FROM generate_series(1, :jobs) AS g
                """
            ),
            {"resource_id": resource_id, "jobs": jobs},
        )
        conn.execute(
            sa.text(
                """
                INSERT INTO distribution (job_id, state, owner, target, epoch, lease_until,
                                          started_at, generation)
                SELECT id,
                       CASE id % 3 WHEN 1 THEN 'running' WHEN 2 THEN 'pending' ELSE 'stopped' END,
                       CASE WHEN id % 3 = 1 THEN 'server-' || (id % 10) END,
                       CASE WHEN id % 3 <> 0 THEN 'server-' || (id % 10) END,
                       1,
                       CASE WHEN id % 3 = 1 THEN now() + interval '1 hour' END,
                       CASE WHEN id % 3 = 1 THEN now() END,
                       1
                  FROM jobs
                """
            )
        )
        # A history for the first jobs (the job page and the events feed show it).
        conn.execute(
            sa.text(
                """
                INSERT INTO job_events (job_id, job_name, at, kind, server, epoch, detail)
                SELECT j.id, j.name, now() - interval '10 minutes' + k.n * interval '2 seconds'
                       + j.id * interval '1 second', k.kind,
                       CASE WHEN k.kind IN ('claimed', 'driver_started')
                            THEN 'server-' || (j.id % 10) END,
                       CASE WHEN k.kind IN ('claimed', 'driver_started') THEN 1 END,
                       CASE WHEN k.kind IN ('created', 'start_requested')
                            THEN '{"by": "token:ops"}'::jsonb ELSE '{}'::jsonb END
                  FROM jobs j
                 CROSS JOIN (VALUES (0, 'created'), (1, 'start_requested'), (2, 'claimed'),
                                    (3, 'driver_started')) AS k(n, kind)
                 WHERE j.id <= 30 AND j.id % 3 = 1
                """
            )
        )
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE"))
        conn.execute(sa.text("UPDATE coordinator SET server = 'server-0', term = 1 WHERE id = 1"))
        conn.commit()


def serve(database_url: str, port: int) -> None:
    """The child process: the API app under uvicorn, as a server runs it."""
    import uvicorn

    from server.web import api, dependencies

    engine = database.create_engine(database_url, pool_size=4)
    started = time.time() - 3600
    members = {
        f"server-{i}": servers.ServerInfo(
            id=f"server-{i}",
            host=f"10.0.0.{10 + i}",
            pid=1000 + i,
            capacity=1500,
            role="both",
            version="0.1.0",
            started_at=started + 60 * i,
        )
        for i in range(SERVERS)
    }
    backend = dependencies.Backend(
        server_id="bench",
        engine=engine,
        status=lambda: (True, {"server": "bench"}),
        members=lambda: members,
        log_file=lambda job: None,
        shipped_log=lambda job, epoch, lines: None,
        placement_epsilon=0.05,
        vnodes=640,
    )
    uvicorn.run(api.create_app(backend), host="127.0.0.1", port=port, log_level="warning")


def _percentiles(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {
        "p50_ms": round(rank(0.50) * 1000, 1),
        "p95_ms": round(rank(0.95) * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


def bench_api(url: str, token: str, requests: int) -> dict[str, dict[str, float]]:
    results = {}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        for label, params in QUERIES.items():
            for _ in range(10):
                http.get("/api/v1/jobs", params=params).raise_for_status()
            samples = []
            for _ in range(requests):
                started = time.perf_counter()
                reply = http.get("/api/v1/jobs", params=params)
                reply.raise_for_status()
                reply.json()
                samples.append(time.perf_counter() - started)
            results[label] = _percentiles(samples)
    return results


BROWSER_SCRIPT = """
const done = arguments[arguments.length - 1];
(async () => {
  jobFilter.limit = 1000; jobFilter.offset = 0; jobFilter.q = ""; jobFilter.state = "";
  while (rendering) await new Promise((r) => setTimeout(r, 5));
  const started = performance.now();
  await render();
  await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  done([performance.now() - started, document.querySelectorAll("#jobs tbody tr").length]);
})();
"""


def _browser(url: str, token: str):  # -> selenium webdriver, logged in
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,860",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "chromedriver"), options=options
    )
    driver.set_script_timeout(30)
    driver.get(url + "/console/")
    driver.execute_script("localStorage.setItem('sparkring-token', arguments[0])", token)
    driver.get(url + "/console/?logged-in#/jobs")  # a new URL: the page loads again
    waiting.wait_until(lambda: driver.execute_script("return me !== null"), 30)
    return driver


def screenshots(url: str, token: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    driver = _browser(url, token)
    try:
        for name, hash_, ready in [
            ("jobs", "#/jobs", "#jobs tbody tr"),
            ("job", "#/jobs/job-000004", "#job-events"),
            ("servers", "#/servers", "#servers tbody tr"),
            ("ring", "#/ring", "#ring-svg circle"),
            ("events", "#/events", "#events"),
        ]:
            driver.get(f"{url}/console/?{name}{hash_}")
            waiting.wait_until(
                lambda ready=ready: driver.execute_script(
                    "return document.querySelector(arguments[0]) !== null", ready
                ),
                30,
            )
            driver.save_screenshot(str(folder / f"console-{name}.png"))
    finally:
        driver.quit()


def bench_browser(url: str, token: str) -> dict[str, float]:
    driver = _browser(url, token)
    try:
        samples = []
        for _ in range(5):
            elapsed, rows = driver.execute_async_script(BROWSER_SCRIPT)
            if rows != 1000:
                raise SystemExit(f"the jobs page drew {rows} rows, not 1000")
            samples.append(elapsed)
        return {"median_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1)}
    finally:
        driver.quit()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs in the table")
    parser.add_argument("--requests", type=int, default=200, help="timed requests per query")
    parser.add_argument("--browser", action="store_true", help="also time the console")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--screenshots", type=Path, help="save the console's pages here")
    parser.add_argument("--serve", nargs=2, metavar=("URL", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    if args.jobs < 1000 or args.requests < 1:
        parser.error("--jobs must be at least 1000 and --requests at least 1")
    url = services.stack_env().get("SPARKRING_DATABASE_URL")
    if not url:
        parser.error("no database: set SPARKRING_DATABASE_URL (eval scripts/stack.py env)")
    url = database.parse_url(url).render_as_string(hide_password=False)
    services.create_template(url)
    scratch = services.create_test_database(url, prefix="bench")
    child = None
    try:
        engine = database.create_engine(scratch, pool_size=1)
        populate(engine, args.jobs)
        with engine.begin() as conn:
            token = tokens.create(conn, "bench", "operator")
        engine.dispose()
        port = services.free_port()
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.api_jobs", "--serve", scratch, str(port)],
            cwd=REPO,
        )
        base = f"http://127.0.0.1:{port}"
        waiting.wait_until(lambda: services.reachable(f"127.0.0.1:{port}"), 30, interval=0.1)
        report: dict = {
            "jobs": args.jobs,
            "requests": args.requests,
            "api": bench_api(base, token, args.requests),
        }
        if args.browser:
            report["console_1000_rows"] = bench_browser(base, token)
        if args.screenshots:
            screenshots(base, token, args.screenshots)
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=10)
        services.drop_database(scratch)
        services.drop_template(url)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"API job list, {args.jobs} jobs, {args.requests} requests per query:")
    for label, figures in report["api"].items():
        print(
            f"  {label:<28} p50 {figures['p50_ms']:>7} ms  p95 {figures['p95_ms']:>7} ms"
            f"  max {figures['max_ms']:>7} ms"
        )
    if "console_1000_rows" in report:
        c = report["console_1000_rows"]
        print(f"console jobs page, 1,000 rows: median {c['median_ms']} ms, max {c['max_ms']} ms")


if __name__ == "__main__":
    main()
