"""The role table (issue 23, item 7): every write route of the API against no token, a
bad token, an expired token, a viewer and an operator, on a real server. Refused
callers get their one-line 401/403 and change nothing; the operator's write is done.
A route-table check makes a new write route fail here until it is in the table."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from server.web import api, dependencies
from testing.api_helpers import API, ApiStack, api_stack
from testing.cluster import HEARTBEAT_JOB


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, stack_env: dict[str, str], zk_hosts: str, s3_endpoint: str, tmp_path_factory
) -> Iterator[ApiStack]:
    yield from api_stack(postgres_url, stack_env, Path(tmp_path_factory.mktemp("roles")))


@pytest.fixture(scope="module")
def expired(stack: ApiStack) -> str:
    with stack.cluster.engine.begin() as conn:
        from scheduler import tokens

        token = tokens.create(conn, "lapsed", "operator", expires_in=3600)
        conn.execute(
            sa.text(
                "UPDATE api_tokens SET expires_at = now() - interval '1 minute' "
                "WHERE name = 'lapsed'"
            )
        )
    return token


@dataclass(frozen=True)
class Write:
    method: str
    route: str  # as the app declares it
    # (stack, a fresh stopped job's name, a fresh resource name) -> (path, httpx kwargs),
    # after making whatever the write needs to change something (a started job to stop)
    request: Callable[[ApiStack, str, str], tuple[str, dict[str, Any]]]
    done: int  # the operator's status


def _started(stack: ApiStack, job: str, resource: str) -> tuple[str, dict[str, Any]]:
    with stack.client(stack.operator) as http:
        assert http.post(f"{API}/jobs/{job}/start").status_code == 200
    return f"{API}/jobs/{job}/stop", {}


def _revised(stack: ApiStack, job: str, resource: str) -> tuple[str, dict[str, Any]]:
    with stack.client(stack.operator) as http:
        reply = http.post(f"{API}/jobs/{job}/revisions", json={"args": ["--x"]})
    assert reply.json()["revision"] == 2, reply.text
    return f"{API}/jobs/{job}/rollback", {"json": {"to": 1}}


def _run_now(stack: ApiStack, job: str, resource: str) -> tuple[str, dict[str, Any]]:
    stack.create_job(f"{job}-b", kind="batch")
    return f"{API}/jobs/{job}-b/run", {}


def _backfill(stack: ApiStack, job: str, resource: str) -> tuple[str, dict[str, Any]]:
    stack.create_job(f"{job}-s", kind="batch", schedule="@hourly")
    window = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T02:00:00Z"}
    return f"{API}/jobs/{job}-s/backfill", {"json": window}


def _upload(stack: ApiStack, job: str, resource: str) -> tuple[str, dict[str, Any]]:
    return f"{API}/resources/{resource}", {"files": {"file": ("r.py", b"print(1)\n")}}


def _alert_made(stack: ApiStack, job: str, resource: str) -> str:
    name = f"alert-{job}"
    with stack.client(stack.operator) as http:
        made = http.post(f"{API}/alerts", json={"name": name, "webhook": "http://127.0.0.1:9/"})
    assert made.status_code == 201, made.text
    return name


def _secret_made(stack: ApiStack, job: str, resource: str) -> str:
    name = f"secret-{job}"
    with stack.client(stack.operator) as http:
        made = http.post(f"{API}/secrets", json={"name": name, "value": "v"})
    assert made.status_code == 201, made.text
    return name


WRITES = [
    Write(
        "POST",
        f"{API}/jobs",
        lambda s, job, r: (
            f"{API}/jobs",
            {"json": {"name": f"new-{job}", "resource": "heartbeat"}},
        ),
        201,
    ),
    Write("POST", f"{API}/jobs/{{name}}/start", lambda s, j, r: (f"{API}/jobs/{j}/start", {}), 200),
    Write("POST", f"{API}/jobs/{{name}}/stop", _started, 200),
    Write(
        "POST", f"{API}/jobs/{{name}}/restart", lambda s, j, r: (f"{API}/jobs/{j}/restart", {}), 200
    ),
    Write(
        "POST",
        f"{API}/jobs/{{name}}/revisions",
        lambda s, j, r: (f"{API}/jobs/{j}/revisions", {"json": {"conf": {"spark.x": "1"}}}),
        200,
    ),
    Write("POST", f"{API}/jobs/{{name}}/rollback", _revised, 200),
    Write("POST", f"{API}/jobs/{{name}}/run", _run_now, 200),
    Write("POST", f"{API}/jobs/{{name}}/backfill", _backfill, 200),
    Write("DELETE", f"{API}/jobs/{{name}}", lambda s, j, r: (f"{API}/jobs/{j}", {}), 200),
    Write("POST", f"{API}/resources/{{reference}}", _upload, 201),
    Write(
        "DELETE",
        f"{API}/resources/{{reference}}",
        lambda s, j, r: (f"{API}/resources/{r}", {}),
        200,
    ),
    Write(
        "POST",
        f"{API}/alerts",
        lambda s, j, r: (
            f"{API}/alerts",
            {"json": {"name": f"new-{j}", "webhook": "http://127.0.0.1:9/"}},
        ),
        201,
    ),
    Write(
        "DELETE",
        f"{API}/alerts/{{name}}",
        lambda s, j, r: (f"{API}/alerts/{_alert_made(s, j, r)}", {}),
        200,
    ),
    Write(
        "POST",
        f"{API}/alerts/{{name}}/test",
        lambda s, j, r: (f"{API}/alerts/{_alert_made(s, j, r)}/test", {}),
        202,
    ),
    Write(
        "POST",
        f"{API}/secrets",
        lambda s, j, r: (f"{API}/secrets", {"json": {"name": f"new-{j}", "value": "v"}}),
        201,
    ),
    Write(
        "DELETE",
        f"{API}/secrets/{{name}}",
        lambda s, j, r: (f"{API}/secrets/{_secret_made(s, j, r)}", {}),
        200,
    ),
]

CALLERS = {
    "no token": (401, "bearer token is required"),
    "bad token": (401, "unknown or revoked"),
    "expired token": (401, "token 'lapsed' expired at"),
    "viewer": (403, "needs an operator"),
    "operator": (None, None),
}


def test_the_table_covers_every_write_route_of_the_app() -> None:
    backend = dependencies.Backend(
        server_id="t",
        engine=sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"),
        status=lambda: (True, {}),
        members=dict,
        log_file=lambda job: None,
        shipped_log=lambda job, epoch, lines: None,
        placement_epsilon=0.05,
        vnodes=8,
    )
    # Read from the OpenAPI document: included routers are not flattened into app.routes.
    declared = {
        (method.upper(), path)
        for path, operations in api.create_app(backend).openapi()["paths"].items()
        for method in operations
        if method not in ("get", "head")
    }
    assert declared == {(w.method, w.route) for w in WRITES}


def _writes_so_far(stack: ApiStack) -> tuple[int, ...]:
    counts = stack.cluster.sql(
        "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM job_events), "
        "(SELECT count(*) FROM job_revisions), (SELECT count(*) FROM resources), "
        "(SELECT count(*) FROM audit_events), (SELECT count(*) FROM runs), "
        "(SELECT count(*) FROM alerts), (SELECT count(*) FROM alert_deliveries), "
        "(SELECT count(*) FROM secrets)"
    )
    return tuple(counts[0])


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("write", WRITES, ids=lambda w: f"{w.method} {w.route}")
def test_every_write_route_against_every_caller(
    stack: ApiStack, expired: str, write: Write, caller: str
) -> None:
    job, resource = f"roles-{uuid.uuid4().hex[:8]}", f"res-{uuid.uuid4().hex[:8]}"
    stack.create_job(job)
    with stack.client(stack.operator) as http:
        made = http.post(
            f"{API}/resources/{resource}", files={"file": ("r.py", HEARTBEAT_JOB.read_bytes())}
        )
    assert made.status_code == 201, made.text
    token = {
        "no token": None,
        "bad token": "srt_not-a-real-token",
        "expired token": expired,
        "viewer": stack.viewer,
        "operator": stack.operator,
    }[caller]
    path, kwargs = write.request(stack, job, resource)
    before = _writes_so_far(stack)
    with httpx.Client(base_url=stack.url, timeout=10) as http:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        reply = http.request(write.method, path, headers=headers, **kwargs)
    status, fragment = CALLERS[caller]
    if status is None:
        assert reply.status_code == write.done, reply.text
        assert _writes_so_far(stack) != before
        return
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]
    assert fragment in message and "\n" not in message
    assert token is None or token not in reply.text
    assert _writes_so_far(stack) == before
