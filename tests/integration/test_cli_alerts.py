"""``sparkring alert`` as a user meets it: the real CLI (``python -m server``) against
this test's own database, stdout a pipe. A test delivery waited for is sent by an
in-process sender (``server/alert_sender.py``) to a local receiver; no secret and no
webhook path is ever printed."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from server import alert_sender
from testing import cli_runner, factories
from testing.webhook_receiver import Receiver

SECRET = "s3cret-never-shown-anywhere-at-all"
# A Slack-like webhook: its path is a credential, never shown.
HOOK_PATH = "/services/T000/B000/XXXXtoken"


@pytest.fixture
def run(stack_env: dict[str, str], database_url: str):
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    env = {**base, **stack_env, "SPARKRING_DATABASE_URL": database_url}

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = cli_runner.run(args, env=env, timeout=60, input=stdin)
        shown = result.stdout + result.stderr
        assert SECRET not in shown and HOOK_PATH not in shown and "XXXXtoken" not in shown
        return result

    return cli


def _error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout.strip()


def _audit(engine: sa.Engine) -> list[tuple[str, str, str, dict]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT actor, action, subject, detail FROM audit_events"))
        return [tuple(r) for r in rows]  # type: ignore[misc]


def test_create_list_show_and_delete_show_no_secret_nor_webhook_path(
    run, engine: sa.Engine, tmp_path: Path
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    created = _ok(
        run(
            "alert", "create", "pager", "--webhook", f"https://hooks.example.com{HOOK_PATH}",
            "--secret-file", str(secret_file), "--format", "slack", "--on", "failed,restarted",
            "--job", "etl-*",
        )
    )  # fmt: skip
    assert created == (
        "alert pager: created; slack to https://hooks.example.com/…, signed, on failed, "
        "restarted, for jobs etl-*"
    )
    # stdin, and the defaults: every job, the default kinds, JSON, no secret.
    _ok(run("alert", "create", "ops", "--webhook", "http://127.0.0.1:9/x", "--secret-file", "-",
            stdin=SECRET))  # fmt: skip
    _ok(run("alert", "create", "plain", "--webhook", "http://127.0.0.1:9"))
    listed = json.loads(_ok(run("alert", "list", "--json")))
    assert [a["name"] for a in listed] == ["ops", "pager", "plain"]
    pager, ops, plain = listed[1], listed[0], listed[2]
    assert pager["webhook"] == "https://hooks.example.com/…" and pager["has_secret"] is True
    assert (pager["format"], pager["on"], pager["job"]) == (
        "slack",
        ["failed", "restarted"],
        "etl-*",
    )
    assert ops["has_secret"] is True and plain["has_secret"] is False
    assert plain["on"] == ["failed", "stalled", "waiting_for_resources", "rolled_back"]
    assert plain["job"] == "*" and plain["format"] == "json"
    assert plain["created_by"].startswith("cli") and plain["created_by"].endswith("(claimed)")
    with engine.connect() as conn:  # the file's final line break is not the secret's
        assert (
            conn.execute(sa.text("SELECT secret FROM alerts WHERE name = 'pager'")).scalar()
            == SECRET
        )
        assert (
            conn.execute(sa.text("SELECT secret FROM alerts WHERE name = 'ops'")).scalar() == SECRET
        )
    table = _ok(run("alert", "list"))
    assert "https://hooks.example.com/…" in table and "failed, restarted" in table
    assert json.loads(_ok(run("alert", "show", "pager", "--json"))) == pager
    shown = _ok(run("alert", "show", "pager"))
    assert "secret yes" in " ".join(shown.split()) and "etl-*" in shown
    # Audited like a token: created with what is shown of it, never the secret.
    made = [a for a in _audit(engine) if a[1] == "alert_created" and a[2] == "pager"]
    assert len(made) == 1 and made[0][0].startswith("cli")
    assert made[0][3] == pager  # what is shown of it: never the secret, nor the path
    assert _ok(run("alert", "delete", "pager")) == "alert pager: deleted (with 0 deliveries)"
    assert [a["name"] for a in json.loads(_ok(run("alert", "list", "--json")))] == ["ops", "plain"]
    assert ("alert_deleted", "pager") in [(a[1], a[2]) for a in _audit(engine)]
    assert _error(run("alert", "delete", "pager")) == "error: no alert named 'pager'"
    assert _error(run("alert", "show", "pager")) == "error: no alert named 'pager'"


def test_bad_input_is_refused_in_one_line_and_writes_nothing(run, engine: sa.Engine) -> None:
    hook = ("--webhook", f"https://hooks.example.com{HOOK_PATH}")
    for args, code, expected in [
        (("bad name", *hook), 1, "alert name 'bad name' must be"),
        (("deliveries", *hook), 1, "'deliveries' is reserved"),
        (("x", "--webhook", f"ftp://hooks.example.com{HOOK_PATH}"), 1, "must start with http"),
        (("x", "--webhook", "https://hooks.example.com:99999/p"), 1, "not a valid URL"),
        (("x", *hook, "--on", "failed,exploded"), 1, "unknown alert kind 'exploded'"),
        (("x", *hook, "--on", ","), 1, "at least one kind"),
        (("x", *hook, "--job", "etl/%"), 1, "job glob 'etl/%'"),
        (("x", *hook, "--format", "xml"), 2, "'xml' is not one of"),
        (("x", *hook, "--secret", SECRET, "--secret-file", "-"), 1, "not both"),
        (("x", *hook, "--secret-file", "/nonexistent/secret"), 1, "cannot read --secret-file"),
        (("x", *hook, "--secret", "x" * 513), 1, "secret must be 24-512 characters"),
        (("x", *hook, "--secret-file", "/dev/zero"), 1, "secret must be 24-512 characters"),
        (("x", *hook, "--secret", "short-secret"), 1, "secret must be 24-512 characters"),
        (("x", "--webhook", "http://10.1.2.3:5432/"), 1, "resolves to 10.1.2.3"),
        (("x", "--webhook", "http://169.254.169.254/latest"), 1, "resolves to 169.254.169.254"),
        (("x", "--webhook", "http://a..b/"), 1, "not a valid host name"),
    ]:
        result = run("alert", "create", *args)
        if code == 2:  # a usage error: click's own message, several lines
            assert result.returncode == 2 and expected in result.stderr, result.stderr
        else:
            assert expected in _error(result, code), args
    assert "is empty" in _error(run("alert", "create", "x", *hook, "--secret-file", "-", stdin=""))
    _ok(run("alert", "create", "taken", *hook))
    assert "an alert named 'taken' already exists" in _error(run("alert", "create", "taken", *hook))
    assert [a["name"] for a in json.loads(_ok(run("alert", "list", "--json")))] == ["taken"]
    assert [a[1] for a in _audit(engine)] == ["alert_created"]
    assert "no alert named 'nope'" in _error(run("alert", "test", "nope"))
    assert "no alert named 'nope'" in _error(run("alert", "deliveries", "--alert", "nope"))
    assert "'bogus' is not one of" in run("alert", "deliveries", "--status", "bogus").stderr


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real receiver (testing/webhook_receiver.py) at a Slack-like path: a credential
    that no output may show."""
    listening = Receiver(path=HOOK_PATH).start()
    yield listening
    listening.stop()


