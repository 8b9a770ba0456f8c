"""The REST API over a real server and the local stack: auth, job commands through the
same guarded functions as the CLI (with the token in each event), reads with filters and
pages, servers and the ring, and every kind of bad input answered 4xx in one line."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from resource_center import store
from scheduler import job_events, tokens
from server import log_shipping
from testing.api_helpers import API, ApiStack, api_stack
from testing.waiting import wait_until


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, stack_env: dict[str, str], zk_hosts: str, s3_endpoint: str, tmp_path_factory
) -> Iterator[ApiStack]:
    # A Spark master nobody listens on (port 1): s1 reports it unreachable in
    # /api/v1/servers; s1 is a coordinator, so no driver ever needs it.
    yield from api_stack(
        postgres_url,
        stack_env,
        Path(tmp_path_factory.mktemp("api")),
        {"SPARKRING_SPARK_MASTER": UNREACHABLE_MASTER},
    )


UNREACHABLE_MASTER = "spark://127.0.0.1:1"


def _name(prefix: str = "j") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _one_line_error(reply: httpx.Response, status: int, *fragments: str) -> str:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    message = reply.json()["error"]
    assert "\n" not in message and "Traceback" not in reply.text
    for fragment in fragments:
        assert fragment in message, message
    return message


# ---------------------------------------------------------------- open endpoints


def test_health_and_metrics_are_open_and_metrics_have_histograms(stack: ApiStack) -> None:
    with stack.client() as http:
        health = http.get("/healthz")
        scrape = http.get("/metrics")
    assert health.status_code == 200 and health.json()["server"] == "s1"
    # Open to anyone: the jobs it runs as a count, never their names (issue 23).
    assert health.json()["running"] == 0 and "jobs" not in health.json()
    families = {f.name: f for f in text_string_to_metric_families(scrape.text)}
    assert families["sparkring_lease_renew_seconds"].type == "histogram"
    assert families["sparkring_driver_stop_seconds"].type == "histogram"
    assert families["sparkring_claim_seconds"].type == "histogram"
    assert families["sparkring_failover_seconds"].type == "histogram"
    assert families["sparkring_claims"].type == "counter"
    assert "process_cpu_seconds" in families
    states = {s.labels["state"] for s in families["sparkring_jobs"].samples}
    assert {"pending", "running", "stopped", "failed"} <= states


def test_openapi_schema_lists_the_api_and_its_bearer_scheme(stack: ApiStack) -> None:
    with stack.client() as http:
        schema = http.get(f"{API}/openapi.json").json()
    assert {f"{API}/jobs", f"{API}/jobs/{{name}}/stop", f"{API}/servers", f"{API}/ring"} <= set(
        schema["paths"]
    )
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_the_openapi_document_lists_every_answer_with_the_one_error_model(
    stack: ApiStack,
) -> None:
    """Issue 30: every route documented only 200/201 and 422; /metrics as JSON."""
    with stack.client() as http:
        schema = http.get(f"{API}/openapi.json").json()
    error = {"$ref": "#/components/schemas/ErrorBody"}
    assert schema["components"]["schemas"]["ErrorBody"]["required"] == ["error"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            answers = operation["responses"]
            if path in ("/healthz", "/metrics"):
                continue
            expected = {"401", "503"} | (
                {"400", "403", "413", "422"} if method in ("post", "delete") else set()
            )
            assert expected <= set(answers), (method, path, sorted(answers))
            if "{" in path:
                # An upload names what it makes: nothing to find.
                found = (
                    set()
                    if (method, path) == ("post", f"{API}/resources/{{reference}}")
                    else {"404"}
                )
                assert {"422", *found} <= set(answers), (method, path, sorted(answers))
            for status, answer in answers.items():
                if status.startswith(("4", "5")):
                    assert answer["content"] == {"application/json": {"schema": error}}, (
                        method,
                        path,
                        status,
                    )
    metrics = schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    for logs in (
        "/logs/{job}",
        f"{API}/jobs/{{name}}/logs",
        f"{API}/jobs/{{name}}/runs/{{run_id}}/logs",
    ):
        assert "text/plain" in schema["paths"][logs]["get"]["responses"]["200"]["content"]
    assert "409" in schema["paths"][f"{API}/jobs"]["post"]["responses"]


def test_created_objects_link_to_the_operations_on_them(stack: ApiStack) -> None:
    with stack.client() as http:
        schema = http.get(f"{API}/openapi.json").json()
    job_links = schema["paths"][f"{API}/jobs"]["post"]["responses"]["201"]["links"]
    assert set(job_links) == {
        "show",
        "start",
        "stop",
        "revisions",
        "events",
        "logs",
        "runs",
        "run",
        "backfill",
        "delete",
    }
    upload = schema["paths"][f"{API}/resources/{{reference}}"]["post"]["responses"]["201"]
    assert set(upload["links"]) == {"show", "delete"}
    for link in [*job_links.values(), *upload["links"].values()]:
        pointer, method = link["operationRef"].removeprefix("#/paths/").rsplit("/", 1)
        path = pointer.replace("~1", "/").replace("~0", "~")
        assert method in schema["paths"][path], link


@pytest.mark.parametrize("role", ["viewer", "operator"])
@pytest.mark.parametrize("method", ["TRACE", "PATCH", "PUT", "OPTIONS"])
def test_a_method_no_route_serves_is_405_listing_every_method_of_the_path(
    stack: ApiStack, role: str, method: str
) -> None:
    """Issue 30: Starlette's Allow named only the first route's methods (GET for
    /api/v1/jobs, which also takes POST), and a viewer's TRACE was refused 403 as a
    write."""
    with stack.client(getattr(stack, role)) as http:
        jobs = http.request(method, f"{API}/jobs")
        resource = http.request(method, f"{API}/resources/heartbeat")
    _one_line_error(jobs, 405)
    assert jobs.headers["allow"] == "GET, POST"
    _one_line_error(resource, 405)
    assert resource.headers["allow"] == "DELETE, GET, POST"


# ---------------------------------------------------------------- auth


@pytest.mark.parametrize("path", [f"{API}/jobs", f"{API}/servers", "/logs/anything"])
def test_reads_without_a_token_or_with_a_bad_one_are_401(stack: ApiStack, path: str) -> None:
    with stack.client() as http:
        reply = http.get(path)
    _one_line_error(reply, 401, "bearer token is required")
    assert reply.headers["www-authenticate"] == "Bearer"
    with stack.client("srt_not-a-real-token") as http:
        _one_line_error(http.get(path), 401, "unknown or revoked")


def test_a_viewer_reads_but_may_not_write(stack: ApiStack) -> None:
    name = _name()
    stack.create_job(name)
    with stack.client(stack.viewer) as http:
        assert http.get(f"{API}/jobs/{name}").json()["state"] == "stopped"
        assert http.get(f"{API}/whoami").json() == {
            "name": "watcher",
            "role": "viewer",
            "server": "s1",
        }
        _one_line_error(http.post(f"{API}/jobs/{name}/start"), 403, "'watcher' is a viewer")
        _one_line_error(http.delete(f"{API}/jobs/{name}"), 403, "needs an operator")
    with stack.client(stack.viewer) as http:
        assert http.get(f"{API}/jobs/{name}").json()["desired"] == "stopped"


def test_a_revoked_token_is_refused_at_once_and_listed_as_revoked(stack: ApiStack) -> None:
    token = stack.token("short-lived", "operator")
    with stack.client(token) as http:
        assert http.get(f"{API}/whoami").status_code == 200
        stack.cluster.cli("token", "revoke", "short-lived")
        _one_line_error(http.get(f"{API}/whoami"), 401, "unknown or revoked")
    listed = json.loads(stack.cluster.cli("token", "list", "--json").stdout)
    row = next(r for r in listed if r["name"] == "short-lived")
    assert row["role"] == "operator" and row["revoked_at"] is not None and not row["active"]
    assert token not in json.dumps(listed)
    with stack.cluster.engine.begin() as conn, pytest.raises(tokens.TokenError) as again:
        tokens.revoke(conn, "short-lived")
    assert str(again.value) == "no active token named 'short-lived'"


def test_token_create_prints_the_token_once_and_refuses_bad_input(stack: ApiStack) -> None:
    made = stack.cluster.cli("token", "create", "ci-bot", "--role", "operator")
    token = made.stdout.strip()
    assert token.startswith("srt_") and "shown only now" in made.stderr
    with stack.client(token) as http:
        assert http.get(f"{API}/whoami").json()["role"] == "operator"
    refused = stack.cluster.cli("token", "create", "x1", "--role", "admin", check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "token role 'admin' must be one of: viewer, operator" in refused.stderr
    for name, role, message in [
        ("bad name", "viewer", "token name 'bad name' must be"),
        ("ops", "viewer", "a token named 'ops' already exists"),
    ]:
        with stack.cluster.engine.begin() as conn, pytest.raises(tokens.TokenError) as error:
            tokens.create(conn, name, role)
        assert message in str(error.value)


# ---------------------------------------------------------------- job commands


def test_a_batch_job_takes_its_retry_budget_as_max_retries(stack: ApiStack) -> None:
    """--max-retries is the batch name of max_restarts; a batch job retries nothing
    unless asked, a streaming job restarts 3 times; a retry budget for a streaming job
    is refused by name."""
    batch, default, streaming = _name(), _name(), _name()
    assert stack.create_job(batch, kind="batch", max_retries=2)["max_restarts"] == 2
    assert stack.create_job(default, kind="batch")["max_restarts"] == 0
    assert stack.create_job(streaming)["max_restarts"] == 3
    with stack.client(stack.operator) as http:
        post = f"{API}/jobs"
        _one_line_error(
            http.post(post, json={"name": _name(), "resource": "heartbeat", "max_retries": 1}),
            400,
            "--max-retries is for batch jobs",
        )
        _one_line_error(
            http.post(
                post,
                json={
                    "name": _name(),
                    "resource": "heartbeat",
                    "kind": "batch",
                    "max_retries": 1,
                    "max_restarts": 1,
                },
            ),
            400,
            "not both",
        )


def test_job_lifecycle_through_the_api_records_the_token_in_each_event(stack: ApiStack) -> None:
    name = _name()
    created = stack.create_job(name, kind="batch", args=["--x", "1"], conf={"spark.a": "b"})
    assert created["name"] == name and created["kind"] == "batch"
    assert "T" in created["created_at"]  # ISO 8601, as --json prints it
    assert created["resource"]["name"] == "heartbeat" and created["args"] == ["--x", "1"]
    with stack.client(stack.operator) as http:
        assert http.post(f"{API}/jobs/{name}/start").json() == {"job": name, "outcome": "started"}
        again = http.post(f"{API}/jobs/{name}/start").json()
        assert again["outcome"] == "already running"
        # No server has capacity here, so the job waits pending (with a reason).
        assert http.get(f"{API}/jobs/{name}").json()["state"] == "pending"
        assert http.post(f"{API}/jobs/{name}/restart").json()["outcome"] == "restarting"
        assert http.post(f"{API}/jobs/{name}/stop").json()["outcome"] == "stopped"
        assert http.get(f"{API}/jobs/{name}").json()["state"] == "stopped"
        events = http.get(f"{API}/jobs/{name}/events").json()
        assert http.delete(f"{API}/jobs/{name}").json() == {"job": name, "outcome": "deleted"}
        _one_line_error(http.get(f"{API}/jobs/{name}"), 404, f"no job named '{name}'")
        feed = http.get(f"{API}/events", params={"after": events[-1]["id"]}).json()
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "created" and "start_requested" in kinds and kinds[-1] == "stop_requested"
    asked = [e for e in events if e["kind"] != "retargeted" and e["server"] is None]
    assert asked and all(e["detail"]["by"] == "token:ops" for e in asked)
    assert {"job": name, "kind": "deleted"} in [{"job": e["job"], "kind": e["kind"]} for e in feed]


def test_a_deleted_jobs_events_are_a_404_by_name_and_stay_in_the_feed_and_the_cli(
    stack: ApiStack,
) -> None:
    """ST301 (Schemathesis' stateful phase: 'deleted resource still available'): the
    created job's ``events`` link answered 200 after its DELETE. Once no job has the
    name it is a 404; the history stays in ``/api/v1/events`` and ``job events``."""
    name = _name()
    stack.create_job(name)
    with stack.client(stack.operator) as http:
        assert http.get(f"{API}/jobs/{name}/events").json()[0]["kind"] == "created"
        assert http.delete(f"{API}/jobs/{name}").status_code == 200
        _one_line_error(http.get(f"{API}/jobs/{name}/events"), 404, f"no job named '{name}'")
        feed = http.get(f"{API}/events", params={"limit": 1000}).json()
    assert [e["kind"] for e in feed if e["job"] == name] == ["created", "deleted"]
    with stack.cluster.engine.connect() as conn:  # the CLI's `job events NAME`
        assert [e["kind"] for e in job_events.events(conn, name)] == ["created", "deleted"]


def test_revisions_through_the_api(stack: ApiStack) -> None:
    name = _name()
    stack.create_job(name, args=["a"])
    url = f"{API}/jobs/{name}"
    with stack.client(stack.operator) as http:
        revised = http.post(f"{url}/revisions", json={"args": ["b"], "conf": {"k": "v"}})
        assert revised.json() == {
            "job": name,
            "revision": 2,
            "previous": 1,
            "changed": ["conf", "args"],
            "effect": "at rest",
            "run_revision": None,
            "watched_until": None,
        }
        same = http.post(f"{url}/revisions", json={"args": ["b"]}).json()
        assert (same["revision"], same["effect"]) == (2, "unchanged")
        _one_line_error(
            http.post(f"{url}/revisions", json={"unset_conf": ["nope"]}), 409, "is not set"
        )
        _one_line_error(http.post(f"{url}/revisions", json={"resource": "ghost"}), 409, "ghost")
        _one_line_error(http.post(f"{url}/rollback", json={"to": 9}), 409, "no revision 9")
        back = http.post(f"{url}/rollback", json={}).json()
        assert (back["revision"], back["changed"]) == (3, ["conf", "args"])
        history = http.get(f"{url}/revisions").json()
    assert [h["revision"] for h in history] == [1, 2, 3]
    assert history[-1]["rollback_of"] == 1 and history[-1]["current"] is True
    assert history[1]["created_by"] == "token:ops"
    with stack.client(stack.viewer) as http:
        _one_line_error(http.post(f"{url}/rollback", json={}), 403)


def test_auto_rollback_through_the_api(stack: ApiStack) -> None:
    """The job's setting on create and update, the watch an update starts (its deadline
    in the answer, the watch in the job), and the refusals (batch, out of range)."""
    name = _name()
    stack.create_job(name, auto_rollback=True, healthy_within_s=600)
    url = f"{API}/jobs/{name}"
    with stack.client(stack.operator) as http:
        shown = http.get(url).json()["auto_rollback"]
        assert shown == {"enabled": True, "healthy_within_s": 600.0, "watch": None}
        assert http.post(f"{url}/start").status_code == 200
        revised = http.post(f"{url}/revisions", json={"args": ["b"]}).json()
        assert revised["effect"] != "at rest" and revised["watched_until"] is not None
        watch = http.get(url).json()["auto_rollback"]["watch"]
        assert (watch["revision"], watch["fallback"]) == (2, 1)
        off = http.post(f"{url}/revisions", json={"auto_rollback": False}).json()
        assert (off["effect"], off["revision"]) == ("unchanged", 2)
        assert http.get(url).json()["auto_rollback"]["watch"] is None
        _one_line_error(
            http.post(f"{url}/revisions", json={"healthy_within_s": 0}), 422, "healthy_within_s"
        )
        batch = _name()
        reply = http.post(
            f"{API}/jobs",
            json={"name": batch, "resource": "heartbeat", "kind": "batch", "auto_rollback": True},
        )
        _one_line_error(reply, 400, "--auto-rollback is for streaming jobs")
        http.post(f"{url}/stop")


def test_schedules_runs_and_backfill_through_the_api(stack: ApiStack) -> None:
    name = _name()
    created = stack.create_job(
        name, kind="batch", schedule="0 3 * * *", timezone="Europe/Berlin", misfire="skip"
    )
    assert created["schedule"]["spec"] == "0 3 * * *"
    assert (created["schedule"]["misfire"], created["schedule"]["active"]) == ("skip", False)
    url = f"{API}/jobs/{name}"
    with stack.client(stack.operator) as http:
        assert http.post(f"{url}/start").json()["outcome"].startswith("schedule on (next fire ")
        revised = http.post(f"{url}/revisions", json={"concurrency": "replace"}).json()
        assert revised["changed"] == ["schedule"]
        job = http.get(url).json()
        shown = job["schedule"]
        assert job["next_fires"][0] == shown["next_fire"] and len(job["next_fires"]) == 5
        assert all(t.endswith(":00:00Z") for t in job["next_fires"])
        assert (shown["concurrency"], shown["misfire"], shown["active"]) == (
            "replace",
            "skip",
            True,
        )
        run_id = http.post(f"{url}/run").json()["run_id"]
        _one_line_error(http.post(f"{url}/run"), 409, "run in progress")
        body = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T12:00:00Z", "dry_run": True}
        planned = http.post(f"{url}/backfill", json=body).json()
        assert planned["queued"] == ["2026-01-01T02:00:00Z", "2026-01-02T02:00:00Z"]
        assert http.post(f"{url}/backfill", json={**body, "dry_run": False}).json()["queued"]
        (backfilled,) = [
            e["detail"]
            for e in stack.cluster.events(name)
            if e["detail"].get("trigger") == "backfill"
        ]
        assert backfilled["by"].startswith("token:") and backfilled["queued"] == 2
        listed = http.get(f"{url}/runs").json()
        assert [r["trigger"] for r in listed] == ["backfill", "backfill", "manual"]
        assert listed[-1]["run_id"] == run_id
        assert len(http.get(f"{url}/runs", params={"state": "queued"}).json()) == 2
        _one_line_error(
            http.get(f"{url}/runs", params={"state": "bogus"}), 422, "state: Input should be"
        )
        _one_line_error(http.get(f"{url}/runs", params={"limit": 0}), 422, "limit")
        naive = {"from": "2026-01-01T00:00:00", "to": "2026-01-02T00:00:00Z"}
        _one_line_error(http.post(f"{url}/backfill", json=naive), 422, "from:")
        _one_line_error(http.post(f"{url}/backfill", json={**body, "to": "soon"}), 422, "to:")
        backwards = {"from": body["to"], "to": body["from"]}
        _one_line_error(http.post(f"{url}/backfill", json=backwards), 400, "to: is before from")
        far = {**body, "to": "9999-12-31T23:59:59-23:59"}
        _one_line_error(http.post(f"{url}/backfill", json=far), 400, "to: 9999-12-31")
        _one_line_error(http.post(f"{url}/revisions", json={"misfire": "later"}), 422, "misfire")
        _one_line_error(
            http.post(f"{url}/revisions", json={"no_schedule": True, "timezone": "UTC"}),
            400,
            "no_schedule excludes",
        )
        post = f"{API}/jobs"
        _one_line_error(
            http.post(post, json={"name": _name(), "resource": "heartbeat", "schedule": "@daily"}),
            400,
            "for batch jobs",
        )
        _one_line_error(
            http.post(
                post,
                json={"name": _name(), "resource": "heartbeat", "kind": "batch", "schedule": "x"},
            ),
            400,
            "has 1 fields",
        )
        assert http.post(f"{url}/stop").json()["outcome"] in ("stopped", "stopping")
    with stack.client(stack.viewer) as http:
        _one_line_error(http.post(f"{url}/run"), 403)


def test_cli_commands_are_recorded_as_cli_in_events(stack: ApiStack) -> None:
    name = _name()
    stack.create_job(name)
    stack.cluster.cli("job", "start", name)
    events = stack.cluster.events(name)
    started = next(e for e in events if e["kind"] == "start_requested")
    # The CLI user name is claimed (nothing verifies it), and the actor says so.
    assert started["detail"]["by"].startswith("cli") and started["detail"]["by"].endswith(
        " (claimed)"
    )


def test_resource_and_token_writes_are_in_the_audit_trail_with_their_actor(
    stack: ApiStack, tmp_path: Path
) -> None:
    with stack.client(stack.viewer) as http:
        after = max(
            [e["id"] for e in http.get(f"{API}/audit", params={"limit": 1000}).json()] or [0]
        )
    name = _name("audited")
    with stack.client(stack.operator) as http:
        assert (
            http.post(f"{API}/resources/{name}", files={"file": ("a.py", b"x = 1\n")}).status_code
            == 201
        )
        assert http.delete(f"{API}/resources/{name}").status_code == 200
    made = stack.cluster.cli("token", "create", f"t-{name}", "--role", "viewer", "--expires", "1h")
    assert "expires in 1h" in made.stderr
    stack.cluster.cli("token", "revoke", f"t-{name}")
    with stack.client(stack.viewer) as http:
        trail = http.get(f"{API}/audit", params={"after": after}).json()
    mine = [(e["actor"], e["action"], e["subject"]) for e in trail if name in e["subject"]]
    cli = mine[2][0]
    assert mine == [
        ("token:ops", "resource_uploaded", f"{name}:1"),
        ("token:ops", "resource_deleted", name),
        (cli, "token_created", f"t-{name}"),
        (cli, "token_revoked", f"t-{name}"),
    ]
    assert cli.startswith("cli") and cli.endswith(" (claimed)")
    assert made.stdout.strip() not in json.dumps(trail)


def test_token_list_shows_expiry_and_last_use(stack: ApiStack) -> None:
    made = stack.cluster.cli("token", "create", "dated", "--role", "viewer", "--expires", "2d")
    with stack.client(made.stdout.strip()) as http:
        assert http.get(f"{API}/whoami").status_code == 200
    listed = json.loads(stack.cluster.cli("token", "list", "--json").stdout)
    row = next(r for r in listed if r["name"] == "dated")
    assert row["expires_at"] is not None and row["last_used_at"] is not None
    assert row["active"] and not row["expired"]
    table = stack.cluster.cli("token", "list").stdout
    assert "last used" in table and "expires" in table
    refused = stack.cluster.cli(
        "token", "create", "x2", "--role", "viewer", "--expires", "0", check=False
    )
    assert refused.returncode != 0 and "must be a positive duration" in refused.stderr


def test_job_list_filters_and_pages(stack: ApiStack) -> None:
    prefix = _name("page")
    names = sorted(f"{prefix}-{i}" for i in range(5))
    for name in names:
        stack.create_job(name)
    with stack.client(stack.operator) as http:
        http.post(f"{API}/jobs/{names[0]}/start")
        first = http.get(f"{API}/jobs", params={"q": prefix.upper(), "limit": 2}).json()
        second = http.get(f"{API}/jobs", params={"q": prefix, "limit": 2, "offset": 2}).json()
        pending = http.get(f"{API}/jobs", params={"q": prefix, "state": "pending"}).json()
        stopped = http.get(f"{API}/jobs", params={"q": prefix, "desired": "stopped"}).json()
        streaming = http.get(f"{API}/jobs", params={"q": prefix, "kind": "batch"}).json()
    assert first["total"] == 5 and [j["name"] for j in first["jobs"]] == names[:2]
    assert [j["name"] for j in second["jobs"]] == names[2:4]
    assert [j["name"] for j in pending["jobs"]] == [names[0]]
    assert stopped["total"] == 4
    assert streaming["total"] == 0


# ---------------------------------------------------------------- bad input


def test_bad_input_is_4xx_with_a_message_naming_the_problem_and_writes_nothing(
    stack: ApiStack,
) -> None:
    taken = _name()
    stack.create_job(taken)
    with stack.client(stack.operator) as http:
        before = http.get(f"{API}/jobs").json()["total"]
        post = f"{API}/jobs"
        raw = {"headers": {"content-type": "application/json"}}
        _one_line_error(http.post(post, content=b"{not json", **raw), 400, "not valid JSON")
        _one_line_error(
            http.post(post, json={"name": "x", "resource": "heartbeat", "colour": "red"}),
            422,
            "unknown field 'colour'",
        )
        _one_line_error(http.post(post, json={"name": "x"}), 422, "resource is required")
        _one_line_error(
            http.post(post, json={"name": "x", "resource": "heartbeat", "kind": "forever"}),
            422,
            "kind",
        )
        _one_line_error(
            http.post(post, json={"name": "x", "resource": "heartbeat", "max_restarts": -1}),
            422,
            "max_restarts",
        )
        _one_line_error(
            http.post(post, json={"name": "no spaces", "resource": "heartbeat"}),
            422,
            "name: 'no spaces' is not 1-128 letters",
        )
        huge = http.post(post, json={"name": "x" * 100_000, "resource": "heartbeat"})
        assert len(_one_line_error(huge, 422, "name: 'xxx")) < 200  # the input shown cut
        _one_line_error(
            http.post(post, json={"name": "x", "resource": "nosuchresource"}), 409, "nosuchresource"
        )
        _one_line_error(
            http.post(post, json={"name": taken, "resource": "heartbeat"}),
            409,
            f"a job named '{taken}' already exists",
        )
        _one_line_error(http.post(f"{API}/jobs/nosuchjob/start"), 404, "no job named 'nosuchjob'")
        _one_line_error(http.delete(f"{API}/jobs/nosuchjob"), 404, "no job named 'nosuchjob'")
        _one_line_error(http.get(f"{API}/jobs", params={"limit": 0}), 422, "limit")
        _one_line_error(http.get(f"{API}/jobs", params={"state": "bogus"}), 422, "state")
        _one_line_error(http.get(f"{API}/nowhere"), 404, "no such path")
        http.post(f"{API}/jobs/{taken}/start")
        _one_line_error(http.delete(f"{API}/jobs/{taken}"), 409, "stop it first")
        assert http.get(f"{API}/jobs").json()["total"] == before
        assert http.get(f"{API}/jobs/{taken}").json()["desired"] == "running"


# ---------------------------------------------------------------- servers, ring, logs


def test_servers_ring_and_explain(stack: ApiStack) -> None:
    name = _name()
    stack.create_job(name)
    with stack.client(stack.viewer) as http:
        # Probed on a side thread from the start, published through ZooKeeper.
        wait_until(
            lambda: http.get(f"{API}/servers").json()[0]["spark_masters"],
            10,
            message="s1 never reported its Spark master",
        )
        servers = http.get(f"{API}/servers").json()
        ring = http.get(f"{API}/ring").json()
        not_running = http.get(f"{API}/ring/explain/{name}")
        unknown = http.get(f"{API}/ring/explain/nosuchjob")
        resources = http.get(f"{API}/resources").json()
        heartbeat = http.get(f"{API}/resources/heartbeat").json()
    [s1] = servers
    assert s1["id"] == "s1" and s1["coordinator"] is True and s1["healthy"] is True
    # Its Spark master does not answer: reported, and no part of its health.
    assert s1["spark_masters"] == {"127.0.0.1:1": False}
    assert s1["role"] == "coordinator" and s1["capacity"] == 0 and s1["status"]["server"] == "s1"
    assert ring["servers"][0]["server"] == "s1" and ring["servers"][0]["placeable"] is False
    assert ring["arcs"] and all(0 <= a["end"] - a["start"] <= 1 for a in ring["arcs"])
    assert abs(sum(a["end"] - a["start"] for a in ring["arcs"]) - 1) < 1e-9
    _one_line_error(not_running, 409, "not wanted running")
    _one_line_error(unknown, 404, "no job named 'nosuchjob'")
    assert [r["name"] for r in resources] == ["heartbeat"]
    assert heartbeat["version"] == 1 and name in heartbeat["jobs"]


def test_logs_of_a_job_that_never_ran_is_404_and_local_logs_404_for_foreign_jobs(
    stack: ApiStack,
) -> None:
    name = _name()
    stack.create_job(name)
    with stack.client(stack.viewer) as http:
        _one_line_error(http.get(f"{API}/jobs/{name}/logs"), 404, "has no driver log yet")
        _one_line_error(http.get(f"/logs/{name}"), 404, f"no run of {name} here")
        _one_line_error(http.get(f"{API}/jobs/nosuchjob/logs"), 404, "no job named")


def test_the_shipped_log_of_a_job_is_its_own_never_a_deleted_namesakes(
    stack: ApiStack, tmp_path: Path
) -> None:
    """Hole H6: a job created again under a deleted job's name, at epoch 1 again. Its
    logs route must not serve the deleted job's run 1 log (shipped under the name by
    the older code, or under the deleted job's id), only its own."""
    bucket = _bucket(stack)
    name = _name()
    log = tmp_path / "driver.log"
    log.write_text("the deleted job's run\n")
    bucket.put(log_shipping.legacy_log_key(name, 1), log, log.stat().st_size)
    bucket.put(log_shipping.log_key(name, 10**9, 1), log, log.stat().st_size)
    job_id = stack.create_job(name)["id"]
    with stack.cluster.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET epoch = 1 WHERE job_id = :id"), {"id": job_id}
        )
        # Created a while after those logs (S3 dates them to the second only).
        conn.execute(
            sa.text("UPDATE jobs SET created_at = now() + interval '5 seconds' WHERE id = :id"),
            {"id": job_id},
        )
    with stack.client(stack.viewer) as http:
        _one_line_error(http.get(f"{API}/jobs/{name}/logs"), 404, "has no driver log yet")
        log.write_text("its own run\n")
        bucket.put(log_shipping.log_key(name, job_id, 1), log, log.stat().st_size)
        reply = http.get(f"{API}/jobs/{name}/logs")
    assert reply.status_code == 200 and reply.text == "its own run\n", reply.text


