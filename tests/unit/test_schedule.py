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


# 2026-03-29 01:00Z: Berlin jumps from 02:00 CET to 03:00 CEST; 02:00-02:59 do not exist.
BERLIN_JUMP = _utc(2026, 3, 29, 1, 0)


def _us(n: int) -> timedelta:
    return timedelta(microseconds=n)


def test_a_local_time_in_the_dst_gap_is_a_gap_slot_and_no_fire() -> None:
    s = schedule.parse("30 2 * * *", timezone=BERLIN)
    found = list(_take(schedule.slots(s, _utc(2026, 3, 28, 0, 0)), 3))
    assert found[0].at == _utc(2026, 3, 28, 1, 30)
    # The jump less one microsecond per second from 02:30 to the gap's end (03:00).
    assert found[1].gap and found[1].local == datetime(2026, 3, 29, 2, 30)
    assert found[1].at == BERLIN_JUMP - _us(1800)
    assert found[2].at == _utc(2026, 3, 30, 0, 30)  # 02:30 CEST
    assert not found[2].gap
    assert schedule.next_fire(s, _utc(2026, 3, 28, 1, 30)) == _utc(2026, 3, 30, 0, 30)


def test_gap_slots_have_their_own_instants_before_the_jump_and_the_fire_at_it() -> None:
    """Four gap slots of one jump, and a fire at the jump itself (03:00 CEST), each
    have their own instant: the unique (job, scheduled time) holds each once."""
    quarter = schedule.parse("*/15 2,3 * * *", timezone=BERLIN)
    found = list(_take(schedule.slots(quarter, _utc(2026, 3, 29, 0, 50)), 6))
    assert [slot.gap for slot in found] == [True] * 4 + [False] * 2
    assert [slot.at for slot in found] == [
        BERLIN_JUMP - _us(3600),
        BERLIN_JUMP - _us(2700),
        BERLIN_JUMP - _us(1800),
        BERLIN_JUMP - _us(900),
        BERLIN_JUMP,  # 03:00 CEST
        BERLIN_JUMP + timedelta(minutes=15),
    ]
    hourly = schedule.parse("@hourly", timezone=BERLIN)
    gap, fire = _take(schedule.slots(hourly, _utc(2026, 3, 29, 0, 30)), 2)
    assert (gap.gap, gap.local, gap.at) == (True, datetime(2026, 3, 29, 2), BERLIN_JUMP - _us(3600))
    assert (fire.gap, fire.at) == (False, BERLIN_JUMP)


def test_a_whole_skipped_day_has_its_gap_slots_within_the_second_before_the_jump() -> None:
    # Samoa skipped 2011-12-30: 23:59:59 on the 29th (-10) was followed by 00:00 on the
    # 31st (+14), at 2011-12-30 10:00Z.
    s = schedule.parse("0 12 * * *", timezone="Pacific/Apia")
    before, gap, after = _take(schedule.slots(s, _utc(2011, 12, 29)), 3)
    jump = _utc(2011, 12, 30, 10, 0)
    assert before.at == _utc(2011, 12, 29, 22, 0) and not before.gap
    assert gap.gap and gap.local == datetime(2011, 12, 30, 12, 0)
    assert gap.at == jump - _us(12 * 3600)
    assert after.at == _utc(2011, 12, 30, 22, 0) and not after.gap


def test_a_repeated_local_time_fires_once_at_its_first_occurrence() -> None:
    # 2026-10-25: Berlin goes from 03:00 CEST back to 02:00 CET; 02:30 happens twice.
    s = schedule.parse("30 2 * * *", timezone=BERLIN)
    fires = [slot.at for slot in _take(schedule.slots(s, _utc(2026, 10, 24, 12, 0)), 2)]
    assert fires == [_utc(2026, 10, 25, 0, 30), _utc(2026, 10, 26, 1, 30)]


def test_due_records_the_gap_slot_between_two_fires() -> None:
    s = schedule.parse("30 2 * * *", timezone=BERLIN)
    result = schedule.due(s, _utc(2026, 3, 28, 1, 30), _utc(2026, 3, 30, 0, 30, 1))
    assert [slot.at for slot in result.slots] == [
        BERLIN_JUMP - _us(1800),
        _utc(2026, 3, 30, 0, 30),
    ]
    assert result.next_fire == _utc(2026, 3, 31, 0, 30)
    decisions = schedule.decide(
        s, result.slots, _utc(2026, 3, 30, 0, 30, 1), previous_running=False
    )
    assert decisions[0].action is Action.SKIP
    assert decisions[0].reason == "dst-gap: 2026-03-29 02:30:00 does not exist in Europe/Berlin"
    assert decisions[1].action is Action.RUN


