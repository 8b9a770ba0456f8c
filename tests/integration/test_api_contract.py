"""The API keeps its published contract (issue 30): Schemathesis reads
``/api/v1/openapi.json`` from a real server on the local stack (its own database,
ZooKeeper root and bucket; a job and a resource in place) and runs its coverage,
fuzzing and stateful phases with every check, a fixed seed and a bounded number of
examples, first with an operator token, then with a viewer token. Any failure fails
the test, with Schemathesis' own report (each failure with a ``curl`` to replay it).

Longer runs by hand: docs/console.md, "Fuzzing the API"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.api_helpers import API, ApiStack, api_stack
from testing.cluster import HEARTBEAT_JOB

# Fixed, so a failure in CI replays the same requests locally (another by hand).
SEED = int(os.environ.get("SPARKRING_FUZZ_SEED", "30"))
# Examples per operation and phase: each pass takes 50-70 s here, the module about 2 min.
MAX_EXAMPLES = int(os.environ.get("SPARKRING_FUZZ_EXAMPLES", "10"))
CONFIG = Path(__file__).resolve().parents[1] / "schemathesis.toml"
# By hand, a longer run: fuzzing and stateful testing repeat until this many seconds
# are spent (docs/console.md).
MAX_SECONDS = os.environ.get("SPARKRING_FUZZ_SECONDS")
# Concurrent workers of a pass (by hand, 2: they race each other, which is the point).
WORKERS = os.environ.get("SPARKRING_FUZZ_WORKERS", "1")
# A pass that takes longer than this is a hang, not a slow fuzzer.
PASS_TIMEOUT_S = 300 + int(MAX_SECONDS or 0)


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, stack_env: dict[str, str], zk_hosts: str, s3_endpoint: str, tmp_path_factory
) -> Iterator[ApiStack]:
    # Generated alerts name generated webhooks: the server sends no delivery during the
    # run (its first pass finds none; the next is a day away), so no request leaves.
    quiet = {"SPARKRING_ALERT_INTERVAL": "86400"}
    stacks = api_stack(postgres_url, stack_env, Path(tmp_path_factory.mktemp("contract")), quiet)
    try:
        stack = next(stacks)
        stack.create_job("fuzzed")
        stack.create_job("fuzzed-batch", kind="batch", schedule="@daily")
        with stack.client(stack.operator) as http:
            made = http.post(
                f"{API}/resources/fuzzed",
                files={"file": ("fuzzed.py", HEARTBEAT_JOB.read_bytes())},
            )
            assert made.status_code == 201, made.text
            # An alert the generated paths name ("fuzzed" is drawn for path.name).
            alert = http.post(
                f"{API}/alerts", json={"name": "fuzzed", "webhook": "http://127.0.0.1:9/"}
            )
            assert alert.status_code == 201, alert.text
        yield stack
    finally:
        stacks.close()


def schemathesis(stack: ApiStack, token: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """One run of the Schemathesis CLI against ``stack`` as ``token``'s holder."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(CONFIG),
            "run",
            f"{stack.url}{API}/openapi.json",
            "--checks",
            "all",
            "--seed",
            str(SEED),
            "--max-examples",
            str(MAX_EXAMPLES),
            "--workers",
            WORKERS,
            "--suppress-health-check",
            "all",
            *(["--max-time", MAX_SECONDS] if MAX_SECONDS else []),
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=PASS_TIMEOUT_S,
        check=False,
        # The token in the environment (tests/schemathesis.toml), not in argv.
        env={**os.environ, "NO_COLOR": "1", "SPARKRING_FUZZ_TOKEN": token},
    )


@pytest.mark.parametrize(
    "role",
    [
        pytest.param("operator", marks=pytest.mark.long(95)),
        pytest.param("viewer", marks=pytest.mark.long(60)),
    ],
)
def test_schemathesis_finds_no_failure(stack: ApiStack, role: str, tmp_path: Path) -> None:
    token = stack.operator if role == "operator" else stack.viewer
    run = schemathesis(stack, token, tmp_path)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    figures = re.search(r"(\d+) generated, (\d+) passed", report)
    assert figures is not None and figures[1] == figures[2], report
    print(f"schemathesis as {role}: {figures[0]}")
    # Shown with -rA: its warnings (operations that stayed at 404, links not followed).
    print(report[report.rfind("WARNINGS") :])
