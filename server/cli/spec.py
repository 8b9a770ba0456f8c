"""``sparkring apply``: job definitions kept in a TOML file, applied idempotently.

Three steps, so that nothing is applied unless everything is valid:

1. :func:`parse` reads the file against the schema (``docs/jobs.md``) and collects
   *every* error with its location (``jobs.clicks.kind: ...``), not just the first.
2. :func:`plan` compares each job with the catalog: ``create``, ``update`` (with the
   field diff of the revision it would make), ``unchanged``, and with ``prune`` the
   ``delete`` of jobs that carry the file's label but are no longer in it. Artifacts
   given as local paths are hashed: content already stored under that name is reused,
   only new content is uploaded. Artifacts given as ``NAME[:VERSION]`` must exist.
   Errors found here (unknown artifacts, a kind that would change) are collected too.
3. :func:`execute` uploads the new content, then creates, revises (``job_revisions.revise``),
   starts and stops the jobs in one transaction, and deletes pruned jobs once their
   owners have stopped them.

Applying a file twice changes nothing the second time: every job is ``unchanged``.
"""

from __future__ import annotations

import re
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from resource_center import catalog, deps, errors, store, validation
from scheduler import health_policy, job_revisions, job_spec, job_views, jobs, secrets
from sql import tables
from sql.states import Desired, JobKind

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TOP_KEYS = frozenset({"label", "jobs"})
JOB_KEYS = frozenset(
    {
        "kind",
        "resource",
        "py_files",
        "conf",
        "args",
        # The driver's variables, and those given a secret's value (docs/secrets.md).
        "env",
        "secret_env",
        # A pip requirements file (relative to the spec), built as job create builds it.
        "requirements",
        "master",
        "max_restarts",
        "max_retries",
        # A streaming job's restart window: a duration ("1h") or 0 (docs/drivers.md).
        "restart_window",
        # Streaming jobs: watch every update, roll it back if unhealthy (docs/jobs.md).
        "auto_rollback",
        "healthy_within",
        "desired",
        # A batch job's schedule (docs/schedules.md) and its policies.
        "schedule",
        "timezone",
        "misfire",
        "misfire_grace",
        "concurrency",
    }
)
SCHEDULE_POLICIES = ("timezone", "misfire", "misfire_grace", "concurrency")


