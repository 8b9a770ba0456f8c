"""distribution_runs_follow: a crash is recorded on its own run, never on a newer one

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28

The trigger of migration 0011 keeps the unended runs of the job's current generation and
later ones in step with its distribution row. A ``job restart`` or a ``--concurrency
replace`` fire opens the new run (a newer generation) while the old run's driver may
still run; if that driver crashed before its stop reached it, the crash (the row to
``backoff``, a restart spent) was written on the new run's row: ``retrying``, with the
old run's exit code and error, for a run that had not started (M4 of safety review 3,
``tests/integration/test_fires.py::test_the_old_runs_crash_after_a_replace_is_not_the_new_runs``).
Now a newer run only waits (``pending``) through the old run's backoff, and keeps its
own exit code and reason.

Replaces the function only (the trigger calls it by name): servers of the previous
release are unaffected, their writes to ``distribution`` are the same. Downgrading puts
the previous body back.
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

ENDED = "r.state IN ('finished', 'failed', 'stopped', 'replaced', 'skipped')"


def _body(own: str) -> str:
    """The function, with ``own``: an SQL condition that a crash to ``backoff`` is the
    run row's own (0011: every unended row of the current generation or later). Only
    that case changes: any other state reaches every such row as before."""
    return f"""
CREATE OR REPLACE FUNCTION distribution_runs_follow() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    claimed boolean := NEW.epoch > OLD.epoch;
    crashed boolean := NEW.restarts > OLD.restarts;
BEGIN
    IF NEW.state = OLD.state AND NOT claimed THEN
        RETURN NULL;
    END IF;
    UPDATE runs r
       SET state = CASE
               WHEN NEW.state = 'backoff' AND crashed AND {own} THEN 'retrying'
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
               WHEN NEW.state = 'backoff' AND NOT ({own}) THEN r.exit_code
               WHEN NEW.state = 'finished' THEN 0
               WHEN NEW.state = 'failed' OR crashed THEN coalesce(
                   CAST(substring(NEW.last_error FROM 'exit code (-?[0-9]+)') AS integer),
                   r.exit_code)
               ELSE r.exit_code END,
           reason = CASE WHEN NEW.state = 'backoff' AND NOT ({own}) THEN r.reason
                         WHEN NEW.state = 'failed' OR crashed THEN NEW.last_error
                         ELSE r.reason END
     WHERE r.job_id = NEW.job_id
       AND r.generation >= NEW.generation
       AND NOT ({ENDED});
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    # A row of a newer generation is a run that has not started: no crash is its own.
    op.execute(_body("r.generation = NEW.generation"))


def downgrade() -> None:
    op.execute(_body("true"))
