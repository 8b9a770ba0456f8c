"""The fault injectors that need no service: each must do what the campaign says it
does, or a clean run proves nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from server import watchdog
from tests.chaos import faults
from tests.conftest import unavailable
from tests.waiting import wait_until

# Prints, every 0.1 s (through time.sleep, which Debian's libfaketime 0.9.10 breaks),
# the wall clock's and BOOTTIME's offsets from the values it started with.
_CLOCK_PROBE = """
import json, sys, time
while True:
    print(json.dumps({"t": time.time(), "mono": time.clock_gettime(time.CLOCK_BOOTTIME)}),
          flush=True)
    time.sleep(0.1)
"""


def test_a_stepped_clock_moves_the_wall_clock_of_a_running_process_only(tmp_path: Path) -> None:
    clock = faults.SteppableClock(tmp_path / "clock")
    probe = subprocess.Popen(
        [sys.executable, "-c", _CLOCK_PROBE],
        env={**clock.env, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert probe.stdout is not None

    def offset() -> float:
        line = probe.stdout.readline()
        assert line, f"the probe ended (rc {probe.poll()})"
        r = json.loads(line)
        # Its wall clock against the host's, measured through BOOTTIME (unfaked).
        return r["t"] - (r["mono"] + time.time() - watchdog.lease_clock())

    try:
        assert abs(offset()) < 1.0
        clock.step(-300)
        wait_until(lambda: abs(offset() + 300) < 1.0, 10, 0, "no step back")
        clock.step(+300)
        wait_until(lambda: abs(offset() - 300) < 1.0, 10, 0, "no step forward")
        clock.step(0)
        wait_until(lambda: abs(offset()) < 1.0, 10, 0, "no step home")
    finally:
        probe.kill()
        probe.wait(timeout=10)
        probe.stdout.close()


def test_two_partitions_drawn_the_same_number_get_namespaces_of_their_own() -> None:
    """The campaign's workers partition at the same moment; a number drawn twice must
    not make the second namespace fail (or share the first one's addresses and rules)."""
    reason = faults.namespaces_unavailable()
    if reason:
        unavailable(reason)
    first, second = faults.Partition([1]), faults.Partition([1])
    second._pick(first.index)
    try:
        first.create()
        second.create()
        assert first.name != second.name and first.host != second.host
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert first.name in listed and second.name in listed
    finally:
        first.close()
        second.close()