class SpecError(Exception):
    """The file is invalid: ``errors`` lists every problem with its location."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Artifact:
    """A main artifact or py-file as the file gives it."""

    where: str  # its location in the file, for errors
    reference: str | None = None  # NAME[:VERSION]
    path: Path | None = None  # a local file (the value contains '/')

    @property
    def name(self) -> str:
        """The resource name: the reference's, or the file's name without its suffix."""
        if self.reference is not None:
            return self.reference.partition(":")[0]
        assert self.path is not None
        return self.path.stem


@dataclass(frozen=True)
class JobEntry:
    name: str
    kind: JobKind
    resource: Artifact
    py_files: tuple[Artifact, ...] = ()
    conf: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)
    requirements: Path | None = None
    master: str | None = None
    max_restarts: int = 3
    restart_window_s: float = job_spec.DEFAULT_RESTART_WINDOW_S
    desired: Desired = Desired.RUNNING
    schedule: Mapping[str, Any] | None = None  # schedule.Schedule.as_dict()
    auto_rollback: bool = False
    healthy_within_s: float = job_spec.DEFAULT_HEALTHY_WITHIN_S


@dataclass(frozen=True)
class Spec:
    source: Path
    label: str | None
    jobs: tuple[JobEntry, ...]


def _artifact(value: Any, where: str, base: Path, problems: list[str]) -> Artifact | None:
    if not isinstance(value, str) or not value:
        problems.append(f"{where}: must be a file path (with a '/') or NAME[:VERSION]")
        return None
    if "/" in value:
        path = (base / value).resolve()
        if not path.is_file():
            problems.append(f"{where}: no file {value!r} (paths are relative to the spec file)")
            return None
        if path.suffix.lower() not in validation.SUFFIXES:
            problems.append(
                f"{where}: {path.name!r} is not one of {', '.join(sorted(validation.SUFFIXES))}"
            )
            return None
        if not NAME.match(path.stem):
            problems.append(
                f"{where}: {path.name!r} cannot name a resource: {validation.NAME_RULE}"
            )
            return None
        return Artifact(where, path=path)
    try:
        validation.parse_reference(value)
    except errors.InvalidResource as exc:
        problems.append(f"{where}: {exc}")
        return None
    return Artifact(where, reference=value)


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


def _job(name: str, body: Any, base: Path, problems: list[str]) -> JobEntry | None:
    at = f"jobs.{name}"
    before = len(problems)
    if not NAME.match(name):
        problems.append(f"{at}: job name must be 1-128 letters, digits, '.', '_' or '-'")
    if not isinstance(body, dict):
        problems.append(f"{at}: must be a table")
        return None
    for key in sorted(set(body) - JOB_KEYS):
        problems.append(f"{at}.{key}: unknown key (known: {', '.join(sorted(JOB_KEYS))})")
    kind = body.get("kind", JobKind.STREAMING.value)
    if kind not in {k.value for k in JobKind}:
        problems.append(f"{at}.kind: must be 'streaming' or 'batch', not {kind!r}")
    desired = body.get("desired", Desired.RUNNING.value)
    if desired not in {d.value for d in Desired}:
        problems.append(f"{at}.desired: must be 'running' or 'stopped', not {desired!r}")
    resource = None
    if "resource" not in body:
        problems.append(f"{at}.resource: required (a file path or NAME[:VERSION])")
    else:
        resource = _artifact(body["resource"], f"{at}.resource", base, problems)
    py_files: list[Artifact] = []
    raw_py = body.get("py_files", [])
    if not isinstance(raw_py, list):
        problems.append(f"{at}.py_files: must be a list")
    else:
        for i, item in enumerate(raw_py):
            if (artifact := _artifact(item, f"{at}.py_files[{i}]", base, problems)) is not None:
                py_files.append(artifact)
    conf: dict[str, str] = {}
    raw_conf = body.get("conf", {})
    if not isinstance(raw_conf, dict):
        problems.append(f"{at}.conf: must be a table of KEY = VALUE")
    else:
        for key, value in raw_conf.items():
            text = _scalar(value)
            if text is None:
                problems.append(f"{at}.conf.{key}: must be a string, number or boolean")
            else:
                conf[key] = text
        try:
            health_policy.check(conf)
        except health_policy.PolicyError as exc:
            problems.append(f"{at}.conf: {exc}")
    requirements = _requirements(body.get("requirements"), at, base, problems)
    env = _string_table(body, "env", at, problems)
    secret_env = _string_table(body, "secret_env", at, problems)
    try:
        secrets.check_env(env, secret_env)
    except secrets.SecretError as exc:
        problems.append(f"{at}: {exc}")
    args = body.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        problems.append(f"{at}.args: must be a list of strings")
        args = []
    master = body.get("master")
    if master is not None and (not isinstance(master, str) or not master):
        problems.append(f"{at}.master: must be a non-empty string")
    budget = {key: body.get(key) for key in ("max_restarts", "max_retries")}
    for key, value in budget.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            problems.append(f"{at}.{key}: must be an integer, 0 or more")
            budget[key] = None
    max_restarts = 0
    if kind in set(JobKind):
        try:  # the kind's default; max_retries is the batch spelling (docs/jobs.md)
            max_restarts = job_spec.restart_budget(
                kind, budget["max_restarts"], budget["max_retries"]
            )
        except job_spec.JobError as exc:
            problems.append(f"{at}: {exc}")
    window = _restart_window(body.get("restart_window"), at, kind, problems)
    the_schedule = _schedule(body, at, kind, problems)
    auto_rollback, healthy_within = _auto_rollback(body, at, kind, problems)
    if len(problems) > before or resource is None:
        return None
    return JobEntry(
        name=name,
        kind=JobKind(kind),
        resource=resource,
        py_files=tuple(py_files),
        conf=conf,
        args=tuple(args),
        env=env,
        secret_env=secret_env,
        requirements=requirements,
        master=master,
        max_restarts=max_restarts,
        restart_window_s=window,
        desired=Desired(desired),
        schedule=the_schedule,
        auto_rollback=auto_rollback,
        healthy_within_s=healthy_within,
    )


def _requirements(value: Any, at: str, base: Path, problems: list[str]) -> Path | None:
    """``requirements``: a readable file, relative to the spec's folder."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        problems.append(f"{at}.requirements: must be the path of a requirements file")
        return None
    path = (base / value).resolve()
    try:
        deps.read_requirements(path)
    except deps.DepsError as exc:
        problems.append(f"{at}.requirements: {exc}")
        return None
    return path


