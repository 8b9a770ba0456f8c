"""``sparkring job logs``: a driver's log, from its server while it runs, else as shipped
to S3; ``--follow`` across runs. ZooKeeper's and S3's libraries are imported here only
when the command needs them, so ``job list`` starts in a fraction of the time."""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from scheduler import job_views, tokens
from server import clients
from server.cli import console
from sql.states import RunState

# Exit code of a `job logs --follow` ended with Ctrl-C (128 + SIGINT, as a shell reports it).
FOLLOW_INTERRUPTED = 130
# `job logs --follow` across runs: how long it waits for the job's next run after one
# ended while the job is still wanted running (a restart, a roll, a failover), and how
# often it reads the job meanwhile, seconds; the exit code when no run came.
FOLLOW_NEXT_RUN_S = 120.0
FOLLOW_NEXT_POLL_S = 0.5
FOLLOW_NO_NEXT_RUN = 1
# The largest run id PostgreSQL's bigint holds (a larger --run would be a database error).
BIGINT_MAX = 2**63 - 1


def logs(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    lines: int = typer.Option(200, "--lines", "-n", min=1, help="Last N lines."),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Then keep printing what the driver writes. When a run ends and the job is "
        "still wanted running (a restart, a new revision, a failover), follow its next "
        "run; when the job is stopped, finished or failed, say so on stderr and exit 0; "
        f"exit {FOLLOW_NO_NEXT_RUN} if no next run starts within {FOLLOW_NEXT_RUN_S:g} s "
        "(Ctrl-C stops following). Without a live run: the last run's log. With --epoch "
        "of the live driver: that driver only, until it ends.",
    ),
    epoch: int | None = typer.Option(
        None,
        "--epoch",
        min=1,
        help="The log of this epoch's driver (each claim of the job is an epoch: 'job "
        "events' lists them), any job's: from its server while it runs, else from S3, "
        "kept under history retention (SPARKRING_HISTORY_RETENTION, 30d by default).",
    ),
    run_id: int | None = typer.Option(
        None,
        "--run",
        min=1,
        help="A batch job: the log of this run (see 'job runs'), of its last attempt "
        "unless --attempt; kept under history retention.",
    ),
    attempt: int | None = typer.Option(
        None,
        "--attempt",
        min=1,
        help="With --run: the log of the run's K-th attempt (1: its first driver). Each "
        "attempt (a retry, a run again after a lost server) is an epoch of its own.",
    ),
) -> None:
    """The driver log of the current run (from its server) or of the last run (from S3),
    as the driver wrote it (piped through unchanged; a follow's streams end with one
    '[sparkring] follow ended: ...' line saying why). An earlier driver's: --epoch N, or
    --run ID [--attempt K] for a batch run's."""
    _check_log_options(epoch, run_id, attempt, follow)
    settings = console.context(ctx).settings()
    engine = console.engine(ctx)
    with engine.begin() as conn:
        job = job_views.show(conn, name)
        secret = tokens.cluster_secret(conn)
    if run_id is not None:
        _run_log(engine, settings, job, run_id, attempt, lines, secret)
        return
    if epoch is not None:
        _epoch_log(engine, settings, job, epoch, lines, secret, follow)
        return
    if follow and job.owner:
        stream = _follow_live(settings, job, lines, secret)
        if stream is not None:
            try:
                _follow_runs(engine, settings, job, lines, secret, stream)
            except KeyboardInterrupt:
                raise typer.Exit(FOLLOW_INTERRUPTED) from None
            return
    text = _live_log(settings, job, lines, secret) if job.owner else None
    if text is None:
        text = _shipped_log(settings, job, lines)
    if text is None:
        raise console.fail(f"job {name} has no driver log yet")
    if follow:
        console.err.print(f"job {name} has no live run: the log of its last run", soft_wrap=True)
    console.write_raw(text)


def _check_log_options(
    epoch: int | None, run_id: int | None, attempt: int | None, follow: bool
) -> None:
    """``job logs``: the combinations of options that name no log, refused by name."""
    if epoch is not None and run_id is not None:
        raise console.fail(
            "--epoch and --run exclude each other (a run's attempt: --run ID --attempt K)"
        )
    if attempt is not None and run_id is None:
        raise console.fail("--attempt needs --run (the run whose attempt it is)")
    if run_id is not None and follow:
        raise console.fail("--run and --follow exclude each other")


def _epoch_log(
    engine: Any,
    settings: Any,
    job: job_views.JobView,
    epoch: int,
    lines: int,
    secret: str,
    follow: bool,
) -> None:
    """``job logs --epoch``: that driver's log (``past_logs.epoch_log``); with
    ``--follow``, the live driver's until it ends."""
    from server import past_logs

    if follow:
        if not past_logs.is_live(job, epoch):
            raise console.fail(
                f"--follow: the driver of epoch {epoch} of job {job.name} is not the live "
                "one, so its log is complete: drop --follow"
            )
        stream = _follow_live(settings, job, lines, secret)
        if stream is not None:
            try:
                _follow_runs(engine, settings, job, lines, secret, stream, this_run=True)
            except KeyboardInterrupt:
                raise typer.Exit(FOLLOW_INTERRUPTED) from None
            return
    _print_past_log(settings, job, epoch, lines, secret)


