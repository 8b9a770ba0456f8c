"""server/web/livelog.py: the tail of a log file, following it (an asynchronous stream that
ends with a line saying why), and the gate that bounds open follows."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from server.web import livelog


def test_tail_returns_the_last_lines(tmp_path: Path) -> None:
    path = tmp_path / "driver.log"
    path.write_text("".join(f"line {i}\n" for i in range(50)) + "no newline")
    assert livelog.tail(path, 2) == "line 49\nno newline\n"
    assert livelog.tail(path, 0) == "no newline\n"  # at least one line


def test_a_log_of_one_huge_line_is_read_from_its_end_only(tmp_path: Path) -> None:
    """Issue 45: the tail was read line by line from the start, so one line of the
    driver's without an end (here 64 MiB) was read whole into the server's memory."""
    path = tmp_path / "driver.log"
    with path.open("wb") as handle:
        handle.write(b"x" * (64 << 20))
        handle.write(b"\nlast words\n")
    tracemalloc.start()
    try:
        text = livelog.tail(path, 5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text.endswith("last words\n")
    assert len(text) < 16 << 20
    assert peak < 32 << 20, f"peak {peak >> 20} MiB for a 64 MiB line"


async def _take(stream: AsyncIterator[bytes]) -> bytes:
    return await anext(stream)


async def _rest(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in stream]


def test_follow_sends_the_tail_then_what_is_appended_until_the_run_ends(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "driver.log"
        path.write_text("a\nb\nc\n")
        running = [True]
        stream = livelog.follow(path, 2, lambda: running[0], poll=0.01)
        assert await _take(stream) == b"b\nc\n"
        with path.open("a") as log:
            log.write("d\n")
        assert await _take(stream) == b"d\n"
        with path.open("a") as log:
            log.write("last words")
        running[0] = False
        # Written before the run ended: still sent, then the line saying why it ends.
        assert await _rest(stream) == [
            b"last words",
            b"\n[sparkring] follow ended: the run ended\n",
        ]

    asyncio.run(scenario())


def test_follow_ends_at_its_time_limit_and_when_idle_with_a_line_saying_so(
    tmp_path: Path,
) -> None:
    path = tmp_path / "driver.log"
    path.write_text("x\n")
    limited = livelog.follow(path, 5, lambda: True, poll=0.01, max_seconds=0)
    assert asyncio.run(_rest(limited)) == [
        b"x\n",
        b"[sparkring] follow ended: the limit of 0 s; follow again to go on\n",
    ]
    idle = livelog.follow(path, 5, lambda: True, poll=0.01, idle_seconds=0.05)
    assert asyncio.run(_rest(idle)) == [
        b"x\n",
        b"[sparkring] follow ended: no output for 0.05 s; follow again to go on\n",
    ]


def test_a_follow_from_no_lines_sends_only_what_is_written_from_now_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        path = tmp_path / "driver.log"
        path.write_text("old\n")
        running = [True]
        stream = livelog.follow(path, 0, lambda: running[0], poll=0.01)
        first = asyncio.ensure_future(_take(stream))
        await asyncio.sleep(0.05)
        with path.open("a") as log:
            log.write("new\n")
        assert await first == b"new\n"
        running[0] = False
        assert await _rest(stream) == [b"[sparkring] follow ended: the run ended\n"]

    asyncio.run(scenario())


def test_the_gate_bounds_follows_per_token_and_per_server() -> None:
    gate = livelog.FollowGate(per_token=2, per_server=3)
    first, _second = gate.admit("a"), gate.admit("a")
    with pytest.raises(livelog.FollowRefused, match="token 'a' has 2 log follows open"):
        gate.admit("a")
    gate.admit("cluster", counted=False)
    with pytest.raises(livelog.FollowRefused, match="this server has 3 log follows open"):
        gate.admit("b")
    first()
    first()  # a second release changes nothing
    gate.admit("b")
    with pytest.raises(livelog.FollowRefused, match="this server has 3"):
        gate.admit("c")
