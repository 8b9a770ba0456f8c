"""``job show``'s health lines (server/cli/job.py), pure: a job whose run ended shows
the owner's last report as history, never as ``ok`` with its app ``(RUNNING)``."""

from __future__ import annotations

import dataclasses
from typing import Any

from scheduler import job_views
from server.cli import job_show

REPORT = {
    "flag": None,
    "flagged_at": None,
    "app_id": "app-20261126070000-0003",
    "app_state": "RUNNING",
    "ui_url": "http://127.0.0.1:4040",
    "executors": 1,
    "cores": 1,
    "last_batch_id": None,
    "last_batch_at": None,
    "input_rate": None,
    "processing_rate": None,
    "checked_at": "2026-11-26T07:00:00Z",
}


def _job(state: str, owner: str | None, kind: str = "batch") -> job_views.JobView:
    blank: dict[str, Any] = dict.fromkeys(f.name for f in dataclasses.fields(job_views.JobView))
    fields = {"kind": kind, "state": state, "owner": owner, "health": dict(REPORT)}
    return job_views.JobView(**{**blank, **fields})


def test_a_finished_job_is_not_shown_healthy_nor_its_app_running() -> None:
    fields = job_show._health_fields(_job("finished", None))
    assert fields["health"] != "ok" and "no live run" in fields["health"], fields
    assert "RUNNING" not in fields["spark_app"] and "ended" in fields["spark_app"], fields
    assert (fields["spark_ui"], fields["executors"]) == (None, None), fields
    assert _job("finished", None).health_text == "-"


def test_a_running_job_shows_its_health_and_app_state() -> None:
    fields = job_show._health_fields(_job("running", "s1"))
    assert (fields["health"], fields["spark_app"]) == (
        "ok",
        "app-20261126070000-0003 (RUNNING)",
    )
