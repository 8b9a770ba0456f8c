"""A data team's real job end to end (docs/secrets.md, docs/dependencies.md): Spark's
work with a variable, a secret and a package the servers do not have, on the local
master and then on the standalone cluster, whose executors import the package too.
A new value of the secret reaches the next run; the build is made once; the value shows
in no CLI output, API answer, job event, audit event, server log or driver log."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from testing.cluster import EXAMPLES, Cluster
from tests.e2e import helpers

REPORT_JOB = EXAMPLES / "region_report.py"
REQUIREMENTS = EXAMPLES / "region_report.requirements.txt"
FIRST = "first-w4rehouse-pa55word"
SECOND = "second-w4rehouse-pa55word"
ORDERS = 3000


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _report(cluster: Cluster, output: Path, after_run: int) -> dict:
    job = cluster.wait_job(
        "report",
        lambda j: (
            j["state"] in ("finished", "failed")
            and (j["last_run"] or {}).get("run_id", 0) > after_run
        ),
        300,
        "the report run ended",
    )
    assert job["state"] == "finished", (job["last_error"], cluster.cli("job", "logs", "report"))
    return json.loads(output.read_text())


def _api_answers(cluster: Cluster) -> str:
    servers = json.loads(cluster.cli("server", "list", "--json").stdout)
    token = cluster.cli("token", "create", "reader", "--role", "operator").stdout.strip()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=servers[0]["health_url"], headers=headers, timeout=10) as http:
        answers = [
            http.get(f"/api/v1/{path}")
            for path in (
                "jobs/report",
                "jobs/report/events",
                "jobs/report/revisions",
                "jobs/report/runs",
                "jobs/report/logs",
                "secrets",
                "audit",
            )
        ]
    listed = answers[5].json()
    assert [s["name"] for s in listed] == ["warehouse"] and listed[0]["jobs"] == ["report"]
    assert listed[0]["version"] == 2
    return "\n".join(a.text for a in answers)


@pytest.mark.spark
@pytest.mark.long(90)
def test_a_pyspark_job_with_a_secret_and_its_own_package_on_local_and_cluster_executors(
    cluster: Cluster, stack_env: dict[str, str], tmp_path: Path
) -> None:
    helpers.start_cluster(cluster, servers=("s1",))
    password = tmp_path / "password"
    password.write_text(FIRST + "\n")
    made = cluster.cli("secret", "create", "warehouse", "--from-file", str(password))
    assert made.stdout.strip() == "secret warehouse created"
    cluster.cli("resource", "upload", "region-report", str(REPORT_JOB))
    output = cluster.root / "report.json"
    created = cluster.cli(
        "job", "create", "report", "--resource", "region-report", "--kind", "batch",
        "--env", "REGION=eu", "--secret-env", "WAREHOUSE_PASSWORD=warehouse",
        "--requirements", str(REQUIREMENTS), f"--arg={output}", f"--arg=--orders={ORDERS}",
    )  # fmt: skip
    assert "built and stored as deps-" in created.stderr
    deps = json.loads(cluster.cli("job", "show", "report", "--json").stdout)["deps"]
    assert deps["name"].startswith("deps-") and deps["filename"].endswith(".zip")

    cluster.cli("job", "start", "report")
    local = _report(cluster, output, 0)
    # Work done: Spark counted the region's orders, with the secret the driver got and
    # the package its driver and its tasks imported.
    assert (local["region"], local["orders"]) == ("eu", ORDERS // 3)
    assert local["password_sha256"] == _sha(FIRST)
    assert local["driver_tabulate"] == "0.9.0" and local["executor_tabulate"] == ["0.9.0"]
    assert local["rows_seen_by_tasks"] == ORDERS and local["master"].startswith("local")

    # A new value, and the standalone cluster: the next driver gets the new value, and
    # the cluster's executors import the package the driver shipped them.
    password.write_text(SECOND + "\n")
    again = cluster.cli("secret", "create", "warehouse", "--from-file", str(password))
    assert again.stdout.strip() == "secret warehouse updated (version 2)"
    master = stack_env["SPARKRING_STACK_SPARK_MASTER_URL"]
    updated = cluster.cli(
        "job", "update", "report", "--master", master, "--conf", "spark.cores.max=1",
        "--conf", "spark.executor.memory=512m", "--requirements", str(REQUIREMENTS),
    )  # fmt: skip
    assert "already built as " + deps["name"] in updated.stderr
    output.unlink()
    cluster.cli("job", "start", "report")
    remote = _report(cluster, output, int(local["run_id"]))
    assert remote["password_sha256"] == _sha(SECOND) and remote["master"] == master
    assert remote["executor_tabulate"] == ["0.9.0"] and remote["rows_seen_by_tasks"] == ORDERS
    # The tasks ran in an executor of the cluster (its worker's app folder), not the driver.
    assert all("/app-" in folder for folder in remote["task_folders"]), remote["task_folders"]
    assert not any("/app-" in folder for folder in local["task_folders"])

    outputs = [
        cluster.cli(*args).stdout
        for args in (
            ("job", "show", "report"),
            ("job", "show", "report", "--json"),
            ("job", "history", "report", "--json"),
            ("job", "events", "report", "--json"),
            ("job", "logs", "report"),
            ("secret", "list"),
            ("secret", "list", "--json"),
            ("resource", "list", "--json"),
        )
    ]
    shown = json.loads(outputs[1])
    assert shown["env"] == {"REGION": "eu"}
    assert shown["secret_env"] == {"WAREHOUSE_PASSWORD": "warehouse"}
    assert [h["deps"]["name"] for h in json.loads(outputs[2])] == [deps["name"]] * 2
    assert "region_report: 1000 orders in eu" in outputs[4]
    # One build for both revisions: one version of the deps artifact.
    listed = json.loads(outputs[7])
    assert [r["version"] for r in listed if r["name"] == deps["name"]] == [1]
    rows = cluster.sql(
        "SELECT (SELECT string_agg(detail::text, ' ') FROM job_events), "
        "(SELECT string_agg(detail::text || subject, ' ') FROM audit_events), "
        "(SELECT string_agg(ciphertext, ' ') FROM secrets)"
    )
    everything = "\n".join(
        [*outputs, _api_answers(cluster), *map(str, rows[0]), cluster.log("s1")]
        + [p.read_text(errors="replace") for p in cluster.root.rglob("driver.log")]
    )
    for value in (FIRST, SECOND):
        assert value not in everything
        assert value[:12] not in everything
