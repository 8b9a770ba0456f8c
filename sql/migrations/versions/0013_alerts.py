"""alerts: webhook alerts and their durable outbox

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26

``alerts``: one row per alert an operator made (``sparkring alert create``): where it is
delivered (a webhook URL, an optional HMAC secret, JSON or Slack), what it listens to
(``kinds``) and for which jobs (``job_glob``: ``*`` and ``?``).

``alert_deliveries``: the outbox. One row per (alert, thing that happened), written by
the triggers below **in the transaction that writes the event**, so an event committed
always has its deliveries, and an event rolled back never does. Any live server
delivers a row under a lease (``lease_owner``, ``lease_until``); ``id`` is the body's
``id``, the same on every retry, for the receiver's de-duplication.

The triggers map what happened to an alert kind (``sql.states.AlertKind``; the map is
this migration's, as of this revision):

- ``job_events`` ``failed`` -> failed; ``crashed`` -> restarted; ``reaped`` ->
  failed_over; ``claimed`` whose detail names ``taken_over_from`` -> failed_over;
  ``health_flagged`` -> its flag (stalled, waiting_for_resources); ``health_cleared`` ->
  recovered; ``rolled_back`` -> rolled_back;
- ``runs`` inserted ``skipped`` (a fire time not run) -> schedule_skipped.

``audit_events`` may record ``alert_created`` and ``alert_deleted`` (an alert is not a
job's: its writes are audited like a token's).

Expand only: servers of the previous release neither read nor write the tables; their
events raise deliveries all the same (the triggers are the database's).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# As of this revision: never import them from the code, which moves on.
KINDS = (
    "failed",
    "restarted",
    "failed_over",
    "stalled",
    "waiting_for_resources",
    "rolled_back",
    "recovered",
    "schedule_skipped",
)
DELIVERY_KINDS = (*KINDS, "test")
FORMATS = ("json", "slack")
STATUSES = ("pending", "delivered", "failed")
# The audit trail's actions before and as of this revision.
PREVIOUS_AUDIT_ACTIONS = ("resource_uploaded", "resource_deleted", "token_created", "token_revoked")
AUDIT_ACTIONS = (*PREVIOUS_AUDIT_ACTIONS, "alert_created", "alert_deleted")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


# A job name matched against an alert's glob: ``*`` any run of characters, ``?`` one,
# everything else itself (LIKE's own wildcards and escape are escaped first).
_MATCHES = r"""
    p_job_name LIKE replace(replace(replace(replace(replace(a.job_glob,
        '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'), '?', '_')
"""

_FUNCTIONS = f"""
CREATE FUNCTION sparkring_alert_outbox(
    p_kind text, p_job_id bigint, p_job_name text, p_event_id bigint, p_server text,
    p_epoch bigint, p_detail jsonb, p_at timestamptz
) RETURNS void LANGUAGE sql AS $$
    INSERT INTO alert_deliveries
        (alert_id, alert_name, kind, job_id, job_name, event_id, server, epoch, detail, at)
    SELECT a.id, a.name, p_kind, p_job_id, p_job_name, p_event_id, p_server, p_epoch,
           p_detail, p_at
      FROM alerts a
     WHERE p_kind = ANY(a.kinds) AND {_MATCHES}
$$;

CREATE FUNCTION sparkring_alert_on_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    alert_kind text;
BEGIN
    alert_kind := CASE NEW.kind
        WHEN 'failed' THEN 'failed'
        WHEN 'crashed' THEN 'restarted'
        WHEN 'reaped' THEN 'failed_over'
        WHEN 'claimed' THEN
            CASE WHEN NEW.detail ? 'taken_over_from' THEN 'failed_over' END
        WHEN 'health_flagged' THEN
            CASE WHEN NEW.detail->>'flag' IN ('stalled', 'waiting_for_resources')
                 THEN NEW.detail->>'flag' END
        WHEN 'health_cleared' THEN 'recovered'
        WHEN 'rolled_back' THEN 'rolled_back'
    END;
    IF alert_kind IS NOT NULL THEN
        PERFORM sparkring_alert_outbox(alert_kind, NEW.job_id, NEW.job_name, NEW.id,
                                       NEW.server, NEW.epoch, NEW.detail, NEW.at);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION sparkring_alert_on_skipped_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sparkring_alert_outbox(
        'schedule_skipped', NEW.job_id, j.name, NULL, NULL, NULL,
        jsonb_build_object(
            'scheduled_time', to_char(NEW.scheduled_time AT TIME ZONE 'UTC',
                                      'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            'reason', NEW.reason, 'run', NEW.run_id),
        NEW.created_at)
      FROM jobs j WHERE j.id = NEW.job_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_events_raise_alerts AFTER INSERT ON job_events
    FOR EACH ROW EXECUTE FUNCTION sparkring_alert_on_event();
CREATE TRIGGER runs_skipped_raise_alerts AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.state = 'skipped')
    EXECUTE FUNCTION sparkring_alert_on_skipped_run();
"""


def _audit_actions_constraint(actions: tuple[str, ...]) -> None:
    op.execute("ALTER TABLE audit_events DROP CONSTRAINT IF EXISTS ck_audit_events_action_known")
    op.execute(
        "ALTER TABLE audit_events ADD CONSTRAINT ck_audit_events_action_known "
        f"CHECK ({_in('action', actions)}) NOT VALID"
    )
    op.execute("ALTER TABLE audit_events VALIDATE CONSTRAINT ck_audit_events_action_known")


def upgrade() -> None:
    _audit_actions_constraint(AUDIT_ACTIONS)
    op.create_table(
        "alerts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("webhook_url", sa.Text, nullable=False),
        sa.Column("secret", sa.Text, nullable=True),
        sa.Column("format", sa.Text, nullable=False, server_default="json"),
        sa.Column("kinds", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("job_glob", sa.Text, nullable=False, server_default="*"),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("created_by", sa.Text, nullable=True),
        sa.CheckConstraint(
            r"name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'", name=op.f("ck_alerts_name_charset")
        ),
        sa.CheckConstraint("webhook_url ~ '^https?://'", name=op.f("ck_alerts_webhook_http")),
        sa.CheckConstraint(_in("format", FORMATS), name=op.f("ck_alerts_format_known")),
        sa.CheckConstraint(
            f"cardinality(kinds) > 0 AND kinds <@ ARRAY[{', '.join(repr(k) for k in KINDS)}]",
            name=op.f("ck_alerts_kinds_known"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("name", name=op.f("uq_alerts_name")),
    )
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Uuid, primary_key=True, server_default=sa.text("gen_random_uuid()")),
        sa.Column("alert_id", sa.BigInteger, nullable=False),
        sa.Column("alert_name", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("job_id", sa.BigInteger, nullable=True),
        sa.Column("job_name", sa.Text, nullable=True),
        sa.Column("event_id", sa.BigInteger, nullable=True),
        sa.Column("server", sa.Text, nullable=True),
        sa.Column("epoch", sa.BigInteger, nullable=True),
        sa.Column(
            "detail", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.Column("lease_owner", sa.Text, nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status", sa.Integer, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["alert_id"],
            ["alerts.id"],
            ondelete="CASCADE",
            name=op.f("fk_alert_deliveries_alert_id_alerts"),
        ),
        sa.CheckConstraint(
            _in("kind", DELIVERY_KINDS), name=op.f("ck_alert_deliveries_kind_known")
        ),
        sa.CheckConstraint(_in("status", STATUSES), name=op.f("ck_alert_deliveries_status_known")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
    )
    op.create_index(
        op.f("ix_alert_deliveries_due"),
        "alert_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        op.f("ix_alert_deliveries_alert_id_created_at"),
        "alert_deliveries",
        ["alert_id", "created_at"],
    )
    op.execute(_FUNCTIONS)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS runs_skipped_raise_alerts ON runs")
    op.execute("DROP TRIGGER IF EXISTS job_events_raise_alerts ON job_events")
    op.execute("DROP FUNCTION IF EXISTS sparkring_alert_on_skipped_run()")
    op.execute("DROP FUNCTION IF EXISTS sparkring_alert_on_event()")
    op.execute(
        "DROP FUNCTION IF EXISTS sparkring_alert_outbox"
        "(text, bigint, text, bigint, text, bigint, jsonb, timestamptz)"
    )
    op.drop_table("alert_deliveries")
    op.drop_table("alerts")
    op.execute("DELETE FROM audit_events WHERE action IN ('alert_created', 'alert_deleted')")
    _audit_actions_constraint(PREVIOUS_AUDIT_ACTIONS)