def _bucket(stack: ApiStack) -> store.Store:
    env = stack.cluster.env
    return store.Store(
        endpoint=env["SPARKRING_S3_ENDPOINT"],
        access_key=env["SPARKRING_S3_ACCESS_KEY"],
        secret_key=env["SPARKRING_S3_SECRET_KEY"],
        bucket=env["SPARKRING_S3_BUCKET"],
        secure=False,
        region="us-east-1",
    )


def _ship(stack: ApiStack, tmp_path: Path, name: str, job_id: int, epoch: int) -> str:
    """A log shipped for the epoch, as the runner ships one when its driver ended."""
    text = f"{name}: the driver of epoch {epoch}\n"
    log = tmp_path / f"{name}-{epoch}.log"
    log.write_text(text)
    _bucket(stack).put(log_shipping.log_key(name, job_id, epoch), log, log.stat().st_size)
    return text


def _at_epoch(stack: ApiStack, job_id: int, epoch: int) -> None:
    with stack.cluster.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET epoch = :e WHERE job_id = :id"),
            {"e": epoch, "id": job_id},
        )


def test_a_past_epochs_log_is_read_by_its_epoch(stack: ApiStack, tmp_path: Path) -> None:
    name = _name()
    job_id = stack.create_job(name)["id"]
    _at_epoch(stack, job_id, 3)
    first = _ship(stack, tmp_path, name, job_id, 1)
    last = _ship(stack, tmp_path, name, job_id, 3)
    logs = f"{API}/jobs/{name}/logs"
    with stack.client(stack.viewer) as http:
        assert http.get(logs, params={"epoch": 1}).text == first
        assert http.get(logs, params={"epoch": 3}).text == last
        assert http.get(logs).text == last
        # A past driver's log is complete: follow=true answers its tail.
        followed = http.get(logs, params={"epoch": 1, "follow": "true"})
        assert (followed.status_code, followed.text) == (200, first)
        _one_line_error(
            http.get(logs, params={"epoch": 2}), 404, "no log of epoch 2 is kept", "retention"
        )
        _one_line_error(http.get(logs, params={"epoch": 4}), 404, "has no epoch 4")
        _one_line_error(http.get(logs, params={"epoch": 0}), 422, "epoch")
        _one_line_error(http.get(logs, params={"epoch": 1, "lines": 10_001}), 422, "lines")
        _one_line_error(http.get(f"{API}/jobs/{name}/runs/1/logs"), 404, "streaming job", "epoch")


