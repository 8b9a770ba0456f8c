"""What a job is defined from: its spec (``JobSpec``), a revision's definition
(``Definition``), the change ``job update`` makes (``Change``), the options that type them
(restart budget and window, auto-rollback deadline, conf and env pairs) and the checks
every command makes before it writes one. The errors the job commands raise are here too,
so the modules above them (life, revisions, views) share one set."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from scheduler import health_policy, secrets
from scheduler.schedule import ScheduleError, format_duration, parse_duration
from sql.states import JobKind

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# Restarts after the job's own driver failed (exited nonzero), per kind, when the
# command gives none: a streaming job is restarted (its checkpoint makes a restart
# safe); a batch job is retried only when asked (``--max-retries``): whether running a
# batch again after it failed half-way is safe, only its author knows. One column,
# ``jobs.max_restarts``, holds both: a batch job's retries are its restarts.
DEFAULT_MAX_RESTARTS: dict[JobKind, int] = {JobKind.STREAMING: 3, JobKind.BATCH: 0}
# A streaming job is FAILED only when more than max_restarts crashes fall inside one
# window of this many seconds (scheduler/distribution/ends.py IN_WINDOW): a crash a month ago
# does not count against one today. An hour: a crash loop (restarts 10-60 s apart with
# backoff) still ends FAILED within minutes; a job that crashes once a day runs for
# ever. 0: every crash since the last start counts. A batch job's retries are counted
# per run, so it has none.
DEFAULT_RESTART_WINDOW_S = 3600.0
MAX_RESTART_WINDOW_S = 366 * 86400.0  # a year: longer is "no window" (0)
# Auto-rollback (scheduler/auto_rollback.py): how long an update of a job with the
# setting on is watched when the command gives no --healthy-within: five minutes, room
# for a Spark cold start (40-90 s here) and a few micro-batches. At most a week.
DEFAULT_HEALTHY_WITHIN_S = 300.0
MAX_HEALTHY_WITHIN_S = 7 * 86400.0


class JobError(Exception):
    """An operator command cannot be done; the message says why in one line."""


class JobNotFound(JobError):
    """No job has that name (the HTTP API answers 404)."""


class JobConflict(JobError):
    """The command clashes with the job's current state or name (the HTTP API: 409)."""


class RestartBudgetSpent(JobConflict):
    """An automatic restart was refused: the run's ``restarts`` reached ``max_restarts``."""


@dataclass(frozen=True)
class JobSpec:
    name: str
    kind: JobKind
    resource_id: int
    py_file_ids: Sequence[int] = ()
    conf: Mapping[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()
    # The driver's environment variables, and those it gets from secrets (variable ->
    # secret name, scheduler/secrets.py).
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)
    # The zip of the packages it imports (resource_center/deps.py); None: none.
    deps_id: int | None = None
    spark_master: str | None = None
    # None: the kind's default (DEFAULT_MAX_RESTARTS). For a batch job: its retries.
    max_restarts: int | None = None
    # None: the kind's default (DEFAULT_RESTART_WINDOW_S for streaming, 0 for batch).
    restart_window_s: float | None = None
    label: str | None = None  # the spec file's label (sparkring apply)
    # A batch job's schedule (scheduler/schedule.py ``Schedule.as_dict``); None: none.
    schedule: Mapping[str, Any] | None = None
    # Watch every update that rolls the job (streaming only; scheduler/auto_rollback.py)
    # for ``healthy_within_s`` (None: DEFAULT_HEALTHY_WITHIN_S).
    auto_rollback: bool = False
    healthy_within_s: float | None = None


def restart_budget(
    kind: JobKind | str, max_restarts: int | None = None, max_retries: int | None = None
) -> int:
    """The ``max_restarts`` a new job gets from the command's options.

    ``--max-retries`` is the batch spelling of the same budget: giving it for a
    streaming job, or giving both, is refused by name (nothing is guessed)."""
    kind = JobKind(kind)
    if max_retries is not None:
        if kind is not JobKind.BATCH:
            raise JobError("--max-retries is for batch jobs; a streaming job takes --max-restarts")
        if max_restarts is not None:
            raise JobError("give --max-retries or --max-restarts, not both (they are one budget)")
        max_restarts = max_retries
    if max_restarts is None:
        return DEFAULT_MAX_RESTARTS[kind]
    if max_restarts < 0:
        option = "--max-retries" if max_retries is not None else "--max-restarts"
        raise JobError(f"{option} must be 0 or more, not {max_restarts}")
    return max_restarts


def parse_window(text: str) -> float:
    """A restart window as typed (``--restart-window``, a spec's ``restart_window``): a
    duration such as ``1h`` or ``30m``, or ``0`` for none."""
    if text.strip() in ("0", "0s"):
        return 0.0
    try:
        return parse_duration(text)
    except ScheduleError as exc:
        raise JobError(str(exc)) from None


