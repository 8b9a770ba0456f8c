"""The campaign's cases in the order that gives every worker its share of the long ones
first (``tests/chaos/dealing.py``), checked against worksteal's first deal."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from testing import dealing


def _chunks(order: list[int], workers: int) -> list[list[int]]:
    chunks, start = [], 0
    for size in dealing.chunk_sizes(len(order), workers):
        chunks.append(order[start : start + size])
        start += size
    return chunks


def test_chunk_sizes_are_worksteals_first_deal() -> None:
    assert dealing.chunk_sizes(93, 3) == [31, 31, 31]
    assert dealing.chunk_sizes(10, 3) == [3, 3, 4]
    assert dealing.chunk_sizes(5, 1) == [5]


def test_long_cases_lead_every_chunk_and_are_shared_out() -> None:
    # The campaign at 736595d: long cases first in collection order, then 86 others.
    long = [90, 60, 55, 80, 160, 200, 60]
    seconds: list[float | None] = [*long, *[None] * 86]
    order = dealing.deal(seconds, 3)
    assert sorted(order) == list(range(93))
    chunks = _chunks(order, 3)
    loads = [sum(seconds[i] or 0 for i in chunk) for chunk in chunks]
    assert max(loads) <= 260, loads  # 200 + 55, 160 + 60, 90 + 80 + 60
    for chunk in chunks:
        heads = [i for i in chunk if seconds[i] is not None]
        assert chunk[: len(heads)] == heads  # the long ones at the front
    # Collected first, as before the deal, the seven all fell in the first chunk.
    assert sum(1 for i in range(31) if seconds[i] is not None) == 7


def test_one_worker_runs_the_long_cases_first_longest_first() -> None:
    assert dealing.deal([None, 10.0, None, 30.0], 1) == [3, 1, 0, 2]


@given(
    st.lists(st.one_of(st.none(), st.floats(1, 300)), max_size=60),
    st.integers(1, 4),
)
def test_a_deal_is_a_permutation_keeping_the_others_order(
    seconds: list[float | None], workers: int
) -> None:
    order = dealing.deal(seconds, workers)
    assert sorted(order) == list(range(len(seconds)))
    others = [i for i in order if seconds[i] is None]
    assert others == sorted(others)
