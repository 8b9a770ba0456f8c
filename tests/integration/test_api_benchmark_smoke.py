"""benchmarks/api_jobs.py and api_refusal.py run end to end at a small size (they must
not rot): every figure is in their JSON and their scratch databases are gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import api_jobs
from testing import services

REPO = Path(__file__).resolve().parents[2]


def test_api_benchmark_reports_every_query(
    postgres_url: str, bench_databases: set[str], stack_env: dict[str, str]
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.api_jobs",
            *("--jobs", "1000", "--requests", "2"),
            "--json",
        ],
        env={**os.environ, **stack_env, "SPARKRING_DATABASE_URL": postgres_url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["jobs"] == 1000
    assert set(report["api"]) == set(api_jobs.QUERIES)
    for figures in report["api"].values():
        assert set(figures) == {"p50_ms", "p95_ms", "max_ms"}
        assert 0 < figures["p50_ms"] <= figures["max_ms"]
    assert services.bench_databases(postgres_url) == bench_databases


def test_refusal_benchmark_runs_and_the_refusal_is_quick_and_flat(
    postgres_url: str, bench_databases: set[str], stack_env: dict[str, str]
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.api_refusal",
            "--mib",
            "16",
            "--requests",
            "2",
            "--json",
        ],
        env={**os.environ, **stack_env, "SPARKRING_DATABASE_URL": postgres_url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["statuses"] == [401]
    assert report["refusal_ms_max"] < 1000 and report["rss_growth_mib"] < 10
    assert services.bench_databases(postgres_url) == bench_databases