def parse_healthy_within(text: str) -> float:
    """An auto-rollback deadline as typed (``--healthy-within``, a spec's
    ``healthy_within``): a duration such as ``5m``; refused out of range."""
    try:
        seconds = parse_duration(text)
    except ScheduleError as exc:
        raise JobError(str(exc)) from None
    check_auto_rollback(JobKind.STREAMING, None, seconds)
    return seconds


def restart_window(kind: JobKind | str, seconds: float | None) -> float:
    """The ``restart_window_s`` a job of ``kind`` gets: the default for None; a window
    on a batch job, or a negative one, is refused by name."""
    kind = JobKind(kind)
    if seconds is None:
        return DEFAULT_RESTART_WINDOW_S if kind is JobKind.STREAMING else 0.0
    if not 0 <= seconds <= MAX_RESTART_WINDOW_S:
        raise JobError(
            f"--restart-window must be 0 (none) to {MAX_RESTART_WINDOW_S:g} s (a year), "
            f"not {seconds:g} s"
        )
    if kind is JobKind.BATCH and seconds > 0:
        raise JobError(
            "--restart-window is for streaming jobs: a batch job's retries are counted per run"
        )
    return float(seconds)


def check_auto_rollback(
    kind: JobKind | str, enabled: bool | None, healthy_within_s: float | None
) -> None:
    """Refuse auto-rollback on a batch job (a batch run that ends is not a revision that
    proved unhealthy: its retries are the remedy) and a deadline out of range, by name."""
    if enabled and JobKind(kind) is not JobKind.STREAMING:
        raise JobError(
            "--auto-rollback is for streaming jobs: a batch run is retried "
            "(--max-retries), and 'job rollback' undoes its update by hand"
        )
    if healthy_within_s is not None and not 0 < healthy_within_s <= MAX_HEALTHY_WITHIN_S:
        raise JobError(
            "--healthy-within must be more than 0 and at most "
            f"{format_duration(MAX_HEALTHY_WITHIN_S)}, not {healthy_within_s:g} s"
        )


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    """``K=V`` strings to a dict; a malformed pair is refused by name."""
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise JobError(f"--conf {pair!r} is not KEY=VALUE")
        conf[key.strip()] = value
    return conf


def parse_env(pairs: Sequence[str], option: str) -> dict[str, str]:
    """``--env`` or ``--secret-env`` pairs to a dict; refused by name (never a value)."""
    try:
        return secrets.parse_pairs(pairs, option)
    except secrets.SecretError as exc:
        raise JobError(str(exc)) from None


# A revision's fields, in the order history and diffs name them.
FIELDS = (
    "resource",
    "py_files",
    "conf",
    "args",
    "env",
    "secret_env",
    "requirements",
    "master",
    "max_restarts",
    "restart_window",
    "schedule",
)


@dataclass(frozen=True)
class Definition:
    """One revision of a job: what its driver is started from, and its restart budget."""

    resource_id: int
    py_file_ids: tuple[int, ...] = ()
    conf: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)
    deps_id: int | None = None
    spark_master: str | None = None
    max_restarts: int = 3
    restart_window_s: float = DEFAULT_RESTART_WINDOW_S
    schedule: Mapping[str, Any] | None = None  # Schedule.as_dict(); None: unscheduled

    @classmethod
    def of(cls, spec: JobSpec) -> Definition:
        return cls(
            resource_id=spec.resource_id,
            py_file_ids=tuple(spec.py_file_ids),
            conf=dict(spec.conf),
            args=tuple(spec.args),
            env=dict(spec.env),
            secret_env=dict(spec.secret_env),
            deps_id=spec.deps_id,
            spark_master=spec.spark_master,
            max_restarts=restart_budget(spec.kind, spec.max_restarts),
            restart_window_s=restart_window(spec.kind, spec.restart_window_s),
            schedule=dict(spec.schedule) if spec.schedule else None,
        )

    def changed_from(self, before: Definition) -> list[str]:
        """The names (of :data:`FIELDS`) of the fields that differ from ``before``."""
        pairs = {
            "resource": (self.resource_id, before.resource_id),
            "py_files": (tuple(self.py_file_ids), tuple(before.py_file_ids)),
            "conf": (dict(self.conf), dict(before.conf)),
            "args": (tuple(self.args), tuple(before.args)),
            "env": (dict(self.env), dict(before.env)),
            "secret_env": (dict(self.secret_env), dict(before.secret_env)),
            "requirements": (self.deps_id, before.deps_id),
            "master": (self.spark_master, before.spark_master),
            "max_restarts": (self.max_restarts, before.max_restarts),
            "restart_window": (self.restart_window_s, before.restart_window_s),
            "schedule": (self.schedule, before.schedule),
        }
        return [name for name in FIELDS if pairs[name][0] != pairs[name][1]]