def _deps_view(conn: sa.Connection, requirements: Path | None) -> dict[str, Any] | None:
    """The deps artifact a file's requirements name: the stored build, or a new one."""
    if requirements is None:
        return None
    name = deps.artifact_name(deps.read_requirements(requirements), deps.python_tag())
    version = conn.execute(
        sa.select(sa.func.max(tables.resources.c.version)).where(tables.resources.c.name == name)
    ).scalar_one_or_none()
    return {"name": name, "version": version if version is not None else "new"}


def _string_table(
    body: Mapping[str, Any], key: str, at: str, problems: list[str]
) -> dict[str, str]:
    """A table of KEY = "text" (``env``, ``secret_env``); a value that is not a string is
    refused by its key (a number or boolean is not guessed into text)."""
    raw = body.get(key, {})
    if not isinstance(raw, dict):
        problems.append(f'{at}.{key}: must be a table of KEY = "VALUE"')
        return {}
    table: dict[str, str] = {}
    for name, value in raw.items():
        if isinstance(value, str):
            table[name] = value
        else:
            problems.append(f"{at}.{key}.{name}: must be a string")
    return table


def _auto_rollback(
    body: Mapping[str, Any], at: str, kind: str, problems: list[str]
) -> tuple[bool, float]:
    """``auto_rollback`` (a boolean, default false) and ``healthy_within`` (a duration,
    default 5m): the job's auto-rollback setting, refused for a batch job."""
    enabled = body.get("auto_rollback", False)
    if not isinstance(enabled, bool):
        problems.append(f"{at}.auto_rollback: must be true or false")
        enabled = False
    seconds = job_spec.DEFAULT_HEALTHY_WITHIN_S
    value = body.get("healthy_within")
    if value is not None:
        if not isinstance(value, str):
            problems.append(f'{at}.healthy_within: must be a duration such as "5m"')
        else:
            try:
                seconds = job_spec.parse_healthy_within(value)
            except job_spec.JobError as exc:
                problems.append(f"{at}.healthy_within: {exc}")
    if kind in set(JobKind):
        try:
            job_spec.check_auto_rollback(kind, enabled, None)
        except job_spec.JobError as exc:
            problems.append(f"{at}.auto_rollback: {exc}")
    return enabled, seconds


def _restart_window(value: Any, at: str, kind: str, problems: list[str]) -> float:
    """``restart_window``: a duration string or 0; the kind's default when absent."""
    seconds: float | None = None
    if value is not None:
        if value == 0:
            seconds = 0.0
        elif isinstance(value, str):
            try:
                seconds = job_spec.parse_window(value)
            except job_spec.JobError as exc:
                problems.append(f"{at}.restart_window: {exc}")
        else:
            problems.append(f'{at}.restart_window: must be a duration such as "1h", or 0')
    if kind not in set(JobKind):
        return 0.0
    try:
        return job_spec.restart_window(kind, seconds)
    except job_spec.JobError as exc:
        problems.append(f"{at}.restart_window: {exc}")
        return 0.0


def _schedule(
    body: Mapping[str, Any], at: str, kind: str, problems: list[str]
) -> dict[str, Any] | None:
    """``schedule = "..."`` and its policies, checked (``scheduler/schedule.py``)."""
    from scheduler import schedule

    spec = body.get("schedule")
    if spec is None:
        problems.extend(f"{at}.{key}: needs schedule" for key in SCHEDULE_POLICIES if key in body)
        return None
    if kind != JobKind.BATCH:
        problems.append(f"{at}.schedule: a schedule is for batch jobs")
        return None
    values = {key: body.get(key) for key in ("schedule", *SCHEDULE_POLICIES)}
    bad = [key for key, value in values.items() if value is not None and not isinstance(value, str)]
    if bad:
        problems.extend(f"{at}.{key}: must be a string" for key in bad)
        return None
    try:
        return schedule.from_options(
            spec,
            timezone=values["timezone"],
            misfire=values["misfire"],
            misfire_grace=values["misfire_grace"],
            concurrency=values["concurrency"],
        )
    except schedule.ScheduleError as exc:
        problems.append(f"{at}.schedule: {exc}")
        return None


