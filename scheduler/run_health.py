"""The ``run_health`` table: what each job's Spark application last reported, as the
health monitor of the server that runs it saw it (``server/health.py``).

One row per job, for the run of one epoch. A write for an older epoch than the row's is
ignored (a monitor that lost the job must not overwrite its successor's view). Raising
or clearing a flag appends a ``health_flagged`` / ``health_cleared`` event in the same
transaction.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from sql import states, tables


@dataclass(frozen=True)
class Report:
    """One observation of a run's application by its owner."""

    job_id: int
    epoch: int
    server: str
    app_state: str  # starting | running | completed | unreachable
    app_id: str | None = None
    ui_url: str | None = None
    executors: int | None = None
    cores: int | None = None
    last_batch_id: int | None = None
    last_batch_at: dt.datetime | None = None
    input_rate: float | None = None
    processing_rate: float | None = None
    flag: str | None = None
    flagged_at: dt.datetime | None = None


def record(conn: sa.Connection, report: Report) -> bool:
    """Write ``report`` over the job's row unless the row is of a newer epoch; True if
    written (False also when the job no longer exists).

    A row of an older epoch still flagged is a flag whose run ended (a restart on stall,
    a failover, a roll): it is cleared here, with its ``health_cleared`` event (``why``:
    run ended) in this transaction, so that its ``recovered`` alert follows its
    ``stalled`` one whatever replaced the run."""
    values = {**asdict(report), "checked_at": sa.func.now()}
    insert = postgresql.insert(tables.run_health).values(values)
    h = tables.run_health
    statement = insert.on_conflict_do_update(
        index_elements=[h.c.job_id],
        set_={name: insert.excluded[name] for name in values if name != "job_id"},
        where=h.c.epoch <= insert.excluded.epoch,
    ).returning(h.c.job_id)
    job = conn.execute(
        sa.select(tables.jobs.c.name).where(tables.jobs.c.id == report.job_id)
    ).one_or_none()
    if job is None:
        return False
    before = conn.execute(
        sa.select(h.c.epoch, h.c.flag, h.c.server)
        .where(h.c.job_id == report.job_id)
        .with_for_update()
    ).one_or_none()
    if conn.execute(statement).one_or_none() is None:
        return False
    if before is not None and before.flag is not None and before.epoch < report.epoch:
        _ended_flag_cleared(conn, report.job_id, job.name, before)
    return True


def _ended_flag_cleared(conn: sa.Connection, job_id: int, name: str, before: sa.Row) -> None:
    conn.execute(
        sa.insert(tables.job_events).values(
            job_id=job_id,
            job_name=name,
            kind=states.EventKind.HEALTH_CLEARED.value,
            server=before.server,
            epoch=before.epoch,
            detail={"flag": before.flag, "why": "run ended"},
        )
    )


def flag_changed(
    conn: sa.Connection,
    report: Report,
    name: str,
    previous: str | None,
    detail: dict[str, Any],
) -> None:
    """Append the event of the run's flag going from ``previous`` to ``report.flag``."""
    kind = states.EventKind.HEALTH_FLAGGED if report.flag else states.EventKind.HEALTH_CLEARED
    conn.execute(
        sa.insert(tables.job_events).values(
            job_id=report.job_id,
            job_name=name,
            kind=kind.value,
            server=report.server,
            epoch=report.epoch,
            detail={"flag": report.flag or previous, **detail},
        )
    )


def view(row: sa.Row | None) -> dict[str, Any] | None:
    """The health part of a job's listing (``scheduler.jobs``), from its ``h_*`` columns."""
    if row is None or row.h_app_state is None:
        return None
    return {
        "epoch": row.h_epoch,
        "app_id": row.h_app_id,
        "ui_url": row.h_ui_url,
        "app_state": row.h_app_state,
        "executors": row.h_executors,
        "cores": row.h_cores,
        "last_batch_id": row.h_last_batch_id,
        "last_batch_at": row.h_last_batch_at,
        "input_rate": row.h_input_rate,
        "processing_rate": row.h_processing_rate,
        "flag": row.h_flag,
        "flagged_at": row.h_flagged_at,
        "checked_at": row.h_checked_at,
    }


# Joined into scheduler.jobs' listing query: the health of the job's current epoch only.
SELECT_COLUMNS = """,
           h.epoch AS h_epoch, h.app_id AS h_app_id, h.ui_url AS h_ui_url,
           h.app_state AS h_app_state, h.executors AS h_executors, h.cores AS h_cores,
           h.last_batch_id AS h_last_batch_id, h.last_batch_at AS h_last_batch_at,
           h.input_rate AS h_input_rate, h.processing_rate AS h_processing_rate,
           h.flag AS h_flag, h.flagged_at AS h_flagged_at, h.checked_at AS h_checked_at"""
JOIN = "\n      LEFT JOIN run_health h ON h.job_id = j.id AND h.epoch = d.epoch"