@pytest.fixture
def sender(engine: sa.Engine) -> Iterator[alert_sender.AlertSender]:
    sending = alert_sender.AlertSender(
        engine, "s1", interval=0.1, console_url=None, user_agent="sparkring-test",
        allow_networks=factories.LOOPBACK,
    )  # fmt: skip
    sending.start()
    yield sending
    sending.stop()


def test_a_test_delivery_is_queued_waited_for_and_listed(run, receiver, sender) -> None:
    url = receiver.url
    receiver.script = [204]
    _ok(run("alert", "create", "hook", "--webhook", url, "--secret", SECRET))
    done = _ok(run("alert", "test", "hook", "--wait", "--timeout", "20"))
    assert done.startswith("alert hook: test delivery ") and done.endswith(
        " delivered (HTTP 204, 1 attempt)"
    )
    delivery_id = done.split()[4]
    assert [b["id"] for b in receiver.bodies()] == [delivery_id]
    assert receiver.bodies()[0]["kind"] == "test"
    (listed,) = json.loads(_ok(run("alert", "deliveries", "--json")))
    assert (listed["id"], listed["alert"], listed["kind"]) == (delivery_id, "hook", "test")
    assert (listed["status"], listed["attempts"], listed["last_status"]) == ("delivered", 1, 204)
    assert listed["delivered_at"] and listed["next_attempt_at"] is None
    table = _ok(run("alert", "deliveries", "--alert", "hook"))
    assert delivery_id in table and "delivered" in table and "HTTP 204" in table
    # A final refusal (410) fails it: exit 1 with the receiver's answer.
    receiver.script = [410]
    line = _error(run("alert", "test", "hook", "--wait", "--timeout", "20"))
    assert line.endswith("failed after 1 attempt: HTTP 410 (final: not retried)"), line
    failed = json.loads(_ok(run("alert", "deliveries", "--status", "failed", "--json")))
    assert [d["last_status"] for d in failed] == [410]
    assert len(json.loads(_ok(run("alert", "deliveries", "--json", "--limit", "1")))) == 1
    assert _ok(run("alert", "delete", "hook")) == "alert hook: deleted (with 2 deliveries)"
    assert json.loads(_ok(run("alert", "deliveries", "--json"))) == []


def test_test_without_a_server_is_queued_and_a_wait_times_out_with_124(run) -> None:
    _ok(run("alert", "create", "hook", "--webhook", f"http://127.0.0.1:9{HOOK_PATH}"))
    queued = _ok(run("alert", "test", "hook"))
    assert queued.startswith("alert hook: test delivery ") and queued.endswith(" queued")
    line = _error(run("alert", "test", "hook", "--wait", "--timeout", "0.5"), 124)
    assert line.endswith("still pending after 0.5 s (0 attempts)"), line
    pending = json.loads(_ok(run("alert", "deliveries", "--status", "pending", "--json")))
    assert len(pending) == 2 and all(d["attempts"] == 0 for d in pending)
