"""A job's Python dependencies end to end (docs/dependencies.md): a PySpark job that
imports a package the servers do not have, created with --requirements, runs on the
local master and then on the standalone cluster, where its tasks import the package on
the cluster's executors; the build is made once and the job's history names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster import EXAMPLES, Cluster
from tests.e2e import helpers

REPORT_JOB = EXAMPLES / "table_report.py"
REQUIREMENTS = EXAMPLES / "table_report.requirements.txt"
ROWS = 2000


def _report(cluster: Cluster, output: Path, after_run: int) -> tuple[dict, int]:
    job = cluster.wait_job(
        "tables",
        lambda j: (
            j["state"] in ("finished", "failed")
            and (j["last_run"] or {}).get("run_id", 0) > after_run
        ),
        300,
        "the table report run ended",
    )
    assert job["state"] == "finished", (
        job["last_error"],
        cluster.cli("job", "logs", "tables").stdout,
    )
    return json.loads(output.read_text()), job["last_run"]["run_id"]


@pytest.mark.spark
@pytest.mark.long(80)
def test_a_job_imports_its_own_package_on_the_driver_and_the_cluster_executors(
    cluster: Cluster, stack_env: dict[str, str]
) -> None:
    helpers.start_cluster(cluster, servers=("s1",))
    cluster.cli("resource", "upload", "table-report", str(REPORT_JOB))
    output = cluster.root / "tables.json"
    created = cluster.cli(
        "job", "create", "tables", "--resource", "table-report", "--kind", "batch",
        "--requirements", str(REQUIREMENTS), f"--arg={output}", f"--arg=--rows={ROWS}",
    )  # fmt: skip
    assert "built and stored as deps-" in created.stderr
    deps = json.loads(cluster.cli("job", "show", "tables", "--json").stdout)["deps"]
    assert deps["name"].startswith("deps-") and deps["filename"].endswith(".zip")

    cluster.cli("job", "start", "tables")
    local, run = _report(cluster, output, 0)
    assert local["driver_tabulate"] == "0.9.0" and local["executor_tabulate"] == ["0.9.0"]
    assert local["rows_seen_by_tasks"] == ROWS and "bucket" in local["table"]

    # The same job on the standalone cluster: its tasks run on the cluster's executors.
    master = stack_env["SPARKRING_STACK_SPARK_MASTER_URL"]
    updated = cluster.cli(
        "job", "update", "tables", "--master", master, "--conf", "spark.cores.max=1",
        "--conf", "spark.executor.memory=512m", "--requirements", str(REQUIREMENTS),
    )  # fmt: skip
    assert "already built as " + deps["name"] in updated.stderr
    output.unlink()
    cluster.cli("job", "start", "tables")
    remote, _ = _report(cluster, output, run)
    assert remote["executor_tabulate"] == ["0.9.0"] and remote["rows_seen_by_tasks"] == ROWS
    assert remote["master"] == master and local["master"].startswith("local")
    # The tasks ran in an executor of the cluster (its worker's app folder), not the driver.
    assert all("/app-" in folder for folder in remote["task_folders"]), remote["task_folders"]
    assert not any("/app-" in folder for folder in local["task_folders"])
    history = json.loads(cluster.cli("job", "history", "tables", "--json").stdout)
    assert [h["deps"]["name"] for h in history] == [deps["name"]] * 2
    # One build for both revisions: one deps artifact.
    listed = json.loads(cluster.cli("resource", "list", "--json").stdout)
    assert [r["version"] for r in listed if r["name"] == deps["name"]] == [1]
