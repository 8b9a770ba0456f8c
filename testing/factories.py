"""Rows for tests that need jobs without going through S3 (the catalog has its own tests)."""

from __future__ import annotations

import hashlib

import sqlalchemy as sa

from scheduler import destinations, distribution, job_spec, jobs, schedule
from sql import tables
from sql.states import JobKind, RunState

# The networks of the tests' webhook receivers (all on loopback), allowed as the local
# stack's SPARKRING_ALERT_ALLOW_NETWORKS allows them.
LOOPBACK = destinations.parse_networks("127.0.0.0/8")


def resource(conn: sa.Connection, name: str = "app", content: bytes = b"print(1)\n") -> int:
    digest = hashlib.sha256(content + name.encode()).hexdigest()
    version = conn.execute(
        sa.select(sa.func.coalesce(sa.func.max(tables.resources.c.version), 0) + 1).where(
            tables.resources.c.name == name
        )
    ).scalar_one()
    return conn.execute(
        sa.insert(tables.resources)
        .values(
            name=name,
            version=version,
            sha256=digest,
            size=len(content),
            object_key=f"sha256/{digest}",
            filename=f"{name}.py",
        )
        .returning(tables.resources.c.id)
    ).scalar_one()


def job(
    engine: sa.Engine,
    name: str,
    *,
    kind: JobKind = JobKind.STREAMING,
    max_restarts: int = 3,
    start: bool = True,
    **spec: object,
) -> int:
    with engine.begin() as conn:
        job_id = jobs.create(
            conn,
            job_spec.JobSpec(
                name=name,
                kind=kind,
                resource_id=resource(conn),
                max_restarts=max_restarts,
                **spec,  # type: ignore[arg-type]
            ),
        )
        if start:
            jobs.start(conn, name)
    return job_id


def scheduled_job(
    engine: sa.Engine, name: str = "nightly", spec: str = "@every 1m", **policies: object
) -> int:
    """A batch job on ``spec`` (scheduler/schedule.parse ``policies``), switched on."""
    the_schedule = schedule.parse(spec, **policies)  # type: ignore[arg-type]
    with engine.begin() as conn:
        job_id = jobs.create(
            conn,
            job_spec.JobSpec(
                name=name,
                kind=JobKind.BATCH,
                resource_id=resource(conn),
                schedule=the_schedule.as_dict(),
            ),
        )
        jobs.start(conn, name)
    return job_id


def target(engine: sa.Engine, job_id: int, server: str | None) -> None:
    """Set a target the way the coordinator would (tests of the owner side only)."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(tables.distribution)
            .where(tables.distribution.c.job_id == job_id)
            .values(target=server)
        )


def expire_lease(engine: sa.Engine, job_id: int) -> None:
    """Move a lease into the past (instead of sleeping a whole TTL)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE distribution SET lease_until = now() - interval '1 second' "
                "WHERE job_id = :j AND owner IS NOT NULL"
            ),
            {"j": job_id},
        )


def row(engine: sa.Engine, job_id: int) -> sa.Row:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(tables.distribution).where(tables.distribution.c.job_id == job_id)
        ).one()


def owner(server: str, incarnation: str = "") -> distribution.Owner:
    """An incarnation of ``server`` for owner-side calls (one per server id by default)."""
    return distribution.Owner(server, incarnation or f"{server}-incarnation")


def crash(engine: sa.Engine, job_id: int, server: str = "s1") -> RunState:
    """Claim the job on ``server``, run it, and record its driver's crash (exit 3);
    the state it went to (backoff, or failed past its budget)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET not_before = NULL WHERE job_id = :j"), {"j": job_id}
        )
        claim = distribution.claim(conn, job_id, owner(server), ttl=30.0)
        distribution.mark_running(conn, job_id, owner(server), claim.epoch, pid=1)
        return distribution.record_crash(
            conn, job_id, owner(server), claim.epoch, "exit 3: boom",
            retry=True, backoff_base=10, backoff_max=600,
        )  # fmt: skip


def warm_offer(engine: sa.Engine, name: str = "stream", **job_fields: object) -> tuple[int, int]:
    """A streaming job running on s1 and stopping for a move to s2, a warm hand-off
    offered at its epoch (``distribution.begin_stop(warm=True)``): its id and that epoch."""
    job_id = job(engine, name, **job_fields)  # type: ignore[arg-type]
    target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner("s1"), 30.0)
        distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, 1)
    target(engine, job_id, "s2")
    with engine.begin() as conn:
        distribution.begin_stop(
            conn, job_id, owner("s1"), claim.epoch, "migrating to s2", warm=True
        )
    return job_id, claim.epoch
