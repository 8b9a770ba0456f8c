"""Alerts over the REST API (``/api/v1/alerts``) on a real server: create, list, show,
test and delete as the CLI does, audited with the token; the server's own sender
delivers a test to a local receiver; bad input is a one-line 4xx that writes nothing;
no answer ever carries the secret or the webhook's path."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testing.api_helpers import API, ApiStack, api_stack
from testing.waiting import wait_until
from testing.webhook_receiver import Receiver

SECRET = "s3cret-never-answered-by-the-api"
# A Slack-like webhook: its path is a credential, never answered back.
HOOK_PATH = "/services/T000/B000/XXXXtoken"


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, stack_env: dict[str, str], zk_hosts: str, s3_endpoint: str, tmp_path_factory
) -> Iterator[ApiStack]:
    yield from api_stack(postgres_url, stack_env, Path(tmp_path_factory.mktemp("alerts")))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real receiver (testing/webhook_receiver.py) at a Slack-like path: a credential
    that no output may show."""
    listening = Receiver(path=HOOK_PATH).start()
    yield listening
    listening.stop()


def _name() -> str:
    return f"a-{uuid.uuid4().hex[:8]}"


def _clean(reply: httpx.Response) -> httpx.Response:
    """Every answer: never the secret, never the webhook's path."""
    assert SECRET not in reply.text and "XXXXtoken" not in reply.text, reply.text
    return reply


def _one_line_error(reply: httpx.Response, status: int, *fragments: str) -> str:
    _clean(reply)
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]
    assert "\n" not in message and "Traceback" not in reply.text
    for fragment in fragments:
        assert fragment in message, message
    return message


def _counts(stack: ApiStack) -> tuple[int, ...]:
    return tuple(
        stack.cluster.sql(
            "SELECT (SELECT count(*) FROM alerts), (SELECT count(*) FROM alert_deliveries), "
            "(SELECT count(*) FROM audit_events)"
        )[0]
    )


def test_create_show_list_test_and_delete_as_the_cli_does(
    stack: ApiStack, receiver: Receiver
) -> None:
    url = receiver.url
    name = _name()
    body = {"name": name, "webhook": url, "secret": SECRET, "format": "json", "on": ["failed"]}
    with stack.client(stack.operator) as http:
        made = _clean(http.post(f"{API}/alerts", json=body))
        assert made.status_code == 201, made.text
        alert = made.json()
        assert alert == {
            **alert,
            "name": name, "webhook": url.removesuffix(HOOK_PATH) + "/…",
            "has_secret": True, "format": "json", "on": ["failed"], "job": "*",
            "created_by": "token:ops",
        }  # fmt: skip
        assert "secret" not in alert
        queued = _clean(http.post(f"{API}/alerts/{name}/test"))
        assert queued.status_code == 202, queued.text
        delivery = queued.json()["delivery"]
    with stack.client(stack.viewer) as http:
        assert _clean(http.get(f"{API}/alerts/{name}")).json() == alert
        assert alert in _clean(http.get(f"{API}/alerts")).json()

        def delivered() -> dict[str, Any] | None:
            reply = _clean(http.get(f"{API}/alerts/deliveries", params={"alert": name}))
            found = [d for d in reply.json() if d["id"] == delivery]
            return found[0] if found and found[0]["status"] == "delivered" else None

        # The server's own sender (every server runs one) POSTs it to the receiver.
        wait_until(delivered, 20, interval=0.2, message="the test delivery delivered")
        shown = delivered()
        assert shown is not None
        assert (shown["alert"], shown["kind"], shown["attempts"]) == (name, "test", 1)
        assert shown["last_status"] == 200 and shown["next_attempt_at"] is None
        assert [b["id"] for b in receiver.bodies()] == [delivery]
        assert receiver.bodies()[0]["detail"] == {"by": "token:ops"}
        assert (
            _clean(
                http.get(f"{API}/alerts/deliveries", params={"status": "pending", "alert": name})
            ).json()
            == []
        )
        assert len(http.get(f"{API}/alerts/deliveries", params={"limit": 1}).json()) == 1
    with stack.client(stack.operator) as http:
        gone = _clean(http.delete(f"{API}/alerts/{name}"))
        assert gone.json() == {"alert": name, "outcome": "deleted", "deliveries": 1}
        _one_line_error(http.get(f"{API}/alerts/{name}"), 404, f"no alert named {name!r}")
        audit = http.get(f"{API}/audit", params={"limit": 1000}).json()
    mine = [(e["actor"], e["action"]) for e in audit if e["subject"] == name]
    assert mine == [("token:ops", "alert_created"), ("token:ops", "alert_deleted")]
    created = next(e for e in audit if e["subject"] == name)
    assert created["detail"]["has_secret"] is True and SECRET not in json.dumps(audit)
    assert "XXXXtoken" not in json.dumps(audit)
    # Logged by name (the write and the delivery), never with the secret or the path.
    server_log = stack.cluster.log("s1")
    assert "alert created over HTTP" in server_log and delivery in server_log
    assert SECRET not in server_log and "XXXXtoken" not in server_log


