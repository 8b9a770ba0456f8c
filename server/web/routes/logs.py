"""Driver logs: ``/logs/<job>`` (a run on this server, read by peers with the cluster
credential) and ``/api/v1/jobs/<name>/logs`` (the run wherever it is: here, its owner
over HTTP, or the log shipped to S3), each a tail or a bounded live follow; with
``epoch=N`` the log of that epoch's driver, and ``/api/v1/jobs/<name>/runs/<id>/logs``
a batch run's attempt (server/past_logs.py), each a tail."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio.from_thread
import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.background import BackgroundTask

from scheduler import job_views, runs, tokens
from server import past_logs
from server.web import auth, contract, dependencies, livelog

Lines = Annotated[
    int, Query(ge=0, le=livelog.MAX_LINES, description="Lines of the tail (0: none).")
]
Follow = Annotated[
    bool,
    Query(description="Stream what the run writes until it ends (bounded: see livelog)."),
]
Epoch = Annotated[
    int | None,
    Query(
        ge=1,
        le=contract.BIGINT_MAX,
        description="The log of this epoch's driver (each claim of the job is an epoch), "
        "kept under history retention; follow=true follows it only while it is the live one.",
    ),
]
RunId = Annotated[
    int, PathParam(ge=1, le=contract.BIGINT_MAX, description="A run of the job (its runs).")
]
Attempt = Annotated[
    int | None,
    Query(
        ge=1,
        le=contract.INTEGER_MAX,
        description="The run's K-th attempt (1: its first driver); default its last.",
    ),
]
TEXT = {
    200: {
        "description": "The log, as plain text (streamed with follow=true).",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}
TAIL = {
    200: {
        "description": "The tail of the log, as plain text.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


router = APIRouter(responses=contract.errors_beside_text(*contract.READ, 404, 422))
# The routes that may stream (follow=true) may also be refused for too many follows.
streams = {**TEXT, **contract.errors_beside_text(429)}
viewer = Depends(auth.reader)


async def _follow_gate(request: Request) -> livelog.FollowGate:
    """The app's gate on open follows (``api.create_app`` keeps one per app)."""
    return request.app.state.follows


# A route's parameter: the follows this server admits (no input, not in the OpenAPI
# document).
Follows = Annotated[livelog.FollowGate, Depends(_follow_gate)]


def _streamed(stream: AsyncIterator[bytes], release: Callable[[], None]) -> Response:
    # The release also runs as a background task: a stream never iterated (the
    # client gone before the first byte) gives its place back too.
    return StreamingResponse(
        livelog.gated(stream, release),
        media_type="text/plain",
        background=BackgroundTask(release),
    )


def _admit(follows: livelog.FollowGate, principal: tokens.Principal) -> Callable[[], None]:
    try:
        return follows.admit(principal.name, counted=principal.role != tokens.Role.CLUSTER)
    except livelog.FollowRefused as exc:
        raise contract.ApiError(429, str(exc)) from None


@router.get("/logs/{job}", tags=["logs"], response_class=PlainTextResponse, responses=streams)
async def local_log(
    job: contract.JobName,
    backend: dependencies.AppBackend,
    follows: Follows,
    principal: auth.Caller = viewer,
    lines: Lines = 200,
    follow: Follow = False,
) -> Response:
    """The tail of a driver log of a job running on this server (``lines=0`` with
    ``follow``: only what is written from now on)."""
    path = backend.log_file(job)
    if path is None or not path.exists():
        raise contract.ApiError(404, f"no run of {job} here")
    if follow:
        release = _admit(follows, principal)
        stream = livelog.follow(path, lines, lambda: backend.log_file(job) == path)
        return _streamed(stream, release)
    text = await anyio.to_thread.run_sync(livelog.tail, path, lines)
    return PlainTextResponse(text)


