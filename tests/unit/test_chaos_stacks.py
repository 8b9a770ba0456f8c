"""Which stack the chaos campaign runs on (``tests/chaos/conftest.py``), and the order the
campaign and the suite give out their long tests in (``testing/dealing.py``).

``scripts/test.sh`` runs the campaign on stacks of its own named by
``SPARKRING_CHAOS_STACKS`` (after the suite, or beside it with ``CHAOS_BESIDE_SUITE=1``):
a campaign in one process must take the first one named, never the main stack the suite
runs on (it stops ZooKeeper and PostgreSQL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collect(
    stacks: str, path: str = "tests/chaos/test_invariants.py"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARKRING_CHAOS_STACKS": stacks, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
         path],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_campaign_in_one_process_takes_the_first_stack_named(tmp_path: Path) -> None:
    missing = _collect(f"{tmp_path / 'none'},{tmp_path / 'other'}")
    assert missing.returncode == 4, missing.stdout + missing.stderr
    assert f"{tmp_path / 'none' / 'env.json'} is missing" in missing.stdout + missing.stderr

    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "env.json").write_text(json.dumps({"SPARKRING_STACK_DIR": str(stack)}))
    found = _collect(str(stack))
    assert found.returncode == 0, found.stdout + found.stderr


def test_the_campaign_gives_out_its_long_cases_first(tmp_path: Path) -> None:
    """Collected last, the randomized mode (CHAOS_MINUTES and more) would run alone on
    one worker while the others had nothing left; the cases marked ``long`` come first."""
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "env.json").write_text(json.dumps({"SPARKRING_STACK_DIR": str(stack)}))
    found = _collect(str(stack), "tests/chaos")
    assert found.returncode == 0, found.stdout + found.stderr
    ids = [line for line in found.stdout.splitlines() if "::" in line]
    randomized = next(i for i, t in enumerate(ids) if "test_randomized_faults" in t)
    two_minutes = next(i for i, t in enumerate(ids) if "spark_master_down_for_two_minutes" in t)
    kill_9 = next(i for i, t in enumerate(ids) if "test_kill_9_of_a_server[" in t)
    assert max(randomized, two_minutes) < kill_9, ids


def test_the_suite_gives_out_its_long_tests_first(tmp_path: Path) -> None:
    """The end-to-end tests are collected first and together: without the deal, one
    worker ran the last long ones while the others had nothing left to do. In one
    process the tests marked ``long`` come first, longest first."""
    found = _collect(str(tmp_path / "unused"), "tests/e2e")
    assert found.returncode == 0, found.stdout + found.stderr
    ids = [line for line in found.stdout.splitlines() if "::" in line]
    master_failover = next(i for i, t in enumerate(ids) if "test_spark_master_failover.py" in t)
    sandbox_pi = next(i for i, t in enumerate(ids) if "sparks_own_pi_example" in t)
    short = next(i for i, t in enumerate(ids) if "test_bad_commands_are_one_clear_line" in t)
    assert master_failover == 0 and sandbox_pi < short, ids
