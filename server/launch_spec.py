"""A driver's spec and its watchdog's finish report, from a job's definition.

:func:`build_spec` fetches and verifies the run's artifacts (``resource_center``), pins
them in its run directory, decrypts its secrets and prepares its streaming checkpoint;
:func:`finish_report` is what its watchdog needs to record the driver's own exit. Both
serve a claimed run's start (``server/launch.py``) and a warm driver's
(``server/warm.py``): each is given the identity of the run it is for (:class:`Planned`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from resource_center import catalog
from scheduler import job_views, secrets
from server import checkpoint, driver, driver_network, job_deps, run_context, rundir
from sql import states


class Planned(Protocol):
    """The identity of the run a driver is built for: a claimed run (``runs.Run``), or
    the claim a warm driver waits for (``runs.WarmRun``)."""

    @property
    def job_id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def epoch(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def revision(self) -> int | None: ...


def build_spec(
    ctx: run_context.Context,
    run: Planned,
    job: job_views.RunDefinition,
    master: str,
    *,
    run_row: Mapping[str, Any] | None = None,
    run_dir: Path | None = None,
    warm_go_timeout: float | None = None,
) -> driver.DriverSpec:
    """The run's driver spec: its artifacts fetched, verified and pinned in its run
    directory (``run_dir``, default its epoch's), its streaming checkpoint prepared.
    ``run_row``: the run row the claim moved (batch jobs: its id and fire time);
    ``warm_go_timeout``: a warm driver's (``server/warm.py``)."""
    cfg = ctx.config
    run_dir = run_dir or rundir.run_dir(cfg.work_dir, run.job_id, run.epoch)
    deps = job.deps
    artifacts = [job.resource, *job.py_files, *([deps] if deps else [])]
    fetched = [(_fetch(ctx, item["id"]), item["filename"]) for item in artifacts]
    # The run's own links, under the original names: the cache may evict them.
    pinned = driver.pin_artifacts(run_dir, fetched)
    deps_zip = pinned.pop() if deps else None
    main, *py_files = pinned
    deps_dir = job_deps.unpacked(cfg.work_dir, deps_zip, deps["sha256"]) if deps_zip else None
    env = {**(job.env or {}), **_secret_values(ctx, dict(job.secret_env or {}))}
    return driver.DriverSpec(
        job=run.name,
        kind=job.kind,
        epoch=run.epoch,
        attempt=run.attempt,
        server=cfg.server,
        main=main,
        py_files=py_files,
        conf=dict(job.conf),
        args=list(job.args),
        extra_env=env,
        master=master,
        checkpoint_dir=(
            checkpoint.prepare(cfg.checkpoint_root, run.name, run.job_id)
            if job.kind == states.JobKind.STREAMING
            else None
        ),
        run_dir=run_dir,
        revision=run.revision,
        job_id=run.job_id,
        user=cfg.run_as,
        nice=cfg.driver_nice,
        run_id=str(run_row["run_id"]) if run_row else "",
        scheduled_time=run_row["scheduled_time"] if run_row else None,
        warm_go_timeout=warm_go_timeout,
        address=cfg.driver_address,
        ui_port=driver_network.free_port(),
        deps_dir=deps_dir,
        deps_zip=deps_zip,
    )


def _secret_values(ctx: run_context.Context, secret_env: dict[str, str]) -> dict[str, str]:
    """The job's secret variables with their values as stored now: a driver started after
    a secret changed gets the new value. A secret gone fails the job (its definition
    names what does not exist); a key this server lacks defers it (another release of
    its settings may hold it)."""
    if not secret_env:
        return {}
    try:
        with ctx.engine.connect() as conn:
            return secrets.values_for(conn, secret_env, ctx.config.secret_box)
    except secrets.SecretNotFound as exc:
        raise driver.SpecError(f"secret: {exc}") from None
    except secrets.KeyProblem as exc:
        raise driver.DriverError(f"secret: {exc}") from None


def finish_report(
    ctx: run_context.Context, run: Planned, spec: driver.DriverSpec, master: str
) -> driver.FinishReport:
    """What the run's watchdog needs to record its driver's own exit. It does so for
    both kinds: the server may be stalled or dead at that moment, and neither may a
    finished generation run again nor a failed job run past its budget."""
    cfg = ctx.config
    return driver.FinishReport(
        database_url=ctx.engine.url.render_as_string(hide_password=False),
        job_id=run.job_id,
        server=ctx.owner.server,
        epoch=run.epoch,
        backoff_base=cfg.backoff_base,
        backoff_max=cfg.backoff_max,
        log_file=str(spec.run_dir / rundir.LOG_FILE),
        spark_master=master,
    )


def _fetch(ctx: run_context.Context, resource_id: int) -> Path:
    resource = catalog.get(ctx.engine, resource_id)
    return ctx.cache.fetch(ctx.bucket, resource, retry_for=ctx.config.fetch_retry, stop=ctx.stop)