def test_a_gap_slot_is_due_once_at_the_pass_after_the_jump_not_the_pass_before() -> None:
    """The passes of the 28th's and the 30th's fires: the gap slot of the 29th is due
    at the second only. It was due at both (the first a day early)."""
    s = schedule.parse("30 2 * * *", timezone=BERLIN)
    first_pass = _utc(2026, 3, 28, 1, 30, 0, 400000)
    second_pass = _utc(2026, 3, 30, 0, 30, 0, 400000)
    first = schedule.due(s, _utc(2026, 3, 28), first_pass)
    assert [slot.local for slot in first.slots] == [datetime(2026, 3, 28, 2, 30)]
    assert first.next_fire == _utc(2026, 3, 30, 0, 30)  # a gap slot is no fire
    second = schedule.due(s, first_pass, second_pass)
    assert [slot.local for slot in second.slots] == [
        datetime(2026, 3, 29, 2, 30),
        datetime(2026, 3, 30, 2, 30),
    ]


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
    found = _take(schedule.slots(s, start), 40)
    assert found[0].at >= start
    assert all(a.at < b.at for a, b in itertools.pairwise(found))  # gap slots too
    fires = [slot.at for slot in found if not slot.gap]
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
    assert all(after < slot.at <= now for slot in result.slots)
    assert result.next_fire > now
    decisions = schedule.decide(s, result.slots, now, previous_running=running)
    started = [d for d in decisions if d.action is not Action.SKIP]
    assert len(started) <= 1
    assert all(d.reason for d in decisions if d.action is Action.SKIP)
    if started:
        assert started[0].slot is [slot for slot in result.slots if not slot.gap][-1]
        assert (started[0].action is Action.REPLACE) == running


# Instants a few days before spring-forward jumps: the EU (2026-03-29), the US
# (2026-03-08), Lord Howe (30 minutes, 2026-10-04), Samoa (a whole day, 2011-12-30).
JUMPS = st.sampled_from(
    [
        (BERLIN, _utc(2026, 3, 27)),
        ("America/New_York", _utc(2026, 3, 6)),
        ("Australia/Lord_Howe", _utc(2026, 10, 2)),
        ("Pacific/Apia", _utc(2011, 12, 28)),
    ]
)
GAP_SPECS = st.sampled_from(
    ["30 2 * * *", "*/15 2 * * *", "0 * * * *", "30 * * * *", "*/10 * * * *", "0 12 * * *"]
)


@settings(max_examples=150, deadline=None)
@given(
    spec=GAP_SPECS,
    jump=JUMPS,
    offset=st.integers(min_value=0, max_value=3 * 86400),
    steps=st.lists(st.integers(min_value=1, max_value=30 * 3600 * 10**6), min_size=1, max_size=8),
)
def test_consecutive_passes_handle_every_slot_once_gap_slots_included(
    spec: str, jump: tuple[str, datetime], offset: int, steps: list[int]
) -> None:
    """Passes of the firing loop, each from the previous one's ``now``: together they
    handle every slot of the schedule between the first cursor and the last ``now``
    once, in order. A gap slot lies in the second before its zone's jump, and it is
    handled by the first pass at or after it."""
    zone, near = jump
    s = schedule.parse(spec, timezone=zone)
    after = near + timedelta(seconds=offset)
    start = after
    handled: list[schedule.Slot] = []
    for step in steps:
        now = after + timedelta(microseconds=step)
        result = schedule.due(s, after, now, limit=10**6)
        handled += result.slots
        assert result.next_fire > now
        after = now
    expected = []
    for slot in schedule.slots(s, start + timedelta(microseconds=1)):
        if slot.at > after:
            break
        expected.append(slot)
    assert handled == expected
    for slot in handled:
        local = slot.at.astimezone(s.zone).replace(tzinfo=None)
        if slot.gap:
            later = (slot.at + timedelta(seconds=1)).astimezone(s.zone).replace(tzinfo=None)
            assert local < slot.local < later  # the zone's clock jumps over it
        else:
            assert local == slot.local


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
