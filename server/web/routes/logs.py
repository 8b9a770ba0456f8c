"""Driver logs: ``/logs/<job>`` (a run on this server, read by peers with the cluster
credential) and ``/api/v1/jobs/<name>/logs`` (the run wherever it is: here, its owner
over HTTP, or the log shipped to S3), each a tail or a bounded live follow."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any

import anyio.from_thread
import anyio.to_thread
from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.background import BackgroundTask

from scheduler import jobs
from server.web import auth, contract, livelog, tokens

if TYPE_CHECKING:
    from server.web import api

Lines = Annotated[
    int, Query(ge=0, le=livelog.MAX_LINES, description="Lines of the tail (0: none).")
]
Follow = Annotated[
    bool,
    Query(description="Stream what the run writes until it ends (bounded: see livelog)."),
]
TEXT = {
    200: {
        "description": "The log, as plain text (streamed with follow=true).",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


def router(backend: api.Backend, authenticator: auth.Authenticator) -> APIRouter:
    routes = APIRouter(responses=contract.errors_beside_text(*contract.READ, 404, 422, 429))
    viewer = Depends(authenticator.reader)
    follows = livelog.FollowGate()

    def _streamed(stream: AsyncIterator[bytes], release: Callable[[], None]) -> Response:
        # The release also runs as a background task: a stream never iterated (the
        # client gone before the first byte) gives its place back too.
        return StreamingResponse(
            livelog.gated(stream, release),
            media_type="text/plain",
            background=BackgroundTask(release),
        )

    def _admit(principal: tokens.Principal) -> Callable[[], None]:
        try:
            return follows.admit(principal.name, counted=principal.role != tokens.Role.CLUSTER)
        except livelog.FollowRefused as exc:
            raise contract.ApiError(429, str(exc)) from None

    @routes.get("/logs/{job}", tags=["logs"], response_class=PlainTextResponse, responses=TEXT)
    async def local_log(
        job: contract.JobName,
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
            release = _admit(principal)
            stream = livelog.follow(path, lines, lambda: backend.log_file(job) == path)
            return _streamed(stream, release)
        text = await anyio.to_thread.run_sync(livelog.tail, path, lines)
        return PlainTextResponse(text)

    @routes.get(
        f"{contract.API}/jobs/{{name}}/logs",
        tags=["jobs"],
        response_class=PlainTextResponse,
        responses=TEXT,
    )
    def job_logs(
        name: contract.JobName,
        principal: auth.Caller = viewer,
        lines: Lines = 200,
        follow: Follow = False,
    ) -> Response:
        """The driver log of the current run (wherever it runs) or of the last run.
        With ``follow=true`` and a run live, the response streams what the driver writes
        (an asynchronous stream, at most 4 per token and 32 per server; it ends with a
        line saying why: the run ended, idle for 300 s, or open for an hour)."""
        with backend.engine.begin() as conn:
            job = jobs.show(conn, name)
            secret = tokens.cluster_secret(conn)
        if follow and job["owner"] is not None:
            release = _admit(principal)
            stream = anyio.from_thread.run(_follow, backend, job, lines, secret)
            if stream is not None:
                return _streamed(stream, release)
            release()
        text = _live_log(backend, job, lines, secret)
        if text is None:
            for epoch in range(job["epoch"], max(job["epoch"] - 3, 0), -1):
                text = backend.shipped_log(job, epoch, lines)
                if text is not None:
                    break
        if text is None:
            raise contract.ApiError(404, f"job {name} has no driver log yet")
        return PlainTextResponse(text)

    return routes


def _live_log(backend: api.Backend, job: dict[str, Any], lines: int, secret: str) -> str | None:
    owner = job["owner"]
    if owner is None:
        return None
    if owner == backend.server_id:
        path = backend.log_file(job["name"])
        return livelog.tail(path, lines) if path is not None and path.exists() else None
    info = backend.members().get(owner)
    if info is None or not info.health_url:
        return None
    return livelog.fetch(info.health_url, job["name"], lines, secret, verify=backend.peer_tls)


async def _follow(
    backend: api.Backend, job: dict[str, Any], lines: int, secret: str
) -> AsyncIterator[bytes] | None:
    owner, name = job["owner"], job["name"]
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
