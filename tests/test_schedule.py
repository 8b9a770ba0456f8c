"""Schedules, pure: specs, fire times (DST in a real zone), misfire and concurrency."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import schedule
from scheduler.schedule import Action, Concurrency, Misfire, SkipReason

BERLIN = "Europe/Berlin"


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("61 * * * *", "not a valid cron expression"),
        ("* * * *", "has 4 fields"),
        ("0 0 * * * * 2026", "has 7 fields"),
        ("@yearly", "is not one of @hourly"),
        ("@every 0s", "1s or more"),
        ("@every", "1s or more"),
        ("@every five", "not a number with a unit"),
        # Valid cron, but no such day: accepted before, then `job start` answered 500.
        ("0 0 31 2 *", "never fires"),
        ("0 0 0 30 2 *", "never fires"),
    ],
)
def test_a_bad_spec_is_refused_by_name(spec: str, message: str) -> None:
    with pytest.raises(schedule.ScheduleError, match=message):
        schedule.parse(spec)


def test_an_unknown_zone_and_unknown_policies_are_refused() -> None:
    with pytest.raises(schedule.ScheduleError, match="time zone 'Mars/Olympus' is unknown"):
        schedule.parse("@daily", timezone="Mars/Olympus")
    with pytest.raises(schedule.ScheduleError, match="--misfire 'often'"):
        schedule.parse("@daily", misfire="often")
    with pytest.raises(schedule.ScheduleError, match="--concurrency 'allow'"):
        schedule.parse("@daily", concurrency="allow")


def test_durations() -> None:
    assert schedule.parse_duration("90s") == 90
    assert schedule.parse_duration("1h30m") == 5400
    assert schedule.format_duration(5400) == "1h30m"
    assert schedule.parse("@every 90s").spec == "@every 1m30s"


def test_every_fires_on_multiples_of_its_period_since_the_epoch() -> None:
    s = schedule.parse("@every 5s")
    assert schedule.next_fire(s, _utc(2026, 11, 25, 20, 0, 3)) == _utc(2026, 11, 25, 20, 0, 5)
    assert schedule.next_fire(s, _utc(2026, 11, 25, 20, 0, 5)) == _utc(2026, 11, 25, 20, 0, 10)


def test_six_fields_put_seconds_first() -> None:
    s = schedule.parse("*/20 * * * * *")
    assert schedule.next_fire(s, _utc(2026, 1, 1, 0, 0, 1)) == _utc(2026, 1, 1, 0, 0, 20)


def test_cron_fields_are_local_times_of_the_zone() -> None:
    s = schedule.parse("0 9 * * *", timezone=BERLIN)
    # 9:00 in Berlin in winter is 8:00 UTC.
    assert schedule.next_fire(s, _utc(2026, 1, 10, 0, 0)) == _utc(2026, 1, 10, 8, 0)


def test_a_local_time_in_the_dst_gap_is_a_gap_slot_and_no_fire() -> None:
    # 2026-03-29: Berlin jumps from 02:00 CET to 03:00 CEST; 02:30 does not exist.
    s = schedule.parse("30 2 * * *", timezone=BERLIN)
    found = list(_take(schedule.slots(s, _utc(2026, 3, 28, 0, 0)), 3))
    assert found[0].at == _utc(2026, 3, 28, 1, 30)
    assert found[1].at is None and found[1].local == datetime(2026, 3, 29, 2, 30)
    assert found[2].at == _utc(2026, 3, 30, 0, 30)  # 02:30 CEST
    assert schedule.next_fire(s, _utc(2026, 3, 28, 1, 30)) == _utc(2026, 3, 30, 0, 30)


def test_a_repeated_local_time_fires_once_at_its_first_occurrence() -> None:
    # 2026-10-25: Berlin goes from 03:00 CEST back to 02:00 CET; 02:30 happens twice.
    s = schedule.parse("30 2 * * *", timezone=BERLIN)
    fires = [slot.at for slot in _take(schedule.slots(s, _utc(2026, 10, 24, 12, 0)), 2)]
    assert fires == [_utc(2026, 10, 25, 0, 30), _utc(2026, 10, 26, 1, 30)]


def test_due_records_the_gap_slot_between_two_fires() -> None:
    s = schedule.parse("30 2 * * *", timezone=BERLIN)
    result = schedule.due(s, _utc(2026, 3, 28, 1, 30), _utc(2026, 3, 30, 0, 30, 1))
    assert [slot.at for slot in result.slots] == [None, _utc(2026, 3, 30, 0, 30)]
    assert result.next_fire == _utc(2026, 3, 31, 0, 30)
    decisions = schedule.decide(
        s, result.slots, _utc(2026, 3, 30, 0, 30, 1), previous_running=False
    )
    assert decisions[0].action is Action.SKIP
    assert decisions[0].reason == "dst-gap: 2026-03-29 02:30:00 does not exist in Europe/Berlin"
    assert decisions[1].action is Action.RUN


def test_a_long_outage_handles_only_the_latest_slots() -> None:
    s = schedule.parse("@every 1s")
    now = _utc(2026, 1, 2)
    result = schedule.due(s, _utc(2026, 1, 1), now, limit=50)
    assert result.truncated
    assert len(result.slots) == 50
    assert result.slots[-1].at == now
    assert result.next_fire == now + timedelta(seconds=1)


def _take(iterator, n):  # type: ignore[no-untyped-def]
    return [next(iterator) for _ in range(n)]


ZONES = st.sampled_from(["UTC", BERLIN, "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"])
SPECS = st.sampled_from(
    ["* * * * *", "30 2 * * *", "0 * * * *", "*/7 * * * * *", "@every 13s", "@every 1h", "@daily"]
)
INSTANTS = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=200, deadline=None)
@given(spec=SPECS, zone=ZONES, start=INSTANTS)
def test_fire_times_strictly_increase_and_next_fire_agrees(
    spec: str, zone: str, start: datetime
) -> None:
    s = schedule.parse(spec, timezone=zone)
    fires = [slot.at for slot in _take(schedule.slots(s, start), 40) if slot.at is not None]
    assert fires and fires[0] >= start
    assert all(a < b for a, b in itertools.pairwise(fires))
    assert schedule.next_fire(s, fires[0]) == fires[1]


@settings(max_examples=200, deadline=None)
@given(
    spec=SPECS,
    zone=ZONES,
    after=INSTANTS,
    span=st.integers(min_value=0, max_value=3 * 86400),
    misfire=st.sampled_from(list(Misfire)),
    concurrency=st.sampled_from(list(Concurrency)),
    running=st.booleans(),
)
def test_at_most_one_due_slot_runs_and_every_other_is_skipped_with_a_reason(
    spec: str,
    zone: str,
    after: datetime,
    span: int,
    misfire: Misfire,
    concurrency: Concurrency,
    running: bool,
) -> None:
    s = schedule.parse(spec, timezone=zone, misfire=misfire, concurrency=concurrency)
    now = after + timedelta(seconds=span)
    result = schedule.due(s, after, now, limit=200)
    assert all(slot.at is None or after < slot.at <= now for slot in result.slots)
    assert result.next_fire > now
    decisions = schedule.decide(s, result.slots, now, previous_running=running)
    started = [d for d in decisions if d.action is not Action.SKIP]
    assert len(started) <= 1
    assert all(d.reason for d in decisions if d.action is Action.SKIP)
    if started:
        assert started[0].slot is [slot for slot in result.slots if slot.at][-1]
        assert (started[0].action is Action.REPLACE) == running


def test_misfire_run_once_runs_the_latest_missed_fire_within_the_grace() -> None:
    s = schedule.parse("@every 1m", misfire_grace=600)
    now = _utc(2026, 1, 1, 0, 5, 30)
    result = schedule.due(s, _utc(2026, 1, 1, 0, 1, 0), now)
    decisions = schedule.decide(s, result.slots, now, previous_running=False)
    assert [d.action for d in decisions] == [Action.SKIP] * 3 + [Action.RUN]
    assert {d.reason for d in decisions[:3]} == {SkipReason.MISFIRE.value}


def test_misfire_run_once_past_the_grace_and_skip_record_every_missed_fire() -> None:
    now = _utc(2026, 1, 1, 0, 5, 30)
    for s in (
        schedule.parse("@every 1m", misfire_grace=20),
        schedule.parse("@every 1m", misfire="skip"),
    ):
        result = schedule.due(s, _utc(2026, 1, 1, 0, 1, 0), now)
        decisions = schedule.decide(s, result.slots, now, previous_running=False)
        assert [d.action for d in decisions] == [Action.SKIP] * 4


def test_an_on_time_fire_runs_under_skip() -> None:
    s = schedule.parse("@every 1m", misfire="skip")
    now = _utc(2026, 1, 1, 0, 5, 0, 300000)
    result = schedule.due(s, _utc(2026, 1, 1, 0, 4, 0), now)
    assert [d.action for d in schedule.decide(s, result.slots, now, previous_running=False)] == [
        Action.RUN
    ]


def test_forbid_skips_and_replace_replaces_while_the_previous_run_runs() -> None:
    now = _utc(2026, 1, 1, 0, 5, 0)
    for policy, action in (
        (Concurrency.FORBID, Action.SKIP),
        (Concurrency.REPLACE, Action.REPLACE),
    ):
        s = schedule.parse("@every 1m", concurrency=policy)
        result = schedule.due(s, _utc(2026, 1, 1, 0, 4, 0), now)
        (decision,) = schedule.decide(s, result.slots, now, previous_running=True)
        assert decision.action is action
    assert decision.reason is None
    s = schedule.parse("@every 1m")
    (skipped,) = schedule.decide(s, result.slots, now, previous_running=True)
    assert skipped.reason == "previous run still running"


def test_iso_is_utc_with_z() -> None:
    assert schedule.iso(_utc(2026, 11, 25, 20, 0, 5)) == "2026-11-25T20:00:05Z"
