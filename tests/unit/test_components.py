"""``server/components.py``: which part's death stops the server, and how a side loop
stops (no service needed)."""

from __future__ import annotations

from scheduler import loop
from server import components

Watch = components.Watch


def _part(name: str, alive: bool, watch: components.Watch) -> components.Component:
    return components.Component(name, lambda: alive, watch)


def test_the_first_dead_part_that_matters_is_named() -> None:
    parts = [
        _part("master watch", False, Watch.NEVER),
        _part("runner", True, Watch.ALWAYS),
        _part("registry", False, Watch.RUNNING),
        _part("coordinator", False, Watch.ALWAYS),
    ]
    assert components.dead(parts, stopping=False) == "registry"
    # A stopping server stops its registry itself: only the always-watched count.
    assert components.dead(parts, stopping=True) == "coordinator"
    assert components.dead(parts[:2], stopping=False) is None


def test_a_side_loop_stops_first_last_or_begins_first_and_ends_last() -> None:
    side = loop.Loop("never started", join_timeout=1)
    first = components.side_loop("a", side)
    last = components.side_loop("b", side, stop_first=False, stop_last=True)
    both = components.side_loop("c", side, stop_last=True)
    assert first.first_stop == side.stop and first.last_stop is None
    assert last.first_stop is None and last.last_stop == side.stop
    assert both.first_stop == side.begin_stop and both.last_stop == side.stop
    assert first.side is side and first.alive() is False