@dataclass(frozen=True)
class Change:
    """What ``job update`` changes; a field left ``None`` stays as it is."""

    resource_id: int | None = None
    py_file_ids: Sequence[int] | None = None  # replaces the list; () clears it
    conf: Mapping[str, str] = field(default_factory=dict)  # keys set (others kept)
    unset_conf: Sequence[str] = ()  # keys removed
    args: Sequence[str] | None = None  # replaces the list; () clears it
    env: Mapping[str, str] = field(default_factory=dict)  # variables set (others kept)
    unset_env: Sequence[str] = ()  # variables removed
    secret_env: Mapping[str, str] = field(default_factory=dict)  # variable -> secret name
    unset_secret_env: Sequence[str] = ()
    deps_id: int | None = None  # new dependencies (a deps zip's resource id)
    clear_deps: bool = False  # --no-requirements
    spark_master: str | None = None  # "" = back to the server's SPARKRING_SPARK_MASTER
    max_restarts: int | None = None
    restart_window_s: float | None = None
    schedule: Mapping[str, Any] | None = None  # a new schedule (Schedule.as_dict())
    clear_schedule: bool = False  # --no-schedule

    def applied_to(self, current: Definition) -> Definition:
        """``current`` with this change; a key to unset that is not set is refused."""
        if self.max_restarts is not None and self.max_restarts < 0:
            raise JobError("--max-restarts must be 0 or more")
        if self.restart_window_s is not None and not (
            0 <= self.restart_window_s <= MAX_RESTART_WINDOW_S
        ):
            raise JobError(
                f"--restart-window must be 0 (none) to {MAX_RESTART_WINDOW_S:g} s (a year), "
                f"not {self.restart_window_s:g} s"
            )
        conf = _merged(current.conf, self.conf, self.unset_conf, "conf key")
        env = _merged(current.env, self.env, self.unset_env, "--env variable")
        secret_env = _merged(
            current.secret_env, self.secret_env, self.unset_secret_env, "--secret-env variable"
        )
        if self.clear_schedule and self.schedule is not None:
            raise JobError("give --schedule or --no-schedule, not both")
        if self.clear_deps and self.deps_id is not None:
            raise JobError("give --requirements or --no-requirements, not both")
        deps_id = None if self.clear_deps else (self.deps_id or current.deps_id)
        schedule = current.schedule
        if self.clear_schedule:
            schedule = None
        elif self.schedule is not None:
            schedule = dict(self.schedule)
        master = current.spark_master
        if self.spark_master is not None:
            master = self.spark_master or None
        return Definition(
            resource_id=current.resource_id if self.resource_id is None else self.resource_id,
            py_file_ids=(
                current.py_file_ids if self.py_file_ids is None else tuple(self.py_file_ids)
            ),
            conf=conf,
            args=current.args if self.args is None else tuple(self.args),
            env=env,
            secret_env=secret_env,
            deps_id=deps_id,
            spark_master=master,
            max_restarts=current.max_restarts if self.max_restarts is None else self.max_restarts,
            restart_window_s=(
                current.restart_window_s
                if self.restart_window_s is None
                else float(self.restart_window_s)
            ),
            schedule=schedule,
        )


def _merged(
    current: Mapping[str, str], setting: Mapping[str, str], unsetting: Sequence[str], what: str
) -> dict[str, str]:
    """``current`` with ``setting`` set and ``unsetting`` removed (``--conf`` and
    ``--unset-conf``, ``--env`` and ``--unset-env``, the secret ones); a key to unset that
    is not set is refused, naming ``what`` it is."""
    merged = dict(current)
    for key in unsetting:
        if key in setting:
            raise JobError(f"{what} {key!r} is both set and unset")
        if merged.pop(key, None) is None:
            raise JobConflict(f"{what} {key!r} is not set, so it cannot be unset")
    merged.update(setting)
    return merged


def check_health_conf(conf: Mapping[str, str]) -> None:
    try:
        health_policy.check(conf)
    except health_policy.PolicyError as exc:
        raise JobError(str(exc)) from None


def check_env(conn: sa.Connection, env: Mapping[str, str], secret_env: Mapping[str, str]) -> None:
    """Refuse variables a job may not set and secrets that do not exist, by name."""
    try:
        secrets.check_env(env, secret_env)
    except secrets.SecretError as exc:
        raise JobError(str(exc)) from None
    absent = secrets.missing(conn, secret_env.values())
    if absent:
        raise JobError(
            f"no secret named {', '.join(map(repr, absent))} "
            "(create it first: sparkring secret create NAME --from-file FILE)"
        )


def check_schedule_kind(kind: JobKind | str, schedule: Mapping[str, Any] | None) -> None:
    if schedule is not None and JobKind(kind) is not JobKind.BATCH:
        raise JobError("a schedule is for batch jobs; a streaming job runs until stopped")
