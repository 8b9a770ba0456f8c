"""Named, versioned artifacts: the ``resources`` table over the content-addressed bucket.

A version is a row (name, version, sha256, size, object_key, filename). ``NAME``
resolves to the highest version, ``NAME:VERSION`` pins one. Rows are immutable; the
only transitions are:

- upload: nothing -> version N+1 of NAME, one INSERT, only after the object under
  ``sha256/<hex>`` is in the bucket and its bytes, read back, hash to that sha256. Any
  failure before the INSERT commits leaves no row. Uploading content identical to the
  latest version of NAME (same sha256 and file name) returns that version unchanged;
  the same content under a new name or file name makes a new row sharing the object.
- delete: version(s) -> nothing, one DELETE, refused while a job references any of
  them (checked and named here; ON DELETE RESTRICT guards the race). The object goes
  too when no remaining version points at it.
- gc: removes objects that no version points at.

Concurrency: versions of one name are numbered under a per-name transaction advisory
lock (``max + 1``), so concurrent uploads get distinct versions and none is lost.
Upload holds a shared "objects" advisory lock from before it stores the object until
its row commits; delete and gc hold it exclusively, so they never remove an object
that an upload in flight is about to point at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from resource_center import errors, store, validation
from sql import tables

log = logging.getLogger(__name__)

# Advisory lock keys (two int4 form); the first number is this module's namespace.
_NAME_LOCK_SPACE = 0x73726331  # per-name version numbering: (space, hashtext(name))
_OBJECTS_LOCK = (0x73726332, 0)  # shared by uploads, exclusive for delete and gc

_r = tables.resources


@dataclasses.dataclass(frozen=True)
class Resource:
    """One immutable version of a named artifact."""

    id: int
    name: str
    version: int
    sha256: str
    size: int
    object_key: str
    filename: str
    created_at: datetime

    @property
    def reference(self) -> str:
        return f"{self.name}:{self.version}"

    @property
    def suffix(self) -> str:
        return validation.suffix(self.filename)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "sha256": self.sha256,
            "size": self.size,
            "object_key": self.object_key,
            "filename": self.filename,
            "created_at": self.created_at.isoformat(),
        }


_COLUMNS = tuple(_r.c[field.name] for field in dataclasses.fields(Resource))


def _resource(row: sa.Row[Any]) -> Resource:
    return Resource(**row._mapping)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(store.CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _store_verified(
    bucket: store.Store,
    key: str,
    path: Path,
    sha256: str,
    size: int,
    progress: store.Progress | None,
) -> bool:
    """Make ``key`` hold exactly the file's bytes, verified by reading them back.

    Returns False when an intact object was already there (nothing sent). An object
    under the key whose bytes do not hash to the key (corrupted in the bucket) is
    replaced. A read-back mismatch removes what was written and refuses.
    """
    if bucket.exists(key) and bucket.sha256(key) == (sha256, size):
        if progress is not None:
            progress(size)
        return False
    sent = bucket.put(key, path, size, progress)
    if sent != sha256:
        # What was stored is not what the key promises: never leave it under that key.
        bucket.remove(key)
        raise errors.InvalidResource(f"{path.name} changed while it was being uploaded")
    if bucket.sha256(key) != (sha256, size):
        bucket.remove(key)
        raise errors.IntegrityError(
            f"upload of {path.name} to {bucket.describe(key)} did not verify: the stored "
            "bytes do not match its sha256"
        )
    return True


def upload(
    engine: Engine,
    bucket: store.Store,
    *,
    name: str,
    path: Path,
    max_bytes: int,
    progress: store.Progress | None = None,
) -> Resource:
    """Store a file as the next version of ``name`` (see the module docstring)."""
    validation.check_name(name)
    size = validation.check_file(path, max_bytes)
    sha256 = file_sha256(path)
    key = store.object_key(sha256)
    with engine.begin() as connection:
        connection.execute(sa.select(sa.func.pg_advisory_xact_lock_shared(*_OBJECTS_LOCK)))
        sent = _store_verified(bucket, key, path, sha256, size, progress)
        connection.execute(
            sa.select(sa.func.pg_advisory_xact_lock(_NAME_LOCK_SPACE, sa.func.hashtext(name)))
        )
        latest = _latest(connection, name)
        if latest is not None and (latest.sha256, latest.filename) == (sha256, path.name):
            log.info(
                "upload unchanged",
                extra={"action": "upload", "resource": latest.reference, "sha256": sha256},
            )
            return latest
        row = connection.execute(
            sa.text(
                "INSERT INTO resources (name, version, sha256, size, object_key, filename) "
                "SELECT :name, coalesce(max(version), 0) + 1, :sha256, :size, :key, :filename "
                "FROM resources WHERE name = :name "
                "RETURNING id, name, version, sha256, size, object_key, filename, created_at"
            ),
            {"name": name, "sha256": sha256, "size": size, "key": key, "filename": path.name},
        ).one()
    resource = _resource(row)
    log.info(
        "uploaded",
        extra={
            "action": "upload",
            "resource": resource.reference,
            "sha256": sha256,
            "size": size,
            "bytes_sent": size if sent else 0,
        },
    )
    return resource


def _latest(connection: sa.Connection, name: str) -> Resource | None:
    row = connection.execute(
        sa.select(*_COLUMNS).where(_r.c.name == name).order_by(_r.c.version.desc()).limit(1)
    ).first()
    return None if row is None else _resource(row)


def _unknown(connection: sa.Connection, ref: validation.Reference) -> errors.UnknownResource:
    latest = _latest(connection, ref.name)
    if latest is None:
        return errors.UnknownResource(f"no resource named {ref.name!r}")
    return errors.UnknownResource(
        f"resource {ref.name!r} has no version {ref.version} (latest is {latest.reference})"
    )


def _find(connection: sa.Connection, ref: validation.Reference) -> Resource:
    if ref.version is None:
        found = _latest(connection, ref.name)
    else:
        row = connection.execute(
            sa.select(*_COLUMNS).where(_r.c.name == ref.name, _r.c.version == ref.version)
        ).first()
        found = None if row is None else _resource(row)
    if found is None:
        raise _unknown(connection, ref)
    return found


def resolve(engine: Engine, reference: str) -> Resource:
    """``NAME`` -> its latest version, ``NAME:VERSION`` -> that version."""
    ref = validation.parse_reference(reference)
    with engine.connect() as connection:
        return _find(connection, ref)


def get(engine: Engine, resource_id: int) -> Resource:
    with engine.connect() as connection:
        row = connection.execute(sa.select(*_COLUMNS).where(_r.c.id == resource_id)).first()
    if row is None:
        raise errors.UnknownResource(f"no resource with id {resource_id}")
    return _resource(row)


def list_resources(engine: Engine, name: str | None = None) -> list[Resource]:
    """Every version (of one name, if given), by name then version."""
    query = sa.select(*_COLUMNS).order_by(_r.c.name, _r.c.version)
    if name is not None:
        query = query.where(_r.c.name == validation.check_name(name))
    with engine.connect() as connection:
        return [_resource(row) for row in connection.execute(query)]


def _referencing_jobs(connection: sa.Connection, resource_ids: list[int]) -> list[str]:
    jobs, py_files = tables.jobs, tables.job_py_files
    revisions, revision_py_files = tables.job_revisions, tables.job_revision_py_files
    main = sa.select(jobs.c.name).where(jobs.c.resource_id.in_(resource_ids))
    extra = (
        sa.select(jobs.c.name)
        .join(py_files, py_files.c.job_id == jobs.c.id)
        .where(py_files.c.resource_id.in_(resource_ids))
    )
    # Any revision a job can be rolled back to pins its versions as well.
    kept_main = (
        sa.select(jobs.c.name)
        .join(revisions, revisions.c.job_id == jobs.c.id)
        .where(revisions.c.resource_id.in_(resource_ids))
    )
    kept_extra = (
        sa.select(jobs.c.name)
        .join(revision_py_files, revision_py_files.c.job_id == jobs.c.id)
        .where(revision_py_files.c.resource_id.in_(resource_ids))
    )
    # A job's dependencies (resource_center/deps.py), now and in any revision.
    deps = sa.select(jobs.c.name).where(jobs.c.deps_id.in_(resource_ids))
    kept_deps = (
        sa.select(jobs.c.name)
        .join(revisions, revisions.c.job_id == jobs.c.id)
        .where(revisions.c.deps_id.in_(resource_ids))
    )
    both = sa.union(main, extra, kept_main, kept_extra, deps, kept_deps)
    return sorted(connection.execute(both).scalars())


def referencing_jobs(engine: Engine, resource: Resource) -> list[str]:
    """Names of the jobs that use this version, as main artifact or in --py-files, in
    their current revision or an earlier one (a rollback may need it again)."""
    with engine.connect() as connection:
        return _referencing_jobs(connection, [resource.id])


def _in_use(label: str, jobs: list[str]) -> errors.ResourceInUse:
    noun = "job" if len(jobs) == 1 else "jobs"
    return errors.ResourceInUse(
        f"resource {label} is used by {noun} {', '.join(jobs)}: delete those jobs first "
        "(every revision of a job keeps its artifact versions)"
    )


def delete(engine: Engine, bucket: store.Store, reference: str) -> list[Resource]:
    """Delete ``NAME:VERSION``, or every version of ``NAME``; all or nothing.

    Refused, naming the jobs, while any job references a version to delete. Objects
    left without a version are removed from the bucket; if S3 is unreachable for that
    they stay behind for ``gc`` (an orphan object is harmless, a row without its object
    would not be).
    """
    ref = validation.parse_reference(reference)
    with engine.connect() as connection:
        # A session lock (not a transaction lock): it must outlive the DELETE's commit
        # until the orphaned objects are removed, so no upload reuses one meanwhile.
        connection.execute(sa.select(sa.func.pg_advisory_lock(*_OBJECTS_LOCK)))
        connection.commit()
        try:
            victims, orphans = _delete_rows(connection, ref)
            for key in orphans:
                try:
                    bucket.remove(key)
                except errors.StoreError as exc:
                    log.warning(
                        "object left for gc",
                        extra={"action": "delete", "object_key": key, "error": str(exc)},
                    )
        finally:
            connection.execute(sa.select(sa.func.pg_advisory_unlock(*_OBJECTS_LOCK)))
            connection.commit()
    for victim in victims:
        log.info("deleted", extra={"action": "delete", "resource": victim.reference})
    return victims


def _delete_rows(
    connection: sa.Connection, ref: validation.Reference
) -> tuple[list[Resource], list[str]]:
    label = str(ref)
    with connection.begin():
        query = sa.select(*_COLUMNS).where(_r.c.name == ref.name).with_for_update()
        if ref.version is not None:
            query = query.where(_r.c.version == ref.version)
        victims = [_resource(row) for row in connection.execute(query.order_by(_r.c.version))]
        if not victims:
            raise _unknown(connection, ref)
        ids = [victim.id for victim in victims]
        users = _referencing_jobs(connection, ids)
        if users:
            raise _in_use(label, users)
        try:
            with connection.begin_nested():
                deleted = connection.execute(sa.delete(_r).where(_r.c.id.in_(ids))).rowcount
        except sa.exc.IntegrityError:
            # A job committed a reference after the check above; RESTRICT caught it.
            raise _in_use(label, _referencing_jobs(connection, ids) or ["(just created)"]) from None
        if deleted != len(ids):
            raise errors.UnknownResource(f"resource {label} was deleted concurrently")
        keys = {victim.object_key for victim in victims}
        still_used = set(
            connection.execute(
                sa.select(_r.c.object_key).where(_r.c.object_key.in_(keys)).distinct()
            ).scalars()
        )
    return victims, sorted(keys - still_used)


def gc(engine: Engine, bucket: store.Store) -> list[str]:
    """Remove every artifact object that no version points at; the removed keys."""
    with engine.begin() as connection:
        connection.execute(sa.select(sa.func.pg_advisory_xact_lock(*_OBJECTS_LOCK)))
        referenced = set(connection.execute(sa.select(_r.c.object_key).distinct()).scalars())
        orphans = [key for key in bucket.keys() if key not in referenced]
        for key in orphans:
            bucket.remove(key)
    log.info("gc", extra={"action": "gc", "removed": len(orphans)})
    return orphans
