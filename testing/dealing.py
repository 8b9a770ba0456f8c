"""The order tests are collected in, so that pytest-xdist's ``worksteal`` gives every
worker its share of the long ones, first: the suite's and the campaign's tests marked
``long(seconds)`` (``tests/conftest.py`` deals them).

``worksteal`` deals the collection once, in contiguous chunks (worker k gets the next
``left // (workers - k)`` items); each worker runs its chunk from the front, and an idle
worker steals from the back of the longest queue. So a long case starts early only at
the front of a chunk, and long cases that share a chunk run one after the other on one
worker (the clean-clone run at 736595d: the seven long cases, collected first, all fell to
one worker, and the campaign took as long as they did, 712 s for 526 s of work each;
the one at 4c6c7d8: the suite's end-to-end tests, collected first as well, left one worker
running the last of them for about 80 s after the others had finished).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest


def chunk_sizes(count: int, workers: int) -> list[int]:
    """How many of ``count`` items worksteal's first deal gives each of ``workers``."""
    sizes = []
    left = count
    for k in range(workers):
        size = left // (workers - k)
        sizes.append(size)
        left -= size
    return sizes


def deal(seconds: Sequence[float | None], workers: int) -> list[int]:
    """The items' indices in their new order. ``seconds[i]`` is item i's expected length
    if it is a long case, else None. The long cases go, longest first, each to the front
    of the chunk with the fewest long seconds so far; the others keep their order."""
    long = sorted((i for i, s in enumerate(seconds) if s is not None), key=lambda i: -seconds[i])
    rest = [i for i, s in enumerate(seconds) if s is None]
    if workers <= 1:
        return long + rest
    heads: list[list[int]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for i in long:
        k = min(range(workers), key=lambda k: (loads[k], k))
        heads[k].append(i)
        loads[k] += seconds[i] or 0.0
    order: list[int] = []
    others = iter(rest)
    for k, size in enumerate(chunk_sizes(len(seconds), workers)):
        order += heads[k]
        order += itertools.islice(others, max(0, size - len(heads[k])))
    order += others
    return order


def workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers share the tests (1 without xdist). The deal that
    counts is the workers' own collection: the controller schedules by it."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return int(workerinput["workercount"])
    count = getattr(config.option, "numprocesses", None)
    return count if isinstance(count, int) and count > 0 else 1


def deal_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the ones marked ``long(seconds)`` dealt first (not
    those marked to be skipped: the campaign's cases in a run of the whole tests/)."""
    seconds = [
        float(mark.args[0])
        if (mark := item.get_closest_marker("long")) and not item.get_closest_marker("skip")
        else None
        for item in items
    ]
    if any(s is not None for s in seconds):
        items[:] = [items[i] for i in deal(seconds, workers(config))]
