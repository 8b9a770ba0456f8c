"""schedules and runs: a batch job's cron schedule, and one row per run

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25

``jobs`` gains ``schedule`` (JSONB: spec, timezone, misfire, misfire_grace_s,
concurrency; NULL: none), ``schedule_active``, ``next_fire_at`` and
``fires_checked_until``; ``job_revisions`` gains ``schedule`` (a schedule change is a
revision like any other).

``runs`` holds one row per run of a batch job: unique on (job_id, scheduled_time), so a
fire time is written once, and on (job_id, generation). The trigger
``distribution_runs_follow`` keeps the unended run of the job's current generation in
step with every change of its distribution row, in the same transaction, whoever
writes it (the owner, the run's watchdog, the coordinator's reap, a stop command): its
state, attempts (each claim), server and epoch (of the last claim), started_at (the
first claim), ended_at and exit_code. A row already ended is never changed again.
Its times are ``clock_timestamp()``, when the change was written, not ``now()``, when
the writing transaction began: a transaction that began before a fire time and wrote
a run's end after a fire skipped for it would date the end before the fire.

Expand only: servers of the previous release neither read nor write the new columns
or the table; the trigger updates no row for their jobs until a run row exists.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# As of this revision: never import them from the code, which moves on.
TRIGGERS = ("schedule", "manual", "backfill", "retry")
STATES = (
    "queued",
    "pending",
    "starting",
    "running",
    "retrying",
    "stopping",
    "finished",
    "failed",
    "stopped",
    "replaced",
    "skipped",
)
ENDED = ("finished", "failed", "stopped", "replaced", "skipped")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


RUNS_FOLLOW = f"""
CREATE FUNCTION distribution_runs_follow() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    claimed boolean := NEW.epoch > OLD.epoch;
    crashed boolean := NEW.restarts > OLD.restarts;
BEGIN
    IF NEW.state = OLD.state AND NOT claimed THEN
        RETURN NULL;
    END IF;
    UPDATE runs r
       SET state = CASE
               WHEN NEW.state = 'backoff' AND crashed THEN 'retrying'
               WHEN NEW.state = 'backoff' THEN 'pending'
               ELSE NEW.state END,
           attempts = r.attempts + CASE WHEN claimed THEN 1 ELSE 0 END,
           server = CASE WHEN claimed THEN NEW.owner ELSE r.server END,
           epoch = CASE WHEN claimed THEN NEW.epoch ELSE r.epoch END,
           started_at = CASE WHEN claimed THEN coalesce(r.started_at, clock_timestamp())
                             ELSE r.started_at END,
           ended_at = CASE WHEN NEW.state IN ('finished', 'failed', 'stopped')
                           THEN clock_timestamp() ELSE NULL END,
           exit_code = CASE
               WHEN NEW.state = 'finished' THEN 0
               WHEN NEW.state = 'failed' OR crashed THEN coalesce(
                   CAST(substring(NEW.last_error FROM 'exit code (-?[0-9]+)') AS integer),
                   r.exit_code)
               ELSE r.exit_code END,
           reason = CASE WHEN NEW.state = 'failed' OR crashed THEN NEW.last_error
                         ELSE r.reason END
     WHERE r.job_id = NEW.job_id
       AND r.generation >= NEW.generation
       AND NOT ({_in("r.state", ENDED)});
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("schedule", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )
    op.add_column(
        "jobs",
        sa.Column("schedule_active", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column("jobs", sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "jobs", sa.Column("fires_checked_until", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_check_constraint(
        op.f("ck_jobs_schedule_is_object"),
        "jobs",
        "schedule IS NULL OR jsonb_typeof(schedule) = 'object'",
    )
    op.create_check_constraint(
        op.f("ck_jobs_active_schedule_has_times"),
        "jobs",
        "NOT schedule_active OR (schedule IS NOT NULL AND next_fire_at IS NOT NULL "
        "AND fires_checked_until IS NOT NULL)",
    )
    op.create_index(
        "ix_jobs_next_fire_at",
        "jobs",
        ["next_fire_at"],
        postgresql_where=sa.text("schedule_active"),
    )
    op.add_column(
        "job_revisions",
        sa.Column("schedule", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=True),
        sa.Column("scheduled_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("server", sa.Text(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.CheckConstraint(_in("trigger", TRIGGERS), name=op.f("ck_runs_trigger_known")),
        sa.CheckConstraint(_in("state", STATES), name=op.f("ck_runs_state_known")),
        sa.CheckConstraint(
            "state <> 'skipped' OR reason IS NOT NULL", name=op.f("ck_runs_skipped_has_reason")
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_runs_attempts_not_negative")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_runs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
        sa.UniqueConstraint("job_id", "scheduled_time", name="uq_runs_job_id_scheduled_time"),
        sa.UniqueConstraint("job_id", "generation", name="uq_runs_job_id_generation"),
    )
    op.create_index("ix_runs_job_id_run_id", "runs", ["job_id", "run_id"])
    op.execute(RUNS_FOLLOW)
    op.execute(
        # Only a change of state or epoch calls it: a lease renewal (thousands of rows
        # every renew interval) does not.
        "CREATE TRIGGER distribution_runs_follow AFTER UPDATE ON distribution FOR EACH ROW "
        "WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.epoch IS DISTINCT FROM NEW.epoch) "
        "EXECUTE FUNCTION distribution_runs_follow()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS distribution_runs_follow ON distribution")
    op.execute("DROP FUNCTION IF EXISTS distribution_runs_follow()")
    op.drop_index("ix_runs_job_id_run_id", table_name="runs")
    op.drop_table("runs")
    op.drop_column("job_revisions", "schedule")
    op.drop_index(
        "ix_jobs_next_fire_at", table_name="jobs", postgresql_where=sa.text("schedule_active")
    )
    op.drop_constraint(op.f("ck_jobs_active_schedule_has_times"), "jobs", type_="check")
    op.drop_constraint(op.f("ck_jobs_schedule_is_object"), "jobs", type_="check")
    op.drop_column("jobs", "fires_checked_until")
    op.drop_column("jobs", "next_fire_at")
    op.drop_column("jobs", "schedule_active")
    op.drop_column("jobs", "schedule")
