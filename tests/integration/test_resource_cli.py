"""``sparkring resource`` end to end, as a user runs it (``python -m server`` subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from sql import tables
from testing import cli_runner, services


@pytest.fixture
def env(stack_env: dict[str, str], database_url: str, s3_bucket: str, tmp_path: Path):
    return {
        **stack_env,
        "SPARKRING_DATABASE_URL": database_url,
        "SPARKRING_S3_BUCKET": s3_bucket,
        "SPARKRING_WORK_DIR": str(tmp_path / "work"),
        "SPARKRING_MAX_ARTIFACT_BYTES": str(1024 * 1024),
    }


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_runner.run(
        ["resource", *args], env={**os.environ, **env}, cwd=services.REPO, timeout=60
    )


def _ok(env: dict[str, str], *args: str) -> str:
    result = _run(env, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_upload_list_show_delete_gc(env: dict[str, str], engine: sa.Engine, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_bytes(b"print(1)\n")
    first = json.loads(_ok(env, "upload", "etl", str(job), "--json"))
    assert (first["name"], first["version"], first["created"]) == ("etl", 1, True)
    again = json.loads(_ok(env, "upload", "etl", str(job), "--json"))
    assert (again["version"], again["created"]) == (1, False)
    job.write_bytes(b"print(2)\n")
    assert "uploaded etl:2" in _ok(env, "upload", "etl", str(job))

    listed = json.loads(_ok(env, "list", "--json"))
    assert [(r["name"], r["version"]) for r in listed] == [("etl", 1), ("etl", 2)]
    assert "etl" in _ok(env, "list")
    shown = json.loads(_ok(env, "show", "etl:1", "--json"))
    assert shown["sha256"] == first["sha256"] and shown["used_by"] == []
    assert json.loads(_ok(env, "show", "etl", "--json"))["version"] == 2

    with engine.begin() as connection:
        connection.execute(
            sa.insert(tables.jobs).values(
                name="nightly", kind="batch", resource_id=first["id"], max_restarts=0
            )
        )
    refused = _one_line_error(_run(env, "delete", "etl:1"))
    assert "etl:1 is used by job nightly" in refused
    assert json.loads(_ok(env, "show", "etl:1", "--json"))["used_by"] == ["nightly"]

    deleted = json.loads(_ok(env, "delete", "etl:2", "--json"))
    assert [(r["name"], r["version"]) for r in deleted] == [("etl", 2)]
    assert json.loads(_ok(env, "gc", "--json")) == {"removed": []}


def test_bad_input_is_one_clear_line(env: dict[str, str], tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_bytes(b"print(1)\n")
    assert "'../x' is invalid" in _one_line_error(_run(env, "upload", "../x", str(job)))
    bad_zip = tmp_path / "deps.zip"
    bad_zip.write_bytes(b"PK not really")
    assert "not a valid zip archive" in _one_line_error(_run(env, "upload", "d", str(bad_zip)))
    huge = tmp_path / "huge.py"
    huge.write_bytes(b"#" * (1024 * 1024 + 1))
    assert "SPARKRING_MAX_ARTIFACT_BYTES" in _one_line_error(_run(env, "upload", "h", str(huge)))
    assert "no resource named 'nope'" in _one_line_error(_run(env, "show", "nope"))
    assert "positive integer" in _one_line_error(_run(env, "delete", "etl:zero"))


def test_unreachable_s3_is_one_line_without_secrets(env: dict[str, str], tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_bytes(b"print(1)\n")
    dead = {**env, "SPARKRING_S3_ENDPOINT": "http://127.0.0.1:1"}
    line = _one_line_error(_run(dead, "upload", "etl", str(job)))
    assert line.startswith("error: cannot reach S3 at http://127.0.0.1:1")
    assert env["SPARKRING_S3_SECRET_KEY"] not in line
    assert "cannot reach S3 at http://127.0.0.1:1" in _one_line_error(_run(dead, "gc"))
