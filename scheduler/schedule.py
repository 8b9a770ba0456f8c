"""A job's schedule: its spec, its fire times, and what to do with a due fire. Pure.

A schedule (:class:`Schedule`) is a SPEC, a time zone and two policies:

- SPEC: a 5-field cron expression (``30 2 * * *``); a 6-field one whose first field is
  seconds (``*/10 * * * * *``); ``@every DURATION`` (``@every 5s``, ``@every 1h30m``;
  1 s or more); or ``@hourly``, ``@daily``, ``@weekly``, ``@monthly``. Cron fields are
  parsed and iterated by croniter (docs/schedules.md says why that library).
- the zone (IANA name, default ``UTC``): cron fields are local wall-clock times there.
  ``@every`` ignores it: its fires are the multiples of the duration since the Unix
  epoch, in UTC (``@every 5s`` fires at :00, :05, ...), so every server computes the same
  fire times without remembering when the schedule began.
- ``misfire``: ``run-once`` (default) or ``skip``; ``misfire_grace`` (seconds, 1 h).
- ``concurrency``: ``forbid`` (default) or ``replace``.

Fire times (:func:`slots`) are UTC instants, strictly increasing. Local times the zone
skips (a DST gap: 02:30 on the spring-forward day in Europe/Berlin) are *gap slots*:
no fire, recorded skipped. Each has an instant too, within the second before the jump
over it (:func:`gap_instant`), so it is due, and fenced by its run row, like any slot.
A local time the zone repeats (the fall-back hour) fires once, at its first occurrence.

Decisions (:func:`decide`) are pure functions of the due slots, PostgreSQL's ``now``
and whether the previous run is still running: which slot runs, which is recorded
skipped and why. Nothing here reads a clock: callers pass PostgreSQL's time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

if TYPE_CHECKING:
    from croniter import croniter

# A run-once misfire runs the latest missed fire if it is at most this late, seconds.
DEFAULT_MISFIRE_GRACE_S = 3600.0
# A fire handled at most this late is on time (not a misfire), seconds: the firing
# loop wakes about once a second, a busy PostgreSQL may add a few.
ON_TIME_S = 15.0
# At most this many due slots are handled (recorded) in one pass; older ones beyond it
# after a long outage are not recorded (docs/schedules.md).
MAX_DUE_SLOTS = 1000

SHORTCUTS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(?:\d+[smhd])+$")
_PART = re.compile(r"(\d+)([smhd])")


def _croniter() -> type[croniter]:
    """croniter, imported when a cron field is parsed or iterated: a job command that
    only lists jobs never needs it (tests/integration/test_cli_startup.py)."""
    from croniter import croniter

    return croniter


class ScheduleError(ValueError):
    """A schedule cannot be used; the message names the problem in one line."""


class Misfire(StrEnum):
    RUN_ONCE = "run-once"  # the latest missed fire within the grace runs, late
    SKIP = "skip"  # every missed fire is recorded skipped


class Concurrency(StrEnum):
    FORBID = "forbid"  # a fire while the previous run runs is recorded skipped
    REPLACE = "replace"  # the previous run is stopped, the fire's run starts


class Action(StrEnum):
    RUN = "run"  # the fire's run starts (the job becomes pending)
    REPLACE = "replace"  # the previous run is stopped, then the fire's run starts
    SKIP = "skip"  # recorded skipped, with a reason


class SkipReason(StrEnum):
    MISFIRE = "misfire"  # handled too late (cluster down, PostgreSQL away)
    STILL_RUNNING = "previous run still running"  # concurrency forbid
    DST_GAP = "dst-gap"  # the local time does not exist in the zone


def parse_duration(text: str) -> float:
    """``90s``, ``5m``, ``1h30m``, ``2d`` -> seconds; anything else is refused."""
    compact = text.strip().replace(" ", "")
    if not _DURATION.match(compact):
        raise ScheduleError(
            f"duration {text!r} is not a number with a unit (s, m, h, d), e.g. 30s, 5m, 1h30m"
        )
    return float(sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(compact)))


def format_duration(seconds: float) -> str:
    """Seconds -> the shortest ``1h30m`` form (inverse of :func:`parse_duration`)."""
    left, parts = int(seconds), []
    for unit in ("d", "h", "m", "s"):
        count, left = divmod(left, _UNITS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


@dataclass(frozen=True)
class Schedule:
    spec: str
    timezone: str = "UTC"
    misfire: Misfire = Misfire.RUN_ONCE
    misfire_grace: float = DEFAULT_MISFIRE_GRACE_S
    concurrency: Concurrency = Concurrency.FORBID

    @property
    def every(self) -> float | None:
        """The period of an ``@every`` schedule, seconds; None for a cron one."""
        if self.spec.startswith("@every"):
            return parse_duration(self.spec.removeprefix("@every"))
        return None

    @property
    def cron(self) -> tuple[str, bool]:
        """The cron expression and whether its first field is seconds."""
        expression = SHORTCUTS.get(self.spec, self.spec)
        return expression, len(expression.split()) == 6

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def as_dict(self) -> dict[str, object]:
        """As stored (``jobs.schedule``) and shown (``job show --json``)."""
        return {
            "spec": self.spec,
            "timezone": self.timezone,
            "misfire": self.misfire.value,
            "misfire_grace_s": self.misfire_grace,
            "concurrency": self.concurrency.value,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Schedule:
        return parse(
            str(data["spec"]),
            timezone=str(data.get("timezone") or "UTC"),
            misfire=str(data.get("misfire") or Misfire.RUN_ONCE),
            misfire_grace=float(data.get("misfire_grace_s") or DEFAULT_MISFIRE_GRACE_S),  # type: ignore[arg-type]
            concurrency=str(data.get("concurrency") or Concurrency.FORBID),
        )


def parse(
    spec: str,
    *,
    timezone: str = "UTC",
    misfire: str = Misfire.RUN_ONCE,
    misfire_grace: float = DEFAULT_MISFIRE_GRACE_S,
    concurrency: str = Concurrency.FORBID,
) -> Schedule:
    """A checked :class:`Schedule`; every problem is refused by name (ScheduleError)."""
    spec = " ".join(spec.split())
    if spec.startswith("@every"):
        period = parse_duration(spec.removeprefix("@every")) if spec != "@every" else 0.0
        if period < 1:
            raise ScheduleError(f"schedule {spec!r}: @every needs a duration of 1s or more")
        spec = f"@every {format_duration(period)}"
    elif spec.startswith("@"):
        if spec not in SHORTCUTS:
            names = ", ".join([*SHORTCUTS, "@every DURATION"])
            raise ScheduleError(f"schedule {spec!r} is not one of {names}")
    else:
        fields = spec.split()
        if len(fields) not in (5, 6):
            raise ScheduleError(
                f"schedule {spec!r} has {len(fields)} fields: a cron expression has 5 "
                "(minute hour day month weekday) or 6 (seconds first)"
            )
        if not _croniter().is_valid(spec, second_at_beginning=len(fields) == 6):
            raise ScheduleError(f"schedule {spec!r} is not a valid cron expression")
        try:  # a valid expression may still name no day that exists (0 0 31 2 *)
            _croniter()(spec, datetime.now(UTC), second_at_beginning=len(fields) == 6).get_next(
                datetime
            )
        except Exception:  # croniter's CroniterBadDateError, and whatever else it raises
            raise ScheduleError(
                f"schedule {spec!r} never fires: no date matches it (e.g. 31 February)"
            ) from None
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"time zone {timezone!r} is unknown (an IANA name, e.g. UTC)") from None
    try:
        misfire_policy = Misfire(misfire)
    except ValueError:
        raise ScheduleError(f"--misfire {misfire!r} is not run-once or skip") from None
    try:
        concurrency_policy = Concurrency(concurrency)
    except ValueError:
        raise ScheduleError(f"--concurrency {concurrency!r} is not forbid or replace") from None
    if misfire_grace < 0:
        raise ScheduleError("--misfire-grace must be 0 or more")
    return Schedule(spec, timezone, misfire_policy, float(misfire_grace), concurrency_policy)


def from_options(
    spec: str | None,
    *,
    timezone: str | None = None,
    misfire: str | None = None,
    misfire_grace: str | None = None,
    concurrency: str | None = None,
    current: Mapping[str, object] | None = None,
) -> dict[str, object] | None:
    """The schedule (``Schedule.as_dict``) that command options give: ``spec`` and the
    policies, each over ``current``'s (a ``job update``: what is not given is kept);
    None when neither gives a SPEC. ``misfire_grace`` is a duration (``30m``)."""
    policies = {
        "--timezone": timezone,
        "--misfire": misfire,
        "--misfire-grace": misfire_grace,
        "--concurrency": concurrency,
    }
    base = dict(current or {})
    if spec is None and not base:
        given = [name for name, value in policies.items() if value is not None]
        if given:
            raise ScheduleError(f"{', '.join(given)} needs --schedule SPEC")
        return None
    grace = (
        parse_duration(misfire_grace)
        if misfire_grace is not None
        else float(base.get("misfire_grace_s", DEFAULT_MISFIRE_GRACE_S))  # type: ignore[arg-type]
    )
    return parse(
        spec if spec is not None else str(base["spec"]),
        timezone=timezone or str(base.get("timezone", "UTC")),
        misfire=misfire or str(base.get("misfire", Misfire.RUN_ONCE)),
        misfire_grace=grace,
        concurrency=concurrency or str(base.get("concurrency", Concurrency.FORBID)),
    ).as_dict()


@dataclass(frozen=True)
class Slot:
    """One fire time of a schedule, or a local time its zone skips (a gap slot)."""

    at: datetime  # UTC; for a gap slot, an instant of the jump over it (gap_instant)
    local: datetime  # the local wall-clock time (naive), for messages
    gap: bool = False  # the local time does not exist: no fire, recorded skipped


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    """The zone's wall-clock time (naive) at ``instant``."""
    return instant.astimezone(zone).replace(tzinfo=None)


