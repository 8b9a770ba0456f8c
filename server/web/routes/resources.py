"""Artifacts of the resource center: list, show, upload (the validation of ``sparkring
resource upload``) and delete."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, UploadFile

from resource_center import catalog, store
from scheduler import audit
from server.web import auth, contract, dependencies

log = logging.getLogger(__name__)


router = APIRouter(tags=["resources"], responses=contract.errors(*contract.READ))
viewer = Depends(auth.reader)
operator = Depends(auth.writer)
API = contract.API

# ---------------------------------------------------------------- reads


@router.get(f"{API}/resources")
def list_resources(
    backend: dependencies.AppBackend, principal: auth.Caller = viewer
) -> list[dict[str, Any]]:
    """Every artifact version (name, version, sha256, size, file name)."""
    return [contract.plain(dataclasses.asdict(r)) for r in catalog.list_resources(backend.engine)]


@router.get(f"{API}/resources/{{reference}}", responses=contract.errors(404, 422))
def show_resource(
    reference: contract.Reference, backend: dependencies.AppBackend, principal: auth.Caller = viewer
) -> dict[str, Any]:
    """One artifact version (NAME for the latest, or NAME:VERSION) and its users."""
    resource = catalog.resolve(backend.engine, reference)
    return {
        **contract.plain(dataclasses.asdict(resource)),
        "jobs": catalog.referencing_jobs(backend.engine, resource),
    }


# ---------------------------------------------------------------- writes


def _bucket(backend: dependencies.Backend) -> store.Store:
    if backend.bucket is None:
        raise contract.ApiError(503, "this server has no resource center configured")
    return backend.bucket


one = f"{API}/resources/{{reference}}"
by_reference = {"reference": "$response.body#/name"}


# One path for the three (so a 405's Allow is the same for every method's view of
# it); an upload takes a NAME, never a version.
@router.post(
    one,
    status_code=201,
    responses={
        **contract.errors(*contract.WRITE),
        **contract.linked(
            201,
            show=("GET", one, by_reference),
            delete=("DELETE", one, by_reference),
        ),
    },
)
def upload_resource(
    name: contract.ResourceName,
    file: Annotated[UploadFile, File(description="The artifact (.py, .zip, .egg, .jar).")],
    backend: dependencies.AppBackend,
    principal: auth.Caller = operator,
) -> dict[str, Any]:
    """Store a file as the next version of NAME (multipart form field ``file``), with
    the validation of ``sparkring resource upload``: name, kind, size, checksum.
    Content already stored under NAME as its latest version is not stored again."""
    filename = Path(file.filename or "").name
    if not filename or filename in (".", ".."):
        raise contract.ApiError(400, "the upload has no file name (multipart field 'file')")
    if file.size is not None and file.size > backend.max_artifact_bytes:
        raise contract.ApiError(
            413,
            f"{filename} is {file.size} bytes, above the limit of "
            f"{backend.max_artifact_bytes} (SPARKRING_MAX_ARTIFACT_BYTES)",
        )
    before = {r.id for r in catalog.list_resources(backend.engine, name)}
    with tempfile.TemporaryDirectory(prefix="sparkring-upload-") as folder:
        path = Path(folder) / filename
        with path.open("wb") as out:
            shutil.copyfileobj(file.file, out, 1024 * 1024)
        resource = catalog.upload(
            backend.engine,
            _bucket(backend),
            name=name,
            path=path,
            max_bytes=backend.max_artifact_bytes,
        )
    created = resource.id not in before
    audit.record_alone(
        backend.engine,
        principal.actor,
        audit.Action.RESOURCE_UPLOADED,
        resource.reference,
        {"sha256": resource.sha256, "size": resource.size, "created": created},
    )
    log.info(
        "resource uploaded over HTTP",
        extra={"action": "upload", "resource": resource.reference, "by": principal.actor},
    )
    return contract.plain(dataclasses.asdict(resource))


@router.delete(one, responses=contract.errors(*contract.WRITE, 404, 409))
def delete_resource(
    reference: contract.Reference,
    backend: dependencies.AppBackend,
    principal: auth.Caller = operator,
) -> dict[str, Any]:
    """Delete NAME:VERSION, or every version of NAME; refused (409, naming the jobs)
    while a job references a version to delete."""
    deleted = catalog.delete(backend.engine, _bucket(backend), reference)
    audit.record_alone(
        backend.engine,
        principal.actor,
        audit.Action.RESOURCE_DELETED,
        reference,
        {"deleted": [r.reference for r in deleted]},
    )
    return {"deleted": [r.reference for r in deleted]}
