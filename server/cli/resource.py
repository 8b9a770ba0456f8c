"""``sparkring resource``: upload, list, show, delete and gc artifacts in the resource center.

``list`` and ``show`` read only PostgreSQL; ``upload``, ``delete`` and ``gc`` also talk to
S3 and fail fast with one line naming the endpoint when it is unreachable. The catalog
(and the S3 client it imports) is imported by the commands, not by the CLI's start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from resource_center import validation
from server import clients
from server import settings as settings_module
from server.cli import console

if TYPE_CHECKING:
    from resource_center import catalog

app = typer.Typer(
    no_args_is_help=True, help="Artifacts (.py, .zip, .egg, .jar) in the resource center (S3)."
)

# Files at least this large get a progress bar on a terminal, bytes.
PROGRESS_MIN_BYTES = 8 * 1024 * 1024

JSON_OPTION = typer.Option(False, "--json", help="Print JSON.")


def _settings(ctx: typer.Context) -> settings_module.Settings:
    return console.context(ctx).settings()


def _print(resource: catalog.Resource, jobs: list[str] | None = None) -> None:
    rows = [
        ("name", resource.name),
        ("version", resource.version),
        ("sha256", resource.sha256),
        ("size", f"{validation.human_size(resource.size)} ({resource.size} bytes)"),
        ("file", resource.filename),
        ("object", resource.object_key),
        ("created", resource.created_at),
    ]
    if jobs is not None:
        rows.append(("used by", ", ".join(jobs) or "-"))
    console.table(("field", "value"), rows, title=resource.reference)


@app.command()
def upload(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Resource name; each upload makes its next version."),
    file: Path = typer.Argument(..., help="A .py, .zip, .egg or .jar file."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Upload FILE as the next version of NAME (identical to the latest: no new version)."""
    from rich import progress as rich_progress

    from resource_center import catalog
    from scheduler import audit

    settings = _settings(ctx)
    # Refuse bad input before touching any service.
    validation.check_name(name)
    size = validation.check_file(file, settings.max_artifact_bytes)
    engine, bucket = clients.engine(settings), clients.bucket(settings)
    bucket.ensure_bucket()
    before = {r.id for r in catalog.list_resources(engine, name)}
    show_bar = size >= PROGRESS_MIN_BYTES and console.err.is_terminal
    with rich_progress.Progress(
        rich_progress.TextColumn("{task.description}"),
        rich_progress.BarColumn(),
        rich_progress.DownloadColumn(binary_units=True),
        rich_progress.TransferSpeedColumn(),
        rich_progress.TimeRemainingColumn(),
        console=console.err,
        transient=True,
        disable=not show_bar,
    ) as bar:
        task = bar.add_task(f"uploading {file.name}", total=size)
        resource = catalog.upload(
            engine,
            bucket,
            name=name,
            path=file,
            max_bytes=settings.max_artifact_bytes,
            progress=lambda sent: bar.advance(task, sent),
        )
    created = resource.id not in before
    audit.record_alone(
        engine,
        audit.cli_actor(),
        audit.Action.RESOURCE_UPLOADED,
        resource.reference,
        {"sha256": resource.sha256, "size": resource.size, "created": created},
    )
    if as_json:
        console.emit_json({**resource.to_json(), "created": created})
    elif created:
        console.out.print(
            f"uploaded {resource.reference} ({validation.human_size(resource.size)}, "
            f"sha256 {resource.sha256})",
            highlight=False,
        )
    else:
        console.out.print(
            f"unchanged: {resource.reference} already holds this content", highlight=False
        )


@app.command("list")
def list_(ctx: typer.Context, as_json: bool = JSON_OPTION) -> None:
    """List every version of every resource."""
    from resource_center import catalog

    resources = catalog.list_resources(clients.engine(_settings(ctx)))
    if as_json:
        console.emit_json([resource.to_json() for resource in resources])
        return
    console.table(
        ("name", "version", "size", "sha256", "file", "created"),
        (
            (
                r.name,
                r.version,
                validation.human_size(r.size),
                r.sha256[:12],
                r.filename,
                r.created_at,
            )
            for r in resources
        ),
    )


@app.command()
def show(
    ctx: typer.Context,
    reference: str = typer.Argument(..., help="NAME (latest version) or NAME:VERSION."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show one version and the jobs that use it."""
    from resource_center import catalog

    engine = clients.engine(_settings(ctx))
    resource = catalog.resolve(engine, reference)
    jobs = catalog.referencing_jobs(engine, resource)
    if as_json:
        console.emit_json({**resource.to_json(), "used_by": jobs})
    else:
        _print(resource, jobs)


@app.command()
def delete(
    ctx: typer.Context,
    reference: str = typer.Argument(..., help="NAME:VERSION, or NAME for every version."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Delete a version (or all versions of NAME); refused while any job uses one."""
    from resource_center import catalog
    from scheduler import audit

    settings = _settings(ctx)
    validation.parse_reference(reference)
    engine = clients.engine(settings)
    deleted = catalog.delete(engine, clients.bucket(settings), reference)
    audit.record_alone(
        engine,
        audit.cli_actor(),
        audit.Action.RESOURCE_DELETED,
        reference,
        {"deleted": [resource.reference for resource in deleted]},
    )
    if as_json:
        console.emit_json([resource.to_json() for resource in deleted])
    else:
        names = ", ".join(resource.reference for resource in deleted)
        console.out.print(f"deleted {names}", highlight=False)


@app.command()
def gc(ctx: typer.Context, as_json: bool = JSON_OPTION) -> None:
    """Remove objects from the bucket that no version points at."""
    from resource_center import catalog

    settings = _settings(ctx)
    removed = catalog.gc(clients.engine(settings), clients.bucket(settings))
    if as_json:
        console.emit_json({"removed": removed})
    else:
        console.out.print(f"removed {len(removed)} unreferenced object(s)", highlight=False)
        for key in removed:
            console.out.print(f"  {key}", highlight=False)


def deps_artifact(ctx: typer.Context, requirements: Path) -> catalog.Resource:
    """The deps artifact of ``requirements`` (resource_center/deps.py): found, or built
    with pip and stored now (said on stderr, with the audit event of its upload)."""
    from resource_center import deps
    from scheduler import audit

    settings = _settings(ctx)
    engine, bucket = clients.engine(settings), clients.bucket(settings)
    bucket.ensure_bucket()
    console.err.print(
        f"dependencies of {requirements}: looking for a build", highlight=False, soft_wrap=True
    )
    resource, built = deps.ensure(
        engine, bucket, requirements, max_bytes=settings.max_artifact_bytes
    )
    if built:
        audit.record_alone(
            engine,
            audit.cli_actor(),
            audit.Action.RESOURCE_UPLOADED,
            resource.reference,
            {"sha256": resource.sha256, "size": resource.size, "created": True},
        )
    said = "built and stored" if built else "already built"
    console.err.print(
        f"dependencies of {requirements}: {said} as {resource.reference} "
        f"({validation.human_size(resource.size)})",
        highlight=False,
        soft_wrap=True,
    )
    return resource


@app.command("build-deps")
def build_deps(
    ctx: typer.Context,
    requirements: Path = typer.Argument(..., help="A pip requirements file."),
) -> None:
    """Build a requirements file into a deps artifact (pip install --target with the
    servers' Python, zipped) unless one is stored for the same text and Python; print
    its reference (for the API's 'deps' field; 'job create --requirements' does this
    itself). A failed build prints pip's last lines."""
    resource = deps_artifact(ctx, requirements)
    console.out.print(resource.reference, highlight=False)
