"""``sparkring apply -f jobs.toml``: create, revise, start, stop and prune the jobs a spec
file defines (``server/cli/spec.py``; the schema is in docs/jobs.md). The spec machinery and
the S3 client are imported by the command, not by the CLI's start-up."""

from __future__ import annotations

from pathlib import Path

import typer

from server.cli import console


def apply(
    ctx: typer.Context,
    file: Path = typer.Option(
        ..., "--file", "-f", help="TOML spec of the jobs (docs/jobs.md).", dir_okay=False
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the plan (create, update with diff, unchanged, delete)."
    ),
    prune: bool = typer.Option(
        False,
        "--prune",
        help="Also delete the jobs that carry the file's label but are no longer in it.",
    ),
    stop_timeout: float = typer.Option(
        120.0, "--stop-timeout", min=0, help="How long --prune waits for a job to stop, seconds."
    ),
) -> None:
    """Make the cluster's jobs what FILE says: create the new ones, make a new revision of
    those that differ (a running streaming job rolls to it), start or stop them as the
    file says. Idempotent: a second apply of the same file changes nothing. An invalid
    file is refused with every error and its location; nothing is applied then. Local
    artifact files are uploaded only when their content is new."""
    from scheduler import audit
    from server import clients
    from server.cli import spec as spec_apply

    try:
        spec = spec_apply.parse(file)
    except spec_apply.SpecError as exc:
        for line in exc.errors:
            console.fail(line)
        raise typer.Exit(1) from None
    settings = console.context(ctx).settings()
    engine = console.engine(ctx)
    try:
        with engine.connect() as conn:
            steps = spec_apply.plan(conn, spec, prune=prune)
    except spec_apply.SpecError as exc:
        for line in exc.errors:
            console.fail(line)
        raise typer.Exit(1) from None
    for step in steps:
        console.out.print(spec_apply.describe(step), markup=False, highlight=False)
    for item in spec_apply.uploads(steps):
        console.out.print(
            f"upload    {item.artifact.name} ({item.artifact.path}, new content)",
            markup=False,
            highlight=False,
        )
    counts = {a: sum(s.action == a for s in steps) for a in ("create", "update", "delete")}
    summary = ", ".join(f"{n} to {a}" for a, n in counts.items() if n) or "nothing to change"
    if dry_run:
        console.out.print(f"dry run: {summary}; nothing applied")
        return
    if not any(counts.values()):
        console.out.print("nothing to change")
        return
    bucket = clients.bucket(settings) if spec_apply.uploads(steps) else None
    if bucket is not None:
        bucket.ensure_bucket()
    spec_apply.execute(
        engine,
        bucket,  # type: ignore[arg-type]
        spec,
        steps,
        max_bytes=settings.max_artifact_bytes,
        actor=audit.cli_actor(),
        stop_timeout=stop_timeout,
        say=lambda line: console.out.print(line, markup=False, highlight=False),
    )
    console.out.print(f"applied: {summary.replace(' to ', ' ')}")