def test_a_batch_runs_attempts_logs_are_read_by_run_and_attempt(
    stack: ApiStack, tmp_path: Path
) -> None:
    name = _name("b")
    job_id = stack.create_job(name, kind="batch", max_retries=1)["id"]
    _at_epoch(stack, job_id, 5)
    with stack.cluster.engine.begin() as conn:
        # A run that failed on its first attempt (epoch 4) and again on its retry (5).
        run_id = conn.execute(
            sa.text(
                "INSERT INTO runs (job_id, generation, trigger, state, epoch, attempts, server) "
                "VALUES (:id, 1, 'manual', 'failed', 5, 2, 's1') RETURNING run_id"
            ),
            {"id": job_id},
        ).scalar_one()
    first = _ship(stack, tmp_path, name, job_id, 4)
    last = _ship(stack, tmp_path, name, job_id, 5)
    logs = f"{API}/jobs/{name}/runs/{run_id}/logs"
    with stack.client(stack.viewer) as http:
        assert http.get(logs, params={"attempt": 1}).text == first
        assert http.get(logs, params={"attempt": 2, "lines": 1}).text == last
        assert http.get(logs).text == last  # its last attempt
        _one_line_error(http.get(logs, params={"attempt": 3}), 404, f"run {run_id} made 2 attempts")
        _one_line_error(http.get(logs, params={"attempt": 0}), 422, "attempt")
        _one_line_error(http.get(logs, params={"lines": 10_001}), 422, "lines")
        _one_line_error(http.get(f"{API}/jobs/{name}/runs/{run_id + 1000}/logs"), 404, "has no run")
        _one_line_error(http.get(f"{API}/jobs/{name}/runs/0/logs"), 422, "run_id")
        _one_line_error(http.get(f"{API}/jobs/nosuchjob/runs/1/logs"), 404, "no job named")


