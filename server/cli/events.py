"""``sparkring events``: the cluster's history as a whole (pruning it)."""

from __future__ import annotations

import typer

from server import clients, defaults, exit_codes, retention
from server import settings as settings_module
from server.cli import console

app = typer.Typer(no_args_is_help=True, help="Prune the history of jobs (events, driver logs).")


def _duration(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return settings_module.parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--older-than'") from None


@app.command()
def prune(
    ctx: typer.Context,
    older_than: str | None = typer.Option(
        None,
        "--older-than",
        metavar="DURATION",
        help="Delete history older than this: 30d, 12h, 90m, 3600s or seconds "
        "[default: SPARKRING_HISTORY_RETENTION, else 30d].",
        show_default=False,
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Only count what would be deleted; delete nothing."
    ),
    batch_size: int = typer.Option(
        defaults.HISTORY_PRUNE_BATCH,
        "--batch-size",
        min=1,
        metavar="N",
        help="Job events deleted per transaction.",
    ),
    events_only: bool = typer.Option(
        False,
        "--events-only",
        help="Prune job events only, not the driver logs in S3 (no S3 settings needed).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Delete job events and shipped driver logs (S3 objects under logs/) older than
    DURATION, in batches of short transactions. The newest event and the newest log of
    every job that still exists are always kept. Servers do this by themselves every
    hour with SPARKRING_HISTORY_RETENTION; this command is for a one-off cleanup."""
    settings = console.context(ctx).settings()
    seconds = _duration(older_than)
    if seconds is None:
        if settings.history_retention <= 0:
            raise console.fail(
                "SPARKRING_HISTORY_RETENTION is 0 (keep history forever): "
                "give --older-than DURATION to prune anyway",
                exit_codes.ExitCode.USAGE,
            )
        seconds = settings.history_retention
    bucket = None if events_only else clients.bucket(settings)
    engine = console.engine(ctx)
    with engine.connect() as conn:
        before = retention.cutoff(conn, seconds)
        pruned = retention.prune(conn, bucket, before, batch_size=batch_size, dry_run=dry_run)
    if as_json:
        console.emit_json(pruned.as_dict())
        return
    verb = "would delete" if dry_run else "deleted"
    batches = "transaction" if pruned.event_batches == 1 else "transactions"
    line = f"{verb} {pruned.events} job events ({pruned.event_batches} {batches}"
    if not dry_run and pruned.event_batches:
        line += f", longest {pruned.longest_batch_s:.3f} s"
    line += f"), {pruned.runs} runs, {pruned.deliveries} alert deliveries"
    line += "" if pruned.logs is None else f" and {pruned.logs} driver logs"
    line += f" older than {pruned.cutoff:%Y-%m-%d %H:%M:%S} UTC"
    if pruned.logs is None:
        line += "; driver logs not touched (--events-only)"
    console.out.print(line, highlight=False)