def _local_to_utc(naive: datetime, zone: ZoneInfo) -> datetime | None:
    """The first UTC instant with this wall-clock time in ``zone``; None in a gap."""
    instant = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if _wall(instant, zone) != naive:
        return None
    return instant


def jump_over(naive: datetime, zone: ZoneInfo) -> datetime:
    """The instant at which the zone's clock jumps over ``naive`` (a local time in a
    gap): the first whole second whose wall-clock time is past it."""
    # In a gap, fold=1 reads it with the offset after the jump (an instant before it)
    # and fold=0 with the offset before (an instant after it).
    before = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    after = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    while after - before > timedelta(seconds=1):
        middle = before + timedelta(seconds=(after - before) // timedelta(seconds=2))
        if _wall(middle, zone) > naive:
            after = middle
        else:
            before = middle
    return after


def gap_instant(naive: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant a gap slot stands for (its ``scheduled_time``): the jump over
    it, less one microsecond per second from it to the gap's end. So each local time of
    one gap has its own instant, in order, within the second before the jump, where no
    fire time is (fire times are whole seconds; a gap is at most a day)."""
    jump = jump_over(naive, zone)
    to_end = int((_wall(jump, zone) - naive).total_seconds())
    return jump - timedelta(microseconds=min(to_end, 999_999))


def _slot(local: datetime, zone: ZoneInfo) -> Slot:
    at = _local_to_utc(local, zone)
    if at is None:
        return Slot(gap_instant(local, zone), local, gap=True)
    return Slot(at, local)


def slots(schedule: Schedule, start: datetime) -> Iterator[Slot]:
    """The schedule's slots at or after ``start`` (aware), in order, without end."""
    start = start.astimezone(UTC)
    period = schedule.every
    if period is not None:
        step = timedelta(seconds=period)
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        count = -((epoch - start) // step)  # ceil((start - epoch) / step)
        at = epoch + count * step
        while True:
            yield Slot(at, at.replace(tzinfo=None))
            at += step
    expression, with_seconds = schedule.cron
    zone = schedule.zone
    # One second back: croniter yields times strictly after its start.
    it = _croniter()(
        expression, _wall(start, zone) - timedelta(seconds=1), second_at_beginning=with_seconds
    )
    while True:
        slot = _slot(it.get_next(datetime), zone)
        if slot.at >= start:
            yield slot


def next_fire(schedule: Schedule, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (gap slots are no fires)."""
    for slot in slots(schedule, after + timedelta(microseconds=1)):
        if not slot.gap:
            return slot.at
    raise AssertionError("unreachable: slots never ends")


@dataclass(frozen=True)
class Due:
    """The slots due at ``now`` and the first fire time after ``now``."""

    slots: tuple[Slot, ...]
    next_fire: datetime
    truncated: bool = False  # more than the limit were due: the oldest are not handled


def due(schedule: Schedule, after: datetime, now: datetime, limit: int = MAX_DUE_SLOTS) -> Due:
    """The slots strictly after ``after`` (every slot up to it was handled) and at or
    before ``now``: at most ``limit``, the latest; and the first fire time after ``now``.
    A gap slot is due once its instant (:func:`gap_instant`) is past, as any slot."""
    start, truncated = after + timedelta(microseconds=1), False
    while True:
        found: list[Slot] = []
        for slot in slots(schedule, start):
            if slot.at > now:
                if slot.gap:
                    continue  # not yet due, and no fire: the next fire comes after it
                return Due(tuple(found[-limit:]), slot.at, truncated)
            found.append(slot)
            if len(found) > 2 * limit and not truncated:
                break  # a long outage: start again about ``limit`` fires before now
        else:
            raise AssertionError("unreachable: slots never ends")
        start, truncated = max(start, _jump_back(schedule, now, limit)), True


def _jump_back(schedule: Schedule, now: datetime, limit: int) -> datetime:
    """A time about ``limit`` fires before ``now``."""
    period = schedule.every
    if period is not None:
        return now - timedelta(seconds=period * limit)
    expression, with_seconds = schedule.cron
    zone = schedule.zone
    it = _croniter()(
        expression, now.astimezone(zone).replace(tzinfo=None), second_at_beginning=with_seconds
    )
    local = now.astimezone(zone).replace(tzinfo=None)
    for _ in range(limit):
        local = it.get_prev(datetime)
    return local.replace(tzinfo=zone).astimezone(UTC)


@dataclass(frozen=True)
class Decision:
    slot: Slot
    action: Action
    reason: str | None = None  # for a skip: a SkipReason value, with detail for dst-gap


def gap_reason(slot: Slot, timezone: str) -> str:
    return f"{SkipReason.DST_GAP}: {slot.local:%Y-%m-%d %H:%M:%S} does not exist in {timezone}"


def decide(
    schedule: Schedule,
    due_slots: Sequence[Slot],
    now: datetime,
    *,
    previous_running: bool,
    on_time: float = ON_TIME_S,
) -> list[Decision]:
    """What happens to each due slot, oldest first.

    Only the latest existing slot may run: every earlier one was missed (recorded
    ``misfire``). The latest runs when it is on time (at most ``on_time`` late), or,
    under ``run-once``, when it is at most ``misfire_grace`` late; else it is a misfire
    too. A slot that would run while the previous run is still running is recorded
    ``previous run still running`` under ``forbid``, and replaces it under ``replace``.
    Gap slots are recorded ``dst-gap``."""
    existing = [slot for slot in due_slots if not slot.gap]
    latest = existing[-1] if existing else None
    decisions: list[Decision] = []
    for slot in due_slots:
        if slot.gap:
            decisions.append(Decision(slot, Action.SKIP, gap_reason(slot, schedule.timezone)))
        elif slot is not latest or not _in_time(schedule, slot.at, now, on_time):
            decisions.append(Decision(slot, Action.SKIP, SkipReason.MISFIRE.value))
        else:
            decisions.append(_concurrency(schedule, slot, previous_running))
    return decisions


def _in_time(schedule: Schedule, at: datetime, now: datetime, on_time: float) -> bool:
    late = (now - at).total_seconds()
    if late <= on_time:
        return True
    return schedule.misfire is Misfire.RUN_ONCE and late <= schedule.misfire_grace


def _concurrency(schedule: Schedule, slot: Slot, previous_running: bool) -> Decision:
    if not previous_running:
        return Decision(slot, Action.RUN)
    if schedule.concurrency is Concurrency.REPLACE:
        return Decision(slot, Action.REPLACE)
    return Decision(slot, Action.SKIP, SkipReason.STILL_RUNNING.value)


def iso(at: datetime) -> str:
    """ISO-8601 UTC with Z (``2026-11-25T20:00:05Z``; microseconds when present)."""
    text = at.astimezone(UTC).replace(tzinfo=None).isoformat()
    return text + "Z"
