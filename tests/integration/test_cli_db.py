"""``sparkring db`` against the stack's PostgreSQL, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from testing import cli_runner, services


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_runner.run(args, env={**os.environ, **env}, timeout=60)


def test_upgrade_downgrade_base_upgrade(stack_env: dict[str, str], database_url: str) -> None:
    env = {**stack_env, "SPARKRING_DATABASE_URL": database_url}
    assert _run(env, "db", "downgrade", "base").returncode == 0
    current = _run(env, "db", "current", "--json")
    assert '"current": null' in current.stdout
    up = _run(env, "db", "upgrade")
    assert up.returncode == 0, up.stderr
    assert '"up_to_date": true' in _run(env, "db", "current", "--json").stdout


def test_unreachable_database_is_one_clear_line(stack_env: dict[str, str]) -> None:
    env = {**stack_env, "SPARKRING_DATABASE_URL": "postgresql://admin:s3cr3t@127.0.0.1:1/x"}
    result = _run(env, "db", "current")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "cannot reach PostgreSQL at 127.0.0.1:1/x" in lines[0]
    assert "s3cr3t" not in result.stderr and "Traceback" not in result.stderr


def test_missing_setting_is_named(stack_env: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    env.update({k: v for k, v in stack_env.items() if k != "SPARKRING_DATABASE_URL"})
    result = cli_runner.run(["db", "current"], env=env, timeout=60)
    assert result.returncode == 78  # a settings error: EX_CONFIG (docs/operations.md)
    assert "SPARKRING_DATABASE_URL is not set" in result.stderr


def test_stack_reports_its_services() -> None:
    result = subprocess.run(
        [sys.executable, str(services.REPO / "scripts" / "stack.py"), "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert '"postgresql": true' in result.stdout