def test_defaults_and_all(stack: ApiStack) -> None:
    name = _name()
    with stack.client(stack.operator) as http:
        plain = http.post(f"{API}/alerts", json={"name": name, "webhook": "http://127.0.0.1:9"})
        assert plain.status_code == 201, plain.text
        assert plain.json()["on"] == ["failed", "stalled", "waiting_for_resources", "rolled_back"]
        assert (
            plain.json()["has_secret"] is False and plain.json()["webhook"] == "http://127.0.0.1:9/"
        )
        every = http.post(
            f"{API}/alerts",
            json={"name": f"{name}-all", "webhook": "http://127.0.0.1:9", "on": ["all"]},
        )
        assert len(every.json()["on"]) == 8 and "test" not in every.json()["on"]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (
            {"webhook": f"ftp://hooks.example.com{HOOK_PATH}"},
            422,
            "webhook: the value given is not",
        ),
        ({"webhook": f"https://hooks.example.com:99999{HOOK_PATH}"}, 422, "webhook"),
        ({"webhook": f"https://hooks example.com{HOOK_PATH}"}, 422, "webhook"),
        ({"secret": ""}, 422, "secret"),
        ({"secret": SECRET + "\x00"}, 422, "secret: the value given is not text without NUL"),
        ({"secret": "x" * 513}, 422, "secret"),
        ({"on": []}, 422, "on"),
        ({"on": ["failed", "test"]}, 422, "on.1"),
        ({"format": "xml"}, 422, "format"),
        ({"job": "etl/%"}, 422, "job"),
        ({"name": "bad name"}, 422, "name: 'bad name' is not 1-64 letters"),
        ({"name": "deliveries"}, 409, "'deliveries' is reserved"),
        ({"colour": "red"}, 422, "unknown field 'colour'"),
    ],
)
def test_bad_input_is_a_one_line_refusal_that_writes_nothing(
    stack: ApiStack, body: dict[str, Any], status: int, fragment: str
) -> None:
    before = _counts(stack)
    request = {"name": _name(), "webhook": f"https://hooks.example.com{HOOK_PATH}"}
    with stack.client(stack.operator) as http:
        reply = http.post(f"{API}/alerts", json={**request, "secret": SECRET, **body})
    _one_line_error(reply, status, fragment)
    assert _counts(stack) == before


def test_a_taken_name_is_409_and_unknown_alerts_are_404(stack: ApiStack) -> None:
    name = _name()
    request = {"name": name, "webhook": f"https://hooks.example.com{HOOK_PATH}", "secret": SECRET}
    with stack.client(stack.operator) as http:
        assert http.post(f"{API}/alerts", json=request).status_code == 201
        before = _counts(stack)
        _one_line_error(http.post(f"{API}/alerts", json=request), 409, "already exists")
        assert _counts(stack) == before
        for method, path in (
            ("GET", f"{API}/alerts/nope"),
            ("DELETE", f"{API}/alerts/nope"),
            ("POST", f"{API}/alerts/nope/test"),
            ("GET", f"{API}/alerts/deliveries?alert=nope"),
        ):
            _one_line_error(http.request(method, path), 404, "no alert named 'nope'")
        _one_line_error(http.get(f"{API}/alerts/deliveries?status=lost"), 422, "status")
        _one_line_error(http.get(f"{API}/alerts/deliveries?limit=0"), 422, "limit")
        assert _counts(stack) == before


def test_a_viewer_reads_but_cannot_write(stack: ApiStack) -> None:
    name = _name()
    before = _counts(stack)
    with stack.client(stack.viewer) as http:
        reply = http.post(f"{API}/alerts", json={"name": name, "webhook": "http://127.0.0.1:9"})
        _one_line_error(reply, 403, "needs an operator")
        assert http.get(f"{API}/alerts").status_code == 200
    assert _counts(stack) == before


def test_deliveries_is_a_path_of_its_own_not_an_alert(stack: ApiStack) -> None:
    """/alerts/deliveries is concrete: only GET, whatever /alerts/{name} allows."""
    with stack.client(stack.operator) as http:
        for method in ("DELETE", "OPTIONS", "PUT"):
            reply = http.request(method, f"{API}/alerts/deliveries")
            assert reply.status_code == 405, (method, reply.text)
            assert reply.headers["allow"] == "GET", method
        assert http.request("OPTIONS", f"{API}/alerts/x").headers["allow"] == "DELETE, GET"