def _print_past_log(
    settings: Any,
    job: job_views.JobView,
    epoch: int,
    lines: int,
    secret: str,
    what: str | None = None,
) -> None:
    from server import past_logs

    try:
        text = past_logs.epoch_log(
            job,
            epoch,
            live=lambda: _live_log(settings, job, lines, secret),
            shipped=lambda e: _shipped_epoch(clients.bucket(settings), job, e, lines),
            what=what,
        )
    except past_logs.Missing as exc:
        raise console.fail(str(exc)) from None
    console.write_raw(text)


def _run_log(
    engine: Any,
    settings: Any,
    job: job_views.JobView,
    run_id: int,
    attempt: int | None,
    lines: int,
    secret: str,
) -> None:
    """``job logs --run [--attempt]``: the log of the run's attempt (its last by
    default), an epoch of its own: live from its owner while it runs, else from S3."""
    from scheduler import runs as run_rows
    from server import past_logs

    run = None
    if run_id <= BIGINT_MAX:  # a larger id is no run's (and no bigint)
        with engine.connect() as conn:
            run = run_rows.of_job(conn, job.id, run_id)
    try:
        attempt, epoch = past_logs.run_attempt(job, run_id, run, attempt)
    except past_logs.Missing as exc:
        raise console.fail(str(exc)) from None
    what = past_logs.attempt_label(run_id, attempt, epoch)
    _print_past_log(settings, job, epoch, lines, secret, what)


def _follow_runs(
    engine: Any,
    settings: Any,
    job: job_views.JobView,
    lines: int,
    secret: str,
    stream: Any,
    this_run: bool = False,
) -> None:
    """Print ``stream``; when it ends, follow the same run again (it went idle or hit
    its time limit) or the job's next run, until the job is no longer wanted running.
    ``this_run`` (``--epoch``): never the next run; say that this one ended."""
    from server.web import livelog

    name = job.name
    while True:
        tail = b""
        for chunk in stream:
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            tail = (tail + chunk)[-1024:]
        run_ended = livelog.ENDED + livelog.RUN_ENDED.encode() in tail
        deadline = time.monotonic() + FOLLOW_NEXT_RUN_S
        while True:
            with engine.connect() as conn:
                now = job_views.show(conn, name)
            new_run = now.epoch != job.epoch
            if this_run and (run_ended or new_run or not now.owner):
                console.err.print(
                    f"job {name}: the driver of epoch {job.epoch} ended", soft_wrap=True
                )
                return
            if now.desired != "running" or now.state in (
                RunState.FINISHED,
                RunState.FAILED,
            ):
                console.err.print(
                    f"job {name}: the run ended; the job is {now.state}", soft_wrap=True
                )
                return
            if now.owner and (new_run or not run_ended):
                stream = _follow_live(settings, now, lines if new_run else 0, secret)
                if stream is not None:
                    if new_run:
                        console.err.print(
                            f"job {name}: following its next run (epoch {now.epoch} on "
                            f"{now.owner})",
                            soft_wrap=True,
                        )
                    job = now
                    break
            if time.monotonic() >= deadline:
                raise console.fail(
                    f"job {name}: no run to follow within {FOLLOW_NEXT_RUN_S:g} s "
                    f"(state {now.state})",
                    FOLLOW_NO_NEXT_RUN,
                )
            time.sleep(FOLLOW_NEXT_POLL_S)


def _follow_live(settings: Any, job: job_views.JobView, lines: int, secret: str) -> Any:
    """The owner's live log, streamed (``livelog.follow_remote``), or None."""
    from server.web import livelog

    info = _owner(settings, job)
    if info is None:
        return None
    return livelog.follow_remote(
        info.health_url, job.name, lines, secret, verify=_peer_tls(settings)
    )


def _peer_tls(settings: Any) -> Any:
    """What the CLI verifies a server's HTTPS listener with (SPARKRING_TLS_CA)."""
    from server import tls

    try:
        return tls.client_context(settings.tls_ca)
    except tls.TlsError as exc:
        raise console.fail(str(exc)) from None


def _owner(settings: Any, job: job_views.JobView) -> Any:
    """The registry entry of the job's owner with an HTTP address, or None."""
    try:
        live = {info.id: info for info in clients.live_servers(settings)}
    except Exception:  # the registry is optional here: fall back to the shipped log
        return None
    info = live.get(job.owner)
    if info is None or not info.health_url:
        return None
    return info


def _live_log(settings: Any, job: job_views.JobView, lines: int, secret: str) -> str | None:
    from server.web import livelog

    info = _owner(settings, job)
    if info is None:
        return None
    # The owner serves logs only to token holders: the CLI presents the cluster credential.
    return livelog.fetch(info.health_url, job.name, lines, secret, verify=_peer_tls(settings))


def _shipped_log(
    settings: Any, job: job_views.JobView, lines: int, attempts: int = 3
) -> str | None:
    """The newest log shipped of the job's last ``attempts`` epochs, or None."""
    bucket = clients.bucket(settings)
    for epoch in range(job.epoch, max(job.epoch - attempts, 0), -1):
        text = _shipped_epoch(bucket, job, epoch, lines)
        if text is not None:
            return text
    return None


def _shipped_epoch(bucket: Any, job: job_views.JobView, epoch: int, lines: int) -> str | None:
    """The tail of the log the job's driver of ``epoch`` shipped to ``bucket``, or None."""
    from server import log_shipping
    from server.web import livelog

    return livelog.shipped_run(
        bucket,
        log_shipping.log_key(job.name, job.id, epoch),
        log_shipping.legacy_log_key(job.name, epoch),
        job.created_at,
        lines,
    )
