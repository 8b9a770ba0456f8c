"""A job's history of commands and owner writes (``job_events``): the append every
command makes (``record``), and the reads of it (``events`` for one job, ``recent_events``
for the cluster)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from scheduler import job_views
from sql import tables


def record(
    conn: sa.Connection,
    job_id: int,
    name: str,
    kind: str,
    detail: dict[str, Any],
    actor: str | None = None,
) -> None:
    """Append to the job's history; ``actor`` (who asked: an API token) goes in ``by``."""
    if actor is not None:
        detail = {**detail, "by": actor}
    conn.execute(
        sa.insert(tables.job_events).values(job_id=job_id, job_name=name, kind=kind, detail=detail)
    )


def recent_events(conn: sa.Connection, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
    """The cluster's events newer than id ``after``: the newest ``limit``, oldest first."""
    rows = conn.execute(
        sa.text(
            """
            SELECT * FROM (
                SELECT id, at, job_name, kind, server, epoch, detail FROM job_events
                 WHERE id > :after ORDER BY id DESC LIMIT :limit
            ) newest ORDER BY id
            """
        ),
        {"after": after, "limit": limit},
    ).all()
    return [
        {
            "id": r.id,
            "at": r.at,
            "job": r.job_name,
            "kind": r.kind,
            "server": r.server,
            "epoch": r.epoch,
            "detail": r.detail,
        }
        for r in rows
    ]


def events(conn: sa.Connection, name: str, limit: int = 100) -> list[dict[str, Any]]:
    """The job's newest ``limit`` events, oldest first (events outlive a deleted job)."""
    rows = conn.execute(
        sa.text(
            """
            SELECT * FROM (
                SELECT id, at, kind, server, epoch, detail FROM job_events
                 WHERE job_name = :name ORDER BY id DESC LIMIT :limit
            ) newest ORDER BY id
            """
        ),
        {"name": name, "limit": limit},
    ).all()
    if not rows:
        job_views.job_id_of(conn, name)
    return [
        {
            "id": r.id,
            "at": r.at,
            "kind": r.kind,
            "server": r.server,
            "epoch": r.epoch,
            "detail": r.detail,
        }
        for r in rows
    ]
