"""A real PySpark job given a variable and a secret (docs/secrets.md): the driver gets
both, a run started after the secret changed gets its new value, and the value shows in
no CLI output, API answer, job event, audit event, server log or driver log."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx

from tests.cluster import EXAMPLES, Cluster
from tests.e2e import helpers

REPORT_JOB = EXAMPLES / "region_report.py"
FIRST = "first-w4rehouse-pa55word"
SECOND = "second-w4rehouse-pa55word"


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _finished_report(cluster: Cluster, report: Path, run_after: int) -> dict:
    job = cluster.wait_job(
        "report",
        lambda j: (
            j["state"] == "finished"
            and (j["last_run"] or {}).get("run_id", 0) > run_after
            and report.exists()
        ),
        240,
        "the report run finished",
    )
    assert job["last_run"]["state"] == "finished", job["last_run"]
    return json.loads(report.read_text())


def _api_answers(cluster: Cluster) -> str:
    servers = json.loads(cluster.cli("server", "list", "--json").stdout)
    token = cluster.cli("token", "create", "reader", "--role", "operator").stdout.strip()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=servers[0]["health_url"], headers=headers, timeout=10) as http:
        answers = [
            http.get(path)
            for path in (
                "/api/v1/jobs/report",
                "/api/v1/jobs/report/events",
                "/api/v1/jobs/report/revisions",
                "/api/v1/jobs/report/runs",
                "/api/v1/jobs/report/logs",
                "/api/v1/secrets",
                "/api/v1/audit",
            )
        ]
    listed = answers[5].json()
    assert [s["name"] for s in listed] == ["warehouse"] and listed[0]["jobs"] == ["report"]
    assert listed[0]["version"] == 2
    return "\n".join(a.text for a in answers)


def test_a_pyspark_job_gets_its_variable_and_its_secret_and_the_value_shows_nowhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    helpers.start_cluster(cluster, servers=("s1",))
    password = tmp_path / "password"
    password.write_text(FIRST + "\n")
    made = cluster.cli("secret", "create", "warehouse", "--from-file", str(password))
    assert made.stdout.strip() == "secret warehouse created"
    cluster.cli("resource", "upload", "region-report", str(REPORT_JOB))
    report = tmp_path / "report.json"
    cluster.cli(
        "job", "create", "report", "--resource", "region-report", "--kind", "batch",
        "--env", "REGION=eu", "--secret-env", "WAREHOUSE_PASSWORD=warehouse",
        f"--arg={report}", "--arg=--orders", "--arg=3000",
    )  # fmt: skip
    cluster.cli("job", "start", "report")
    first = _finished_report(cluster, report, 0)
    # Work done: Spark counted the orders of the job's region, with the secret it got.
    assert first["region"] == "eu" and first["orders"] == 1000
    assert first["password_sha256"] == _sha(FIRST)

    # A new value: the next driver gets it (a running one would keep its own).
    password.write_text(SECOND + "\n")
    again = cluster.cli("secret", "create", "warehouse", "--from-file", str(password))
    assert again.stdout.strip() == "secret warehouse updated (version 2)"
    report.unlink()
    cluster.cli("job", "start", "report")
    second = _finished_report(cluster, report, int(first["run_id"]))
    assert second["password_sha256"] == _sha(SECOND)

    outputs = [
        cluster.cli(*args).stdout
        for args in (
            ("job", "show", "report"),
            ("job", "show", "report", "--json"),
            ("job", "history", "report"),
            ("job", "events", "report", "--json"),
            ("job", "logs", "report"),
            ("secret", "list"),
            ("secret", "list", "--json"),
        )
    ]
    shown = json.loads(outputs[1])
    assert shown["env"] == {"REGION": "eu"}
    assert shown["secret_env"] == {"WAREHOUSE_PASSWORD": "warehouse"}
    assert "region_report: 1000 orders in eu" in outputs[4]
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