# ---------------------------------------------------------------- resources: writes


def test_resource_upload_and_delete_over_http(stack: ApiStack, tmp_path: Path) -> None:
    name = _name("res")
    main = tmp_path / "etl.py"
    main.write_text("print('etl')\n")
    files = {"file": ("etl.py", main.read_bytes(), "text/x-python")}
    with stack.client(stack.viewer) as http:
        denied = http.post(f"{API}/resources/{name}", files=files)
    with stack.client(stack.operator) as http:
        first = http.post(f"{API}/resources/{name}", files=files)
        again = http.post(f"{API}/resources/{name}", files=files)
        wrong_kind = http.post(
            f"{API}/resources/{name}", files={"file": ("notes.txt", b"hello", "text/plain")}
        )
        bad_name = http.post(f"{API}/resources/bad%20name", files=files)
        no_file = http.post(f"{API}/resources/{name}")
        listed = http.get(f"{API}/resources/{name}").json()
        user = _name("user")
        assert http.post(f"{API}/jobs", json={"name": user, "resource": name}).status_code == 201
        in_use = http.delete(f"{API}/resources/{name}")
        assert http.delete(f"{API}/jobs/{user}").status_code == 200
        gone = http.delete(f"{API}/resources/{name}")
        after = http.get(f"{API}/resources/{name}")
    _one_line_error(denied, 403, "operator")
    assert first.status_code == 201, first.text
    uploaded = first.json()
    assert (uploaded["name"], uploaded["version"], uploaded["filename"]) == (name, 1, "etl.py")
    assert again.status_code == 201 and again.json()["version"] == 1  # same content: unchanged
    assert wrong_kind.status_code == 400 and ".txt" in wrong_kind.json()["error"]
    assert bad_name.status_code == 422 and "name" in bad_name.json()["error"]
    assert no_file.status_code == 422 and "file" in no_file.json()["error"]
    assert listed["sha256"] == uploaded["sha256"]
    assert gone.status_code == 200 and gone.json() == {"deleted": [f"{name}:1"]}
    assert after.status_code == 404
    _one_line_error(in_use, 409, user)


