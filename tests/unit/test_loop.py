"""``scheduler/loop.py``: the side threads' shell (no service needed)."""

from __future__ import annotations

import threading
import time

from scheduler import loop


class _Counting(loop.Loop):
    def __init__(self, *, interval: float, first_wait: float = 0.0, wait: float | None = None):
        self.steps = 0
        self.stepped = threading.Event()
        self._wait = wait
        super().__init__("counting", join_timeout=5, interval=interval, first_wait=first_wait)

    def step(self) -> float | None:
        self.steps += 1
        self.stepped.set()
        return self._wait


def test_a_loop_steps_at_once_and_stop_is_idempotent() -> None:
    counting = _Counting(interval=60)
    counting.start()
    assert counting.stepped.wait(5)
    assert counting.is_alive()
    counting.stop()
    assert not counting.is_alive()
    counting.stop()
    assert counting.steps == 1  # the stop ended the interval's wait


def test_a_first_wait_delays_the_first_step_and_a_wake_ends_a_wait() -> None:
    counting = _Counting(interval=60, first_wait=60)
    counting.start()
    try:
        assert not counting.stepped.wait(0.2)
        counting.wake()
        assert counting.stepped.wait(5)
    finally:
        counting.stop()
    assert counting.steps == 1


def test_a_step_that_asks_for_no_wait_runs_again_at_once() -> None:
    counting = _Counting(interval=60, wait=0.0)
    counting.start()
    deadline = time.monotonic() + 5
    while counting.steps < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    counting.stop()
    assert counting.steps >= 3


def test_a_loop_never_started_stops_at_once() -> None:
    counting = _Counting(interval=60)
    counting.stop()
    assert not counting.is_alive()
