"""Polling with a deadline: the one way tests wait for something to become true."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object], timeout: float, interval: float = 0.05, message: str = ""
) -> None:
    """Return as soon as ``predicate()`` is truthy; raise AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {timeout:g} s")
        time.sleep(interval)


def poll_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """Whether ``predicate()`` became truthy within ``timeout`` s: for a test that looks
    for something that must *not* happen within a bounded time, and goes on either way."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
