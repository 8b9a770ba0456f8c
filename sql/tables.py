"""Every table of sparkring, declared once.

Alembic migrations in ``sql/migrations`` must rebuild exactly this schema; a test
compares the two. Constraints make bad rows unrepresentable: a job pins an existing
resource version, a lease exists only with an owner, states are from a fixed set.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from sql import states

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# Names of job kinds, desired states, run states and event kinds, as stored: derived from
# the enums of sql/states.py (their meanings and legal transitions live there).
JOB_KINDS = tuple(kind.value for kind in states.JobKind)
DESIRED_STATES = tuple(desired.value for desired in states.Desired)
RUN_STATES = tuple(state.value for state in states.RunState)
EVENT_KINDS = tuple(kind.value for kind in states.EventKind)
HEALTH_FLAGS = tuple(flag.value for flag in states.HealthFlag)
SERVER_NAME = r"^[A-Za-z0-9._-]{1,64}$"


def _timestamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


resources = sa.Table(
    "resources",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("object_key", sa.Text, nullable=False),
    # Original file name's suffix decides how spark-submit receives it (.py, .zip, .jar).
    sa.Column("filename", sa.Text, nullable=False),
    _timestamp("created_at"),
    sa.UniqueConstraint("name", "version", name="uq_resources_name_version"),
    sa.CheckConstraint("version > 0", name="version_positive"),
    sa.CheckConstraint("size >= 0", name="size_not_negative"),
    sa.CheckConstraint("sha256 ~ '^[0-9a-f]{64}$'", name="sha256_hex"),
    sa.CheckConstraint(r"name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'", name="name_charset"),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("kind", sa.Text, nullable=False),
    # The main artifact, pinned to one version; RESTRICT makes a referenced version
    # undeletable (S5).
    sa.Column(
        "resource_id",
        sa.BigInteger,
        sa.ForeignKey("resources.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    sa.Column("conf", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("args", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    # The driver's environment variables (name -> value), and those whose value is a
    # secret's (name -> secret name; scheduler/secrets.py).
    sa.Column("env", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("secret_env", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    # The packages the job imports, built from a requirements file (resource_center/deps.py):
    # a zip artifact pinned like the main one; NULL: none.
    sa.Column(
        "deps_id", sa.BigInteger, sa.ForeignKey("resources.id", ondelete="RESTRICT"), nullable=True
    ),
    # Spark master for this job; NULL means the server's SPARKRING_SPARK_MASTER.
    sa.Column("spark_master", sa.Text, nullable=True),
    sa.Column("desired", sa.Text, nullable=False, server_default="stopped"),
    # Restarts after the job's own driver failed (a batch job's retries), with backoff.
    sa.Column("max_restarts", sa.Integer, nullable=False),
    # A streaming job fails only when more than max_restarts crashes fall inside one
    # window of this many seconds (PostgreSQL's clock); 0: every crash since the last
    # start counts (batch jobs: retries are per run).
    sa.Column("restart_window_s", sa.Float, nullable=False, server_default=sa.text("3600.0")),
    # Bumped by every start/restart command: at most one start per generation (S4, #9).
    sa.Column("generation", sa.BigInteger, nullable=False, server_default="0"),
    _timestamp("created_at"),
    _timestamp("updated_at"),
    # The current revision (job_revisions): resource_id, conf, args, spark_master,
    # max_restarts and job_py_files above are always a copy of it.
    sa.Column("revision", sa.Integer, nullable=False, server_default="1"),
    # The label of the spec file that defines the job (``sparkring apply``): apply
    # --prune deletes the jobs of its label that the file no longer has. NULL: none.
    sa.Column("label", sa.Text, nullable=True),
    # The schedule of a batch job (scheduler/schedule.py: spec, timezone, misfire,
    # misfire_grace_s, concurrency), a copy of the current revision's; NULL: none.
    sa.Column("schedule", JSONB, nullable=True),
    # Switched on by job start, off by job stop. While on, every slot after
    # fires_checked_until is handled (run or recorded skipped) once next_fire_at (the
    # first fire time after it) has come, by PostgreSQL's clock (scheduler/fires.py).
    sa.Column("schedule_active", sa.Boolean, nullable=False, server_default=sa.text("false")),
    sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("fires_checked_until", sa.DateTime(timezone=True), nullable=True),
    # The latest fire time whose run row history retention deleted: a backfill cannot
    # tell whether a time up to it ran, so it refuses to judge one (scheduler/fires.py).
    sa.Column("fires_pruned_until", sa.DateTime(timezone=True), nullable=True),
    # The job's auto-rollback setting (scheduler/auto_rollback.py): every update that
    # rolls a live streaming job is watched for this many seconds. Not in revisions.
    sa.Column("auto_rollback", sa.Boolean, nullable=False, server_default=sa.text("false")),
    sa.Column("healthy_within_s", sa.Float, nullable=False, server_default=sa.text("300.0")),
    # The watched update: its revision, the one to go back to, and the watch's start and
    # deadline (PostgreSQL's clock); all NULL when none is watched.
    sa.Column("watch_revision", sa.Integer, nullable=True),
    sa.Column("watch_fallback", sa.Integer, nullable=True),
    sa.Column("watch_since", sa.DateTime(timezone=True), nullable=True),
    sa.Column("watch_until", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(_in("kind", JOB_KINDS), name="kind_known"),
    sa.CheckConstraint("healthy_within_s > 0", name="healthy_within_positive"),
    sa.CheckConstraint(
        "watch_revision IS NULL AND watch_fallback IS NULL AND watch_since IS NULL "
        "AND watch_until IS NULL OR watch_revision IS NOT NULL AND watch_fallback IS NOT NULL "
        "AND watch_since IS NOT NULL AND watch_until IS NOT NULL",
        name="watch_whole",
    ),
    sa.CheckConstraint(_in("desired", DESIRED_STATES), name="desired_known"),
    sa.CheckConstraint("max_restarts >= 0", name="max_restarts_not_negative"),
    sa.CheckConstraint("restart_window_s >= 0", name="restart_window_not_negative"),
    sa.CheckConstraint("generation >= 0", name="generation_not_negative"),
    sa.CheckConstraint("revision > 0", name="revision_positive"),
    sa.CheckConstraint("jsonb_typeof(conf) = 'object'", name="conf_is_object"),
    sa.CheckConstraint("jsonb_typeof(args) = 'array'", name="args_is_array"),
    sa.CheckConstraint(r"name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'", name="name_charset"),
    sa.CheckConstraint(
        r"label IS NULL OR label ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'", name="label_charset"
    ),
    sa.CheckConstraint(
        "schedule IS NULL OR jsonb_typeof(schedule) = 'object'", name="schedule_is_object"
    ),
    sa.CheckConstraint(
        "NOT schedule_active OR (schedule IS NOT NULL AND next_fire_at IS NOT NULL "
        "AND fires_checked_until IS NOT NULL)",
        name="active_schedule_has_times",
    ),
)
sa.Index("ix_jobs_label", jobs.c.label)
# The firing loop's scan: active schedules by their next fire time.
sa.Index("ix_jobs_next_fire_at", jobs.c.next_fire_at, postgresql_where=jobs.c.schedule_active)
# Every server looks for watched updates every few seconds (scheduler/auto_rollback.py).
sa.Index(
    "ix_jobs_watch_until", jobs.c.watch_until, postgresql_where=jobs.c.watch_revision.is_not(None)
)

# Extra artifacts passed to spark-submit --py-files, in order. Rows (not a JSON list)
# so that a foreign key protects each referenced version from deletion.
job_py_files = sa.Table(
    "job_py_files",
    metadata,
    sa.Column(
        "job_id", sa.BigInteger, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column(
        "resource_id",
        sa.BigInteger,
        sa.ForeignKey("resources.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    sa.CheckConstraint("position >= 0", name="position_not_negative"),
)

# Every definition a job has had, numbered from 1 (job create) by job update and
# rollback; kept until the job is deleted. Each pins its artifact versions: RESTRICT
# keeps them undeletable while a revision names them, so a rollback can always run.
job_revisions = sa.Table(
    "job_revisions",
    metadata,
    sa.Column(
        "job_id", sa.BigInteger, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("revision", sa.Integer, primary_key=True),
    sa.Column(
        "resource_id",
        sa.BigInteger,
        sa.ForeignKey("resources.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    sa.Column("conf", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("args", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    sa.Column("env", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("secret_env", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column(
        "deps_id", sa.BigInteger, sa.ForeignKey("resources.id", ondelete="RESTRICT"), nullable=True
    ),
    sa.Column("spark_master", sa.Text, nullable=True),
    sa.Column("max_restarts", sa.Integer, nullable=False),
    sa.Column("restart_window_s", sa.Float, nullable=False, server_default=sa.text("3600.0")),
    _timestamp("created_at"),
    # Who made it (``cli:<user>`` or an API token), the fields it changed from the
    # revision before it, and the revision it restores (job rollback).
    sa.Column("created_by", sa.Text, nullable=True),
    sa.Column("changed", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    sa.Column("rollback_of", sa.Integer, nullable=True),
    sa.Column("schedule", JSONB, nullable=True),
    sa.CheckConstraint("revision > 0", name="revision_positive"),
    sa.CheckConstraint("max_restarts >= 0", name="max_restarts_not_negative"),
    sa.CheckConstraint("restart_window_s >= 0", name="restart_window_not_negative"),
    sa.CheckConstraint("jsonb_typeof(conf) = 'object'", name="conf_is_object"),
    sa.CheckConstraint("jsonb_typeof(args) = 'array'", name="args_is_array"),
    sa.CheckConstraint("jsonb_typeof(changed) = 'array'", name="changed_is_array"),
)

# The --py-files of each revision, in order (rows, so that RESTRICT protects them).
job_revision_py_files = sa.Table(
    "job_revision_py_files",
    metadata,
    sa.Column("job_id", sa.BigInteger, primary_key=True),
    sa.Column("revision", sa.Integer, primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column(
        "resource_id",
        sa.BigInteger,
        sa.ForeignKey("resources.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    sa.ForeignKeyConstraint(
        ["job_id", "revision"],
        ["job_revisions.job_id", "job_revisions.revision"],
        ondelete="CASCADE",
        name="fk_job_revision_py_files_job_id_job_revisions",
    ),
    sa.CheckConstraint("position >= 0", name="position_not_negative"),
)

# The distribution table: one row per job, written by the coordinator (target) and by
# the owning server (owner, epoch, lease, state). Every owner write is fenced by epoch.
distribution = sa.Table(
    "distribution",
    metadata,
    sa.Column(
        "job_id", sa.BigInteger, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("target", sa.Text, nullable=True),
    sa.Column("owner", sa.Text, nullable=True),
    # The owning process: a token each server process draws at start-up, so that two
    # incarnations of one server id (a quick restart, two hosts with one name) never
    # renew or write each other's leases.
    sa.Column("owner_incarnation", sa.Text, nullable=True),
    sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("state", sa.Text, nullable=False, server_default="stopped"),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("restarts", sa.Integer, nullable=False, server_default="0"),
    # The crashes of the job's current restart window (PostgreSQL's clock), pruned at
    # each crash, cleared with ``restarts`` (scheduler/distribution/ends.py, IN_WINDOW).
    sa.Column(
        "crash_times",
        ARRAY(sa.DateTime(timezone=True)),
        nullable=False,
        server_default=sa.text("'{}'"),
    ),
    # The job generation this row's current run belongs to (see jobs.generation).
    sa.Column("generation", sa.BigInteger, nullable=False, server_default="0"),
    # The job revision the current (or last) run was started from, set by its claim;
    # NULL until the job's first claim.
    sa.Column("revision", sa.Integer, nullable=True),
    sa.Column("ring_generation", sa.BigInteger, nullable=False, server_default="0"),
    # Why the job has no target (capacity exhausted, no live server), for users.
    sa.Column("pending_reason", sa.Text, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    # Earliest time a crashed streaming job may be started again (restart backoff).
    sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    _timestamp("updated_at"),
    # Warm hand-off (migration 0015): the epoch whose owner offered a warm hand-off as it
    # began a planned stop, and the epoch whose hand-off the target's warm driver is
    # ready for. A claim (epoch + 1) makes both stale.
    sa.Column("handoff_epoch", sa.BigInteger, nullable=True),
    sa.Column("warm_ready_epoch", sa.BigInteger, nullable=True),
    # The owner the coordinator reaped the row from (migration 0016), until the next
    # claim: its outcome at the same epoch is still taken (distribution.finish).
    sa.Column("reaped_from", sa.Text, nullable=True),
    sa.CheckConstraint(_in("state", RUN_STATES), name="state_known"),
    sa.CheckConstraint("(owner IS NULL) = (lease_until IS NULL)", name="lease_needs_owner"),
    sa.CheckConstraint(
        "epoch >= 0 AND attempt >= 0 AND restarts >= 0", name="counters_not_negative"
    ),
    sa.CheckConstraint(f"target IS NULL OR target ~ '{SERVER_NAME}'", name="target_is_server"),
    sa.CheckConstraint(f"owner IS NULL OR owner ~ '{SERVER_NAME}'", name="owner_is_server"),
)
sa.Index("ix_distribution_target", distribution.c.target)
sa.Index("ix_distribution_owner", distribution.c.owner)

# One row per run of a batch job (docs/schedules.md): a fire of its schedule, a manual
# start or run, or a backfilled fire time. A row that starts a driver names the job
# generation it runs (at most one run per generation); a skipped fire has none. Unique
# on (job_id, scheduled_time): a fire time is written once, in the transaction that
# makes its run pending (scheduler/fires.py), so no fire runs twice. The trigger
# ``distribution_runs_follow`` (migration 0011) keeps the run of the job's current
# generation in step with the distribution row in the same transaction: attempts,
# server, epoch, started_at, state, ended_at, exit_code.
RUN_TRIGGERS = ("schedule", "manual", "backfill", "retry")
RUN_STATES_OF_RUNS = (
    "queued",  # a backfilled fire time waiting for its turn (no generation yet)
    "pending",
    "starting",
    "running",
    "retrying",  # its driver failed, a retry is left: backoff
    "stopping",
    "finished",
    "failed",
    "stopped",
    "replaced",  # stopped for a newer run (concurrency replace, job restart)
    "skipped",  # a fire not run; ``reason`` says why
)
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column(
        "job_id", sa.BigInteger, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("generation", sa.BigInteger, nullable=True),
    sa.Column("scheduled_time", sa.DateTime(timezone=True), nullable=True),
    sa.Column("trigger", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    _timestamp("created_at"),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("exit_code", sa.Integer, nullable=True),
    sa.Column("server", sa.Text, nullable=True),
    sa.Column("epoch", sa.BigInteger, nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.UniqueConstraint("job_id", "scheduled_time", name="uq_runs_job_id_scheduled_time"),
    sa.UniqueConstraint("job_id", "generation", name="uq_runs_job_id_generation"),
    sa.CheckConstraint(_in("trigger", RUN_TRIGGERS), name="trigger_known"),
    sa.CheckConstraint(_in("state", RUN_STATES_OF_RUNS), name="state_known"),
    sa.CheckConstraint("state <> 'skipped' OR reason IS NOT NULL", name="skipped_has_reason"),
    sa.CheckConstraint("attempts >= 0", name="attempts_not_negative"),
)
sa.Index("ix_runs_job_id_run_id", runs.c.job_id, runs.c.run_id)

# The coordinator's fencing token: one row. A coordinator writes targets only while the
# term it was elected with (from ZooKeeper, only ever growing) is the current one.
coordinator = sa.Table(
    "coordinator",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, server_default="1"),
    sa.Column("term", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("server", sa.Text, nullable=True),
    sa.Column("ring_generation", sa.BigInteger, nullable=False, server_default="0"),
    _timestamp("updated_at"),
    # Set by ``sparkring ring rebalance``; the coordinator runs a full rebalance and
    # clears it.
    sa.Column("rebalance_requested_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("id = 1", name="single_row"),
    sa.CheckConstraint("term >= 0 AND ring_generation >= 0", name="counters_not_negative"),
)

# When the cluster last reached PostgreSQL, stamped by every lease renewal (one row):
# a renewal that finds the stamp older than a lease ends an outage (every server cut
# off, PostgreSQL down or failing over, the whole cluster stopped) and records when.
# Another server's expired lease is claimed over or reaped only a hold after that
# (scheduler/distribution/clock.py, docs/distribution.md): its owner may hold the only word
# on how its driver ended meanwhile. ``renewed_at`` is NULL until the first renewal.
cluster_clock = sa.Table(
    "cluster_clock",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, server_default="1"),
    sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("outage_ended_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("id = 1", name="single_row"),
)

# Servers an operator asked to drain: the coordinator targets no job at them (their
# jobs are handed off while they keep running). Operator intent, so it lives here and
# not in ZooKeeper: it survives the server's restarts until undone.
drains = sa.Table(
    "drains",
    metadata,
    sa.Column("server", sa.Text, primary_key=True),
    _timestamp("requested_at"),
    sa.CheckConstraint(f"server ~ '{SERVER_NAME}'", name="server_is_name"),
)

# The coordinator's memory of membership, so that every coordinator (also a new one
# after failover) tells a joining server from one it already knows. A placeable server
# is a member from its first sighting (joined_at); it is *settled* once its join has
# been acted on (streaming jobs moved to it). left_at marks when it was last seen
# leaving: back within the settle window it is the same member (a flap moves nothing),
# later it joins afresh. Times are PostgreSQL's.
ring_members = sa.Table(
    "ring_members",
    metadata,
    sa.Column("server", sa.Text, primary_key=True),
    _timestamp("joined_at"),
    sa.Column("settled", sa.Boolean, nullable=False, server_default=sa.text("false")),
    sa.Column("left_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(f"server ~ '{SERVER_NAME}'", name="server_is_name"),
)

# Append-only history. No foreign key: events outlive a deleted job.
job_events = sa.Table(
    "job_events",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("job_name", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("server", sa.Text, nullable=True),
    sa.Column("epoch", sa.BigInteger, nullable=True),
    sa.Column("detail", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.CheckConstraint(_in("kind", EVENT_KINDS), name="kind_known"),
)
sa.Index("ix_job_events_job_id_id", job_events.c.job_id, job_events.c.id)
# History retention deletes events older than a cutoff (server/retention.py).
sa.Index("ix_job_events_at", job_events.c.at)

# What the owning server's health monitor last saw of each job's Spark application
# (server/health.py): one row per job, for the run of ``epoch``; flags are informative.
run_health = sa.Table(
    "run_health",
    metadata,
    sa.Column(
        "job_id", sa.BigInteger, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("server", sa.Text, nullable=False),
    sa.Column("app_id", sa.Text, nullable=True),
    sa.Column("ui_url", sa.Text, nullable=True),
    sa.Column("app_state", sa.Text, nullable=False),
    sa.Column("executors", sa.Integer, nullable=True),
    sa.Column("cores", sa.Integer, nullable=True),
    sa.Column("last_batch_id", sa.BigInteger, nullable=True),
    sa.Column("last_batch_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("input_rate", sa.Float, nullable=True),
    sa.Column("processing_rate", sa.Float, nullable=True),
    sa.Column("flag", sa.Text, nullable=True),
    sa.Column("flagged_at", sa.DateTime(timezone=True), nullable=True),
    _timestamp("checked_at"),
    sa.CheckConstraint(f"flag IS NULL OR {_in('flag', HEALTH_FLAGS)}", name="flag_known"),
    sa.CheckConstraint("(flag IS NULL) = (flagged_at IS NULL)", name="flagged_at_with_flag"),
)

# Bearer tokens of the HTTP API: only a SHA-256 of each token is kept (a token is 32
# random bytes, so a plain hash is enough; no salt or slow hash needed). Revoking sets
# revoked_at; rows stay for the audit trail of job_events (detail.by names the token).
# A token with expires_at stops working then; last_used_at is kept to the minute.
TOKEN_ROLES = ("viewer", "operator")
api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
    _timestamp("created_at"),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(_in("role", TOKEN_ROLES), name="role_known"),
    sa.CheckConstraint("token_sha256 ~ '^[0-9a-f]{64}$'", name="sha256_hex"),
    sa.CheckConstraint(r"name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'", name="name_charset"),
)

# The audit trail of writes that are not a job's (job writes are job_events with
# detail.by): artifact uploads and deletes, token creation and revocation, alert creation
# and deletion. ``actor`` is ``token:<name>`` (authenticated by the API) or
# ``cli:<user> (claimed)`` (the CLI user name, which nothing verifies: whoever runs the
# CLI holds the database URL).
AUDIT_ACTIONS = (
    "resource_uploaded",
    "resource_deleted",
    "token_created",
    "token_revoked",
    "alert_created",
    "alert_deleted",
    "secret_put",
    "secret_deleted",
    "secrets_rotated",
)
audit_events = sa.Table(
    "audit_events",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    _timestamp("at"),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("detail", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.CheckConstraint(_in("action", AUDIT_ACTIONS), name="action_known"),
)
sa.Index("ix_audit_events_at", audit_events.c.at)

# The cluster credential: one random secret servers accept from each other and from the
# CLI (which reads it here) for reads such as a live driver log. Whoever can read this
# table can already change every job, so it is stored as is.
cluster_credential = sa.Table(
    "cluster_credential",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, server_default="1"),
    sa.Column("secret", sa.Text, nullable=False),
    _timestamp("created_at"),
    sa.CheckConstraint("id = 1", name="single_row"),
    sa.CheckConstraint("length(secret) >= 32", name="secret_long_enough"),
)


# Secrets a job's driver gets as environment variables (jobs.secret_env): each value
# encrypted with Fernet under a key the database never holds (SPARKRING_SECRET_KEYS,
# scheduler/secrets.py). ``version`` counts the values the name has had.
secrets = sa.Table(
    "secrets",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("ciphertext", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False, server_default="1"),
    _timestamp("created_at"),
    _timestamp("updated_at"),
    sa.Column("updated_by", sa.Text, nullable=True),
    sa.CheckConstraint(r"name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'", name="name_charset"),
)

# Webhook alerts (scheduler/alerts.py, docs/alerts.md) and their outbox, which triggers
# of migration 0013 fill in the transaction of the event that raises each delivery.
ALERT_KINDS = tuple(k.value for k in states.AlertKind if k is not states.AlertKind.TEST)
DELIVERY_KINDS = tuple(k.value for k in states.AlertKind)
ALERT_FORMATS = tuple(f.value for f in states.AlertFormat)
DELIVERY_STATUSES = tuple(s.value for s in states.DeliveryStatus)
alerts = sa.Table(
    "alerts",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("webhook_url", sa.Text, nullable=False),
    # The HMAC key of the signature header; never read back out of the database by
    # anything but the delivery (not by the CLI, the API or the console).
    sa.Column("secret", sa.Text, nullable=True),
    sa.Column("format", sa.Text, nullable=False, server_default="json"),
    sa.Column("kinds", ARRAY(sa.Text), nullable=False),
    sa.Column("job_glob", sa.Text, nullable=False, server_default="*"),
    _timestamp("created_at"),
    sa.Column("created_by", sa.Text, nullable=True),
    sa.CheckConstraint(r"name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'", name="name_charset"),
    sa.CheckConstraint("webhook_url ~ '^https?://'", name="webhook_http"),
    sa.CheckConstraint(_in("format", ALERT_FORMATS), name="format_known"),
    sa.CheckConstraint(
        f"cardinality(kinds) > 0 AND kinds <@ ARRAY[{', '.join(repr(k) for k in ALERT_KINDS)}]",
        name="kinds_known",
    ),
)
alert_deliveries = sa.Table(
    "alert_deliveries",
    metadata,
    # The body's ``id``: the same on every attempt, for the receiver's de-duplication.
    sa.Column("id", sa.Uuid, primary_key=True, server_default=sa.text("gen_random_uuid()")),
    sa.Column(
        "alert_id",
        sa.BigInteger,
        sa.ForeignKey("alerts.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("alert_name", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("job_id", sa.BigInteger, nullable=True),
    sa.Column("job_name", sa.Text, nullable=True),
    sa.Column("event_id", sa.BigInteger, nullable=True),
    sa.Column("server", sa.Text, nullable=True),
    sa.Column("epoch", sa.BigInteger, nullable=True),
    sa.Column("detail", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    # When it happened (the event's time), and when the delivery row was written.
    sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    _timestamp("created_at"),
    sa.Column("status", sa.Text, nullable=False, server_default="pending"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    _timestamp("next_attempt_at"),
    # The server delivering it, until when (an attempt in flight; a killed server's
    # lease lapses and another server sends it again, with the same id).
    sa.Column("lease_owner", sa.Text, nullable=True),
    sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_status", sa.Integer, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(_in("kind", DELIVERY_KINDS), name="kind_known"),
    sa.CheckConstraint(_in("status", DELIVERY_STATUSES), name="status_known"),
)
sa.Index(
    "ix_alert_deliveries_due",
    alert_deliveries.c.next_attempt_at,
    postgresql_where=sa.text("status = 'pending'"),
)
sa.Index(
    "ix_alert_deliveries_alert_id_created_at",
    alert_deliveries.c.alert_id,
    alert_deliveries.c.created_at,
)