def parse(source: Path) -> Spec:
    """The spec in ``source``; :class:`SpecError` lists every problem found."""
    try:
        data = tomllib.loads(source.read_text())
    except OSError as exc:
        raise SpecError([f"{source}: cannot read: {exc.strerror}"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError([f"{source}: not valid TOML: {exc}"]) from None
    problems: list[str] = []
    for key in sorted(set(data) - TOP_KEYS):
        problems.append(f"{key}: unknown key (known: label, jobs)")
    label = data.get("label")
    if label is not None and (not isinstance(label, str) or not NAME.match(label)):
        problems.append("label: must be 1-128 letters, digits, '.', '_' or '-'")
    entries: list[JobEntry] = []
    raw_jobs = data.get("jobs", {})
    if not isinstance(raw_jobs, dict):
        problems.append("jobs: must be a table of [job_spec.NAME] tables")
        raw_jobs = {}
    for name, body in raw_jobs.items():
        if (entry := _job(name, body, source.parent, problems)) is not None:
            entries.append(entry)
    # One resource name must mean one content, or each apply would make a new version.
    contents: dict[str, tuple[Path, str]] = {}
    for entry in entries:
        for artifact in (entry.resource, *entry.py_files):
            if artifact.path is None:
                continue
            seen = contents.setdefault(artifact.name, (artifact.path, artifact.where))
            if seen[0] != artifact.path and catalog.file_sha256(seen[0]) != catalog.file_sha256(
                artifact.path
            ):
                problems.append(
                    f"{artifact.where}: {artifact.path} and {seen[0]} ({seen[1]}) are different "
                    f"files both named {artifact.name!r}"
                )
    if problems:
        raise SpecError([f"{source}: {p}" for p in problems])
    return Spec(source, label if isinstance(label, str) else None, tuple(entries))


@dataclass
class Resolved:
    """An artifact matched with the catalog: an existing version, or content to upload."""

    artifact: Artifact
    resource: catalog.Resource | None  # None: new content, uploaded by execute
    sha256: str | None = None

    def view(self) -> dict[str, Any]:
        if self.resource is not None:
            return {"name": self.resource.name, "version": self.resource.version}
        return {"name": self.artifact.name, "version": "new"}


@dataclass
class Step:
    action: str  # create | update | unchanged | delete
    job: str
    changes: list[str] = field(default_factory=list)  # field diff, desired, label
    entry: JobEntry | None = None
    main: Resolved | None = None
    py_files: list[Resolved] = field(default_factory=list)
    set_desired: bool = False  # the job's desired state becomes the file's


def _resolve(conn: sa.Connection, artifact: Artifact, problems: list[str]) -> Resolved | None:
    if artifact.reference is not None:
        ref = validation.parse_reference(artifact.reference)
        query = sa.select(tables.resources).where(tables.resources.c.name == ref.name)
        if ref.version is not None:
            query = query.where(tables.resources.c.version == ref.version)
        row = conn.execute(query.order_by(tables.resources.c.version.desc()).limit(1)).first()
        if row is None:
            problems.append(f"{artifact.where}: no resource {artifact.reference!r}")
            return None
        return Resolved(artifact, catalog.Resource(**row._mapping))
    assert artifact.path is not None
    sha256 = catalog.file_sha256(artifact.path)
    row = conn.execute(
        sa.select(tables.resources)
        .where(
            tables.resources.c.name == artifact.name,
            tables.resources.c.sha256 == sha256,
            tables.resources.c.filename == artifact.path.name,
        )
        .order_by(tables.resources.c.version.desc())
        .limit(1)
    ).first()
    return Resolved(artifact, None if row is None else catalog.Resource(**row._mapping), sha256)


def _target_view(
    conn: sa.Connection, entry: JobEntry, main: Resolved, py_files: list[Resolved]
) -> dict[str, Any]:
    return {
        "deps": _deps_view(conn, entry.requirements),
        "resource": main.view(),
        "py_files": [p.view() for p in py_files],
        "conf": dict(entry.conf),
        "args": list(entry.args),
        "env": dict(entry.env),
        "secret_env": dict(entry.secret_env),
        "spark_master": entry.master,
        "max_restarts": entry.max_restarts,
        "restart_window_s": entry.restart_window_s,
        "schedule": entry.schedule,
    }


def plan(conn: sa.Connection, spec: Spec, *, prune: bool) -> list[Step]:
    """What applying ``spec`` would do, job by job (nothing is written)."""
    problems: list[str] = []
    if prune and spec.label is None:
        problems.append("label: required with --prune (it names the jobs this file owns)")
    steps: list[Step] = []
    for entry in spec.jobs:
        main = _resolve(conn, entry.resource, problems)
        py_files = [_resolve(conn, a, problems) for a in entry.py_files]
        if main is None or any(p is None for p in py_files):
            continue
        resolved = [p for p in py_files if p is not None]
        target = _target_view(conn, entry, main, resolved)
        try:
            current = job_views.show(conn, entry.name)
        except job_spec.JobNotFound:
            steps.append(Step("create", entry.name, [], entry, main, resolved, set_desired=True))
            continue
        if current.kind != entry.kind:
            problems.append(
                f"jobs.{entry.name}.kind: the job is {current.kind}; a kind cannot change "
                "(delete the job first, or give the new one another name)"
            )
            continue
        changes = job_revisions.describe_changes(current.as_json(), target)
        # A scheduled job is wanted running when its schedule is on.
        desired = current.desired
        if current.schedule is not None:
            desired = Desired.RUNNING if current.schedule["active"] else Desired.STOPPED
        if desired != entry.desired:
            changes.append(f"desired {desired} -> {entry.desired}")
        if (setting := _setting_change(current.auto_rollback, entry)) is not None:
            changes.append(setting)
        if current.label != spec.label:
            changes.append(f"label {current.label or '(none)'} -> {spec.label or '(none)'}")
        action = "update" if changes else "unchanged"
        set_desired = desired != entry.desired
        steps.append(Step(action, entry.name, changes, entry, main, resolved, set_desired))
    if problems:
        raise SpecError([f"{spec.source}: {p}" for p in problems])
    if prune:
        named = {entry.name for entry in spec.jobs}
        left = conn.execute(
            sa.select(tables.jobs.c.name)
            .where(tables.jobs.c.label == spec.label)
            .order_by(tables.jobs.c.name)
        ).scalars()
        steps.extend(Step("delete", name) for name in left if name not in named)
    return steps


def _setting_text(enabled: bool, healthy_within_s: float) -> str:
    return (
        f"on (healthy within {job_revisions.window_text(healthy_within_s)})" if enabled else "off"
    )


def _setting_change(current: Mapping[str, Any], entry: JobEntry) -> str | None:
    """The plan's line for a changed auto-rollback setting, None if it is the same."""
    before = _setting_text(current["enabled"], current["healthy_within_s"])
    after = _setting_text(entry.auto_rollback, entry.healthy_within_s)
    # Off, the deadline is unused: a file that changes only it changes nothing shown.
    return None if before == after else f"auto_rollback {before} -> {after}"


def describe(step: Step) -> str:
    """One line of the plan."""
    if step.action == "create":
        assert step.entry is not None and step.main is not None
        ref = job_revisions.reference(step.main.view())
        extra = "" if step.entry.desired == Desired.RUNNING else ", stopped"
        return f"create    {step.job} ({step.entry.kind.value}, {ref}{extra})"
    if step.action == "update":
        return f"update    {step.job}: " + "; ".join(step.changes)
    return f"{step.action:<9} {step.job}"


def uploads(steps: list[Step]) -> list[Resolved]:
    """The new contents the plan uploads, once each."""
    out: dict[tuple[str, str], Resolved] = {}
    for step in steps:
        for item in (step.main, *step.py_files):
            if item is not None and item.resource is None:
                assert item.sha256 is not None
                out.setdefault((item.artifact.name, item.sha256), item)
    return list(out.values())


def execute(
    engine: sa.Engine,
    bucket: store.Store,
    spec: Spec,
    steps: list[Step],
    *,
    max_bytes: int,
    actor: str | None,
    stop_timeout: float = 120.0,
    say: Callable[[str], None] = lambda line: None,
) -> None:
    """Carry the plan out: uploads first (content-addressed, harmless if the rest fails),
    then every job change in one transaction, then the deletes of pruned jobs once
    their drivers have stopped (within ``stop_timeout`` seconds)."""
    stored: dict[tuple[str, str], catalog.Resource] = {}
    for item in uploads(steps):
        assert item.artifact.path is not None and item.sha256 is not None
        resource = catalog.upload(
            engine, bucket, name=item.artifact.name, path=item.artifact.path, max_bytes=max_bytes
        )
        stored[(item.artifact.name, item.sha256)] = resource
        say(f"uploaded  {resource.reference} ({item.artifact.path.name})")

    built: dict[Path, int] = {}
    for step in steps:
        entry = step.entry
        if step.action in ("create", "update") and entry and entry.requirements:
            if entry.requirements not in built:
                resource, _ = deps.ensure(engine, bucket, entry.requirements, max_bytes=max_bytes)
                built[entry.requirements] = resource.id
                say(f"deps      {resource.reference} ({entry.requirements.name})")

    def resource_id(item: Resolved) -> int:
        if item.resource is not None:
            return item.resource.id
        assert item.sha256 is not None
        return stored[(item.artifact.name, item.sha256)].id

    deletes = [step.job for step in steps if step.action == "delete"]
    with engine.begin() as conn:
        for step in steps:
            if step.action not in ("create", "update"):
                continue
            entry, main = step.entry, step.main
            assert entry is not None and main is not None
            definition = job_spec.Definition(
                resource_id=resource_id(main),
                py_file_ids=tuple(resource_id(p) for p in step.py_files),
                conf=dict(entry.conf),
                args=entry.args,
                env=dict(entry.env),
                secret_env=dict(entry.secret_env),
                deps_id=built.get(entry.requirements) if entry.requirements else None,
                spark_master=entry.master,
                max_restarts=entry.max_restarts,
                restart_window_s=entry.restart_window_s,
                schedule=entry.schedule,
            )
            if step.action == "create":
                jobs.create(
                    conn,
                    job_spec.JobSpec(
                        name=entry.name,
                        kind=entry.kind,
                        resource_id=definition.resource_id,
                        py_file_ids=definition.py_file_ids,
                        conf=definition.conf,
                        args=definition.args,
                        env=definition.env,
                        secret_env=definition.secret_env,
                        deps_id=definition.deps_id,
                        spark_master=definition.spark_master,
                        max_restarts=definition.max_restarts,
                        restart_window_s=definition.restart_window_s,
                        label=spec.label,
                        schedule=definition.schedule,
                        auto_rollback=entry.auto_rollback,
                        healthy_within_s=entry.healthy_within_s,
                    ),
                    actor=actor,
                )
            else:
                job_revisions.revise(
                    conn,
                    entry.name,
                    definition,
                    actor=actor,
                    auto_rollback=entry.auto_rollback,
                    healthy_within_s=entry.healthy_within_s,
                )
                job_revisions.set_label(conn, entry.name, spec.label)
            # Only a desired state that differs is set: a finished batch job whose
            # definition changed is not run again by an apply that leaves it running.
            if step.set_desired and entry.desired == Desired.RUNNING:
                jobs.start(conn, entry.name, actor=actor)
            elif step.set_desired:
                jobs.stop(conn, entry.name, actor=actor)
        for name in deletes:
            jobs.stop(conn, name, actor=actor)
    deadline = time.monotonic() + stop_timeout
    for name in deletes:
        while True:
            try:
                with engine.begin() as conn:
                    jobs.delete(conn, name, actor=actor)
                break
            except job_spec.JobNotFound:
                break
            except job_spec.JobConflict:
                if time.monotonic() >= deadline:
                    raise job_spec.JobConflict(
                        f"job {name!r} is still stopping after {stop_timeout:g} s; "
                        "apply again to delete it"
                    ) from None
                time.sleep(0.5)