# ---------------------------------------------------------------- bounds (issue 30)

INT_OVERFLOW = 2**31  # one past PostgreSQL's integer
BIGINT_OVERFLOW = "3057077141917740574965760"  # 25 digits: past PostgreSQL's bigint


OUT_OF_RANGE = [
    ("GET", f"{API}/jobs", {"offset": BIGINT_OVERFLOW}, None, "offset"),
    ("GET", f"{API}/events", {"after": BIGINT_OVERFLOW}, None, "after"),
    ("GET", f"{API}/audit", {"after": BIGINT_OVERFLOW}, None, "after"),
    ("GET", f"{API}/jobs", {"q": "a\x00b"}, None, "q"),
    ("GET", f"{API}/jobs", {"owner": "s\x001"}, None, "owner"),
    (
        "POST",
        f"{API}/jobs",
        None,
        {"resource": "heartbeat", "max_restarts": INT_OVERFLOW},
        "max_restarts",
    ),
    (
        "POST",
        f"{API}/jobs",
        None,
        {"resource": "heartbeat", "kind": "batch", "max_retries": INT_OVERFLOW},
        "max_retries",
    ),
    ("POST", f"{API}/jobs", None, {"resource": f"heartbeat:{INT_OVERFLOW}"}, "resource"),
    ("POST", f"{API}/jobs", None, {"resource": "heartbeat", "args": ["a\x00"]}, "args"),
    ("POST", f"{API}/jobs", None, {"resource": "heartbeat", "conf": {"k": "v\x00"}}, "conf"),
    (
        "POST",
        f"{API}/jobs",
        None,
        {"resource": "heartbeat", "spark_master": "\x00"},
        "spark_master",
    ),
    (
        "POST",
        f"{API}/jobs/{{job}}/revisions",
        None,
        {"max_restarts": INT_OVERFLOW},
        "max_restarts",
    ),
    ("POST", f"{API}/jobs/{{job}}/rollback", None, {"to": INT_OVERFLOW}, "to"),
    ("GET", f"{API}/resources/heartbeat:{INT_OVERFLOW}", None, None, "reference"),
]


@pytest.mark.parametrize(
    ("method", "path", "params", "body", "field"),
    OUT_OF_RANGE,
    ids=[f"{case[0]} {case[1]} {case[4]}" for case in OUT_OF_RANGE],
)
def test_out_of_range_input_is_a_422_naming_the_field_never_a_database_error(
    stack: ApiStack,
    method: str,
    path: str,
    params: dict[str, str] | None,
    body: dict[str, object] | None,
    field: str,
) -> None:
    """Issue 30: `offset` of 25 digits reached PostgreSQL and overflowed bigint (503);
    every integer is bounded by its column, every text refuses NUL (PostgreSQL's text
    cannot hold it)."""
    job = _name()
    stack.create_job(job)
    if body is not None and path == f"{API}/jobs":
        body = {"name": _name(), **body}
    with stack.client(stack.operator) as http:
        reply = http.request(method, path.format(job=job), params=params, json=body)
    _one_line_error(reply, 422, field)
