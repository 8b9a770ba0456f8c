"""Where a test session keeps its temporary folders (``tests/conftest.py``).

Drivers of the e2e tests run as the stack's driver user, so a session's folders must
live under a parent that user may pass through, never under pytest's
``/tmp/pytest-of-<user>``, which every pytest session that starts resets to 0700. The
driver user is the stack's (its ``env.json``), whether or not the shell exported it:
``scripts/test.sh`` (and so CI) exports nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent(
    """
    import pytest

    class Probe:
        @pytest.hookimpl(trylast=True)
        def pytest_configure(self, config):
            print("basetemp=" + str(config.option.basetemp))

    pytest.main(["-q", "-p", "no:cacheprovider", "--collect-only",
                 "tests/unit/test_spark_master.py"], plugins=[Probe()])
    """
)


def _basetemp(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    [line] = [x for x in done.stdout.splitlines() if x.startswith("basetemp=")]
    return line.removeprefix("basetemp=")


def test_the_stacks_driver_user_keeps_the_session_out_of_pytest_of_user(tmp_path: Path) -> None:
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "env.json").write_text(json.dumps({"SPARKRING_DRIVER_USER": "sparkring-driver"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    env |= {"SPARKRING_STACK_DIR": str(stack), "PYTHONPATH": str(ROOT)}
    chosen = _basetemp(env)
    assert f"sparkring-pytest-{os.geteuid()}" in chosen, chosen
    # Without a driver user anywhere, pytest's own default stays.
    (stack / "env.json").write_text("{}")
    assert _basetemp(env) == "None"
