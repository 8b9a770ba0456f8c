"""server/livelog.py: the tail of a log file and following it until the run ends."""

from __future__ import annotations

from pathlib import Path

from server import livelog


def test_tail_returns_the_last_lines(tmp_path: Path) -> None:
    path = tmp_path / "driver.log"
    path.write_text("".join(f"line {i}\n" for i in range(50)) + "no newline")
    assert livelog.tail(path, 2) == "line 49\nno newline\n"
    assert livelog.tail(path, 0) == "no newline\n"  # at least one line


def test_follow_sends_the_tail_then_what_is_appended_until_the_run_ends(tmp_path: Path) -> None:
    path = tmp_path / "driver.log"
    path.write_text("a\nb\nc\n")
    running = [True]
    stream = livelog.follow(path, 2, lambda: running[0], poll=0.01)
    assert next(stream) == b"b\nc\n"
    with path.open("a") as log:
        log.write("d\n")
    assert next(stream) == b"d\n"
    with path.open("a") as log:
        log.write("last words\n")
    running[0] = False
    # Written before the run ended: still sent, then the stream ends.
    assert list(stream) == [b"last words\n"]


def test_follow_stops_at_its_time_limit(tmp_path: Path) -> None:
    path = tmp_path / "driver.log"
    path.write_text("x\n")
    assert list(livelog.follow(path, 5, lambda: True, poll=0.01, max_seconds=0)) == [b"x\n"]