@router.get(
    f"{contract.API}/jobs/{{name}}/logs",
    tags=["jobs"],
    response_class=PlainTextResponse,
    responses=streams,
)
def job_logs(
    name: contract.JobName,
    backend: dependencies.AppBackend,
    follows: Follows,
    principal: auth.Caller = viewer,
    lines: Lines = 200,
    follow: Follow = False,
    epoch: Epoch = None,
) -> Response:
    """The driver log of the current run (wherever it runs) or of the last run; with
    ``epoch``, of that epoch's driver (from its owner while it is the live one, else
    as shipped to S3). With ``follow=true`` and a run live (of ``epoch``, if given),
    the response streams what the driver writes (an asynchronous stream, at most 4
    per token and 32 per server; it ends with a line saying why: the run ended, idle
    for 300 s, or open for an hour); an ended driver's log is answered whole."""
    with backend.engine.begin() as conn:
        job = job_views.show(conn, name)
        secret = tokens.cluster_secret(conn)
    live = epoch is None or past_logs.is_live(job, epoch)
    if follow and live and job.owner is not None:
        release = _admit(follows, principal)
        stream = anyio.from_thread.run(_follow, backend, job, lines, secret)
        if stream is not None:
            return _streamed(stream, release)
        release()
    if epoch is not None:
        return PlainTextResponse(_epoch_log(backend, job, epoch, lines, secret))
    text = _live_log(backend, job, lines, secret)
    if text is None:
        for older in range(job.epoch, max(job.epoch - 3, 0), -1):
            text = backend.shipped_log(job, older, lines)
            if text is not None:
                break
    if text is None:
        raise contract.ApiError(404, f"job {name} has no driver log yet")
    return PlainTextResponse(text)


@router.get(
    f"{contract.API}/jobs/{{name}}/runs/{{run_id}}/logs",
    tags=["jobs"],
    response_class=PlainTextResponse,
    responses=TAIL,
)
def run_logs(
    name: contract.JobName,
    run_id: RunId,
    backend: dependencies.AppBackend,
    principal: auth.Caller = viewer,
    lines: Lines = 200,
    attempt: Attempt = None,
) -> Response:
    """The driver log of a batch run's attempt (its last by default): each attempt,
    a retry or a run again after a lost server, is an epoch of its own. From its
    owner while it runs, else as shipped to S3 (kept under history retention)."""
    with backend.engine.begin() as conn:
        job = job_views.show(conn, name)
        secret = tokens.cluster_secret(conn)
        run = runs.of_job(conn, job.id, run_id)
    try:
        attempt, epoch = past_logs.run_attempt(job, run_id, run, attempt)
    except past_logs.Missing as exc:
        raise contract.ApiError(404, str(exc)) from None
    what = past_logs.attempt_label(run_id, attempt, epoch)
    return PlainTextResponse(_epoch_log(backend, job, epoch, lines, secret, what))


def _epoch_log(
    backend: dependencies.Backend,
    job: job_views.JobView,
    epoch: int,
    lines: int,
    secret: str,
    what: str | None = None,
) -> str:
    """The tail of the log of the job's driver of ``epoch`` (``past_logs.epoch_log``);
    a 404 saying why when there is none."""
    try:
        return past_logs.epoch_log(
            job,
            epoch,
            live=lambda: _live_log(backend, job, lines, secret),
            shipped=lambda e: backend.shipped_log(job, e, lines),
            what=what,
        )
    except past_logs.Missing as exc:
        raise contract.ApiError(404, str(exc)) from None


def _live_log(
    backend: dependencies.Backend, job: job_views.JobView, lines: int, secret: str
) -> str | None:
    owner = job.owner
    if owner is None:
        return None
    if owner == backend.server_id:
        path = backend.log_file(job.name)
        return livelog.tail(path, lines) if path is not None and path.exists() else None
    info = backend.members().get(owner)
    if info is None or not info.health_url:
        return None
    return livelog.fetch(info.health_url, job.name, lines, secret, verify=backend.peer_tls)


async def _follow(
    backend: dependencies.Backend, job: job_views.JobView, lines: int, secret: str
) -> AsyncIterator[bytes] | None:
    owner, name = job.owner, job.name
    if owner is None:
        return None
    if owner == backend.server_id:
        path = backend.log_file(name)
        if path is None or not path.exists():
            return None
        return livelog.follow(path, lines, lambda: backend.log_file(name) == path)
    info = backend.members().get(owner)
    if info is None or not info.health_url:
        return None
    return await livelog.follow_remote_async(
        info.health_url, name, lines, secret, verify=backend.peer_tls
    )
