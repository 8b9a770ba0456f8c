"""The suite's warning filters (pyproject.toml): every warning is an error but a
PostgreSQL connection garbage-collected open, which lands on whatever test is current."""

from __future__ import annotations

import warnings

import pytest


def test_a_connection_collected_open_is_recorded_not_raised() -> None:
    message = (
        "<psycopg.Connection object at 0x7f0000000000> was deleted while still open. "
        "Please use 'with' or '.close()' to close the connection properly"
    )
    with warnings.catch_warnings(record=True) as seen:  # the suite's filters, recorded
        warnings.warn(message, ResourceWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == [message]


def test_any_other_resource_warning_is_still_an_error() -> None:
    with pytest.raises(ResourceWarning):
        warnings.warn("unclosed file <_io.TextIOWrapper name='x'>", ResourceWarning, stacklevel=1)
