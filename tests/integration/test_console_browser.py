"""The web console in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium) against a real server and the local stack.

Every wait is explicit, with a deadline. Set ``SPARKRING_SCREENSHOTS=DIR`` to save a
screenshot of each main page there (docs/img/ holds the ones in docs/console.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from resource_center import store
from server import log_shipping
from testing.api_helpers import API, ApiStack, api_stack
from tests.conftest import IN_CI

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# Seconds: the console refreshes every 2 s; a server's death shows after its ZooKeeper
# session expires (4 s in the test cluster).
WAIT_S = 15
# A server's start or death until its row shows it: a Python start-up and a registration
# (took over 15 s on this 2-core machine beside the chaos campaign), or a session's expiry.
SERVER_CHANGE_S = 90


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, stack_env: dict[str, str], zk_hosts: str, s3_endpoint: str, tmp_path_factory
) -> Iterator[ApiStack]:
    yield from api_stack(postgres_url, stack_env, Path(tmp_path_factory.mktemp("console")))


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    if not CHROMIUM or not CHROMEDRIVER:
        message = "chromium and chromium-driver are not installed (scripts/bootstrap.sh)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI and this machine run as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,860",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


def _until(
    browser: webdriver.Chrome,
    condition: Callable[[], object],
    what: str,
    timeout: float = WAIT_S,
) -> object:
    """Poll ``condition`` until truthy (stale elements from a refresh count as not yet)."""

    def check(_driver: object) -> object:
        try:
            return condition()
        except StaleElementReferenceException:
            return False

    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.1).until(check)
    except TimeoutException:
        seen = {
            "url": browser.current_url,
            "banner": _text(browser, "#banner"),
            "h1": _text(browser, "#view h1"),
            "outcome": _text(browser, "#job-outcome"),
            "state": _text(browser, "dd[data-field='state']"),
            "updated": _text(browser, "#updated"),
        }
        raise AssertionError(f"{what}: not seen within {timeout:g} s; page: {seen}") from None


def _act(browser: webdriver.Chrome, action: Callable[[], None], what: str) -> None:
    """Do ``action`` on the page; the console re-renders every 2 s, so an element found
    just before a refresh may be gone: find it again and retry, within the deadline."""

    def attempt() -> bool:
        action()
        return True

    _until(browser, attempt, what)


def _click(browser: webdriver.Chrome, by: str, selector: str) -> None:
    _act(browser, lambda: browser.find_element(by, selector).click(), f"click {selector}")


def _type(browser: webdriver.Chrome, element_id: str, text: str) -> None:
    def action() -> None:
        browser.execute_script(f"document.getElementById('{element_id}').value = ''")
        browser.find_element(By.ID, element_id).send_keys(text)

    _act(browser, action, f"type into {element_id}")


def _text(browser: webdriver.Chrome, css: str) -> str:
    """The rendered text of the first element matching ``css``, or "" if none does.

    Found and read in one script: the console re-renders every 2 s, and an element found
    in one WebDriver call may be replaced before the next reads it (a stale element
    failed the clean-clone CI run at cabe3be this way)."""
    text = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
    )
    return str(text)


def _log_in(browser: webdriver.Chrome, stack: ApiStack, token: str) -> None:
    browser.get(stack.url + "/console/")
    browser.execute_script("localStorage.clear()")
    browser.get(stack.url + "/console/#/jobs")
    _until(browser, lambda: browser.find_element(By.ID, "token").is_displayed(), "login form")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "login-button").click()
    _until(browser, lambda: browser.find_elements(By.ID, "jobs"), "the jobs table")


def _screenshot(browser: webdriver.Chrome, name: str) -> None:
    folder = os.environ.get("SPARKRING_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(folder) / f"console-{name}.png"))


def test_a_bad_token_is_refused_at_login(browser: webdriver.Chrome, stack: ApiStack) -> None:
    browser.get(stack.url + "/console/")
    browser.execute_script("localStorage.clear()")
    browser.refresh()
    _until(browser, lambda: browser.find_element(By.ID, "token").is_displayed(), "login form")
    browser.find_element(By.ID, "token").send_keys("srt_wrong")
    browser.find_element(By.ID, "login-button").click()
    _until(
        browser,
        lambda: "unknown or revoked" in _text(browser, "#login-error"),
        "the refusal shown",
    )
    assert not browser.find_element(By.ID, "nav").is_displayed()


def test_operator_sees_a_job_appear_stops_it_and_sees_it_stopped(
    browser: webdriver.Chrome, stack: ApiStack
) -> None:
    _log_in(browser, stack, stack.operator)
    name = f"web-{uuid.uuid4().hex[:8]}"
    row = f"tr[data-job='{name}']"
    stack.create_job(name)
    with stack.client(stack.operator) as http:
        assert http.post(f"{API}/jobs/{name}/start").json()["outcome"] == "started"
    _until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, row), "the new job's row")
    _until(browser, lambda: _text(browser, f"{row} td.state") == "pending", "pending")
    # The search box filters the table (server side).
    _type(browser, "job-search", name)
    _until(browser, lambda: _text(browser, "#job-count") == "1-1 of 1", "one match")
    _screenshot(browser, "jobs")
    _click(browser, By.CSS_SELECTOR, f"{row} a")
    _until(browser, lambda: _text(browser, "#job-name") == name, "the job page")
    _until(browser, lambda: "start_requested" in _text(browser, "#job-events"), "events")
    assert "has no driver log yet" in _text(browser, "#job-log")
    # The restart budget as spent now: crashes inside the restart window (1 h default).
    assert _text(browser, "dd[data-field='restarts']") == "0 of 3 in the last 1h"
    # Stop asks first: dismissed, nothing is sent; accepted, the job stops.
    _click(browser, By.ID, "job-stop")
    _until(browser, lambda: _alert(browser), "the confirmation")
    assert browser.switch_to.alert.text == f"Stop job {name}?"
    browser.switch_to.alert.dismiss()
    with stack.client(stack.viewer) as http:
        assert http.get(f"{API}/jobs/{name}").json()["desired"] == "running"
    assert "stop_requested" not in _text(browser, "#job-events")
    _click(browser, By.ID, "job-stop")
    _until(browser, lambda: _alert(browser), "the confirmation")
    browser.switch_to.alert.accept()
    _until(browser, lambda: _text(browser, "dd[data-field='state']") == "stopped", "state stopped")
    assert _text(browser, "#job-outcome") == "stop: stopped"
    _until(browser, lambda: "stop_requested" in _text(browser, "#job-events"), "stop event")
    assert "token:ops" in _text(browser, "#job-events")
    _screenshot(browser, "job")
    with stack.client(stack.viewer) as http:
        assert http.get(f"{API}/jobs/{name}").json()["desired"] == "stopped"
    # Start and Restart ask too; dismissed, nothing is sent.
    for button, verb in (("job-start", "Start"), ("job-restart", "Restart")):
        _click(browser, By.ID, button)
        _until(browser, lambda: _alert(browser), "the confirmation")
        assert browser.switch_to.alert.text == f"{verb} job {name}?"
        browser.switch_to.alert.dismiss()
    with stack.client(stack.viewer) as http:
        assert http.get(f"{API}/jobs/{name}").json()["desired"] == "stopped"


def _alert(browser: webdriver.Chrome) -> bool:
    try:
        browser.switch_to.alert  # noqa: B018 (raises while no dialog is open)
    except NoAlertPresentException:
        return False
    return True


def test_a_viewer_cannot_press_the_buttons(browser: webdriver.Chrome, stack: ApiStack) -> None:
    name = f"web-{uuid.uuid4().hex[:8]}"
    stack.create_job(name)
    _log_in(browser, stack, stack.viewer)
    browser.get(f"{stack.url}/console/#/jobs/{name}")
    _until(browser, lambda: _text(browser, "#job-name") == name, "the job page")
    _until(
        browser,
        lambda: (
            not any(
                browser.find_element(By.ID, f"job-{a}").is_enabled()
                for a in ("start", "stop", "restart")
            )
        ),
        "start, stop and restart disabled",
    )


def test_servers_page_shows_a_server_join_and_its_death(
    browser: webdriver.Chrome, stack: ApiStack
) -> None:
    _log_in(browser, stack, stack.operator)
    browser.get(stack.url + "/console/#/servers")
    _until(
        browser,
        lambda: (
            "healthy" in _text(browser, "tr[data-server='s1']")
            and "yes (term" in _text(browser, "tr[data-server='s1']")
        ),
        "s1 healthy and coordinator",
    )
    # s2's Spark master never answers (nothing listens on port 1): its row says so.
    stack.cluster.start_server(
        "s2", capacity=0, role="worker", env={"SPARKRING_SPARK_MASTER": "spark://127.0.0.1:1"}
    )
    try:
        _until(
            browser,
            lambda: browser.find_elements(By.CSS_SELECTOR, "tr[data-server='s2']"),
            "s2",
            SERVER_CHANGE_S,
        )
        _until(
            browser,
            lambda: "healthy" in _text(browser, "tr[data-server='s2']"),
            "s2 healthy",
            SERVER_CHANGE_S,
        )
        _until(
            browser,
            lambda: "0/1 up" in _text(browser, "tr[data-server='s2']"),
            "s2 masters",
            SERVER_CHANGE_S,
        )
        _until(
            browser,
            lambda: (
                browser.find_element(
                    By.CSS_SELECTOR, "tr[data-server='s2'] .badge.bad"
                ).get_attribute("title")
                == "127.0.0.1:1 down"
            ),
            "s2's master named in the badge",
        )
        _screenshot(browser, "servers")
        stack.cluster.signal("s2", signal.SIGKILL)
        _until(
            browser,
            lambda: not browser.find_elements(By.CSS_SELECTOR, "tr[data-server='s2']"),
            "s2 gone after its death",
            SERVER_CHANGE_S,
        )
    finally:
        if "s2" in stack.cluster.servers:
            stack.cluster.kill("s2")
    assert _text(browser, "#view h1") == "Servers (1 live)"


def test_ring_and_events_pages_draw(browser: webdriver.Chrome, stack: ApiStack) -> None:
    # Its own event: the module's stack is per worker, and this test may run first on
    # its worker (it failed so when no other test had created a job).
    name = f"feed-{uuid.uuid4().hex[:8]}"
    stack.create_job(name)
    _log_in(browser, stack, stack.viewer)
    browser.get(stack.url + "/console/#/ring")
    _until(
        browser,
        lambda: browser.find_elements(By.CSS_SELECTOR, "#ring-svg [data-server='s1']"),
        "the ring's arcs",
    )
    assert browser.find_elements(By.CSS_SELECTOR, "#ring-servers tr[data-server='s1']")
    _screenshot(browser, "ring")
    browser.get(stack.url + "/console/#/events")
    _until(browser, lambda: f"{name} created" in _text(browser, "#events"), "the events feed")
    _screenshot(browser, "events")


def test_console_is_served_without_a_token_but_its_data_is_not(stack: ApiStack) -> None:
    page = httpx.get(stack.url + "/console/", timeout=5)
    script = httpx.get(stack.url + "/console/app.js", timeout=5)
    assert page.status_code == 200 and "<title>sparkring console</title>" in page.text
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert httpx.get(stack.url + "/", timeout=5, follow_redirects=False).status_code == 307
    assert httpx.get(stack.url + f"{API}/servers", timeout=5).status_code == 401
    # Hardening (issue 23): a CSP that allows only this origin's script and no framing;
    # no third-party script page (the schema stays).
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "default-src 'self'" in policy and "https:" not in policy
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(stack.url + f"{API}/docs", timeout=5).status_code == 404
    assert httpx.get(stack.url + f"{API}/openapi.json", timeout=5).status_code == 200


def test_a_scheduled_jobs_page_shows_its_next_fires_and_runs(
    browser: webdriver.Chrome, stack: ApiStack
) -> None:
    name = f"web-{uuid.uuid4().hex[:8]}"
    stack.create_job(name, kind="batch", schedule="0 * * * *")
    with stack.client(stack.operator) as http:
        http.post(f"/api/v1/jobs/{name}/start")
        run_id = http.post(f"/api/v1/jobs/{name}/run").json()["run_id"]
    _log_in(browser, stack, stack.viewer)
    browser.get(f"{stack.url}/console/#/jobs/{name}")
    _until(browser, lambda: _text(browser, "#job-name") == name, "the job page")
    _until(
        browser,
        lambda: "0 * * * * (UTC), on" in _text(browser, '[data-field="schedule"]'),
        "the schedule field",
    )
    assert _text(browser, '[data-field="next fires"]').count(":00:00Z") == 5
    _until(
        browser,
        lambda: "manual" in _text(browser, f'#job-runs [data-run="{run_id}"]'),
        "the manual run in the runs table",
    )


def test_a_jobs_page_lists_its_past_drivers_and_shows_a_past_log(
    browser: webdriver.Chrome, stack: ApiStack, tmp_path: Path
) -> None:
    """Each epoch the job's events name (a claim) is listed with a link to its log, and
    each attempt of a batch run; the link shows that log in the page's log pane."""
    name = f"web-{uuid.uuid4().hex[:8]}"
    job_id = stack.create_job(name, kind="batch", max_retries=1)["id"]
    with stack.cluster.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET epoch = 2 WHERE job_id = :id"), {"id": job_id}
        )
        for epoch in (1, 2):
            conn.execute(
                sa.text(
                    "INSERT INTO job_events (job_id, job_name, kind, server, epoch) "
                    "VALUES (:id, :name, 'claimed', 's9', :epoch)"
                ),
                {"id": job_id, "name": name, "epoch": epoch},
            )
        run_id = conn.execute(
            sa.text(
                "INSERT INTO runs (job_id, generation, trigger, state, epoch, attempts, server) "
                "VALUES (:id, 1, 'manual', 'finished', 2, 2, 's9') RETURNING run_id"
            ),
            {"id": job_id},
        ).scalar_one()
    bucket = store.Store(
        endpoint=stack.cluster.env["SPARKRING_S3_ENDPOINT"],
        access_key=stack.cluster.env["SPARKRING_S3_ACCESS_KEY"],
        secret_key=stack.cluster.env["SPARKRING_S3_SECRET_KEY"],
        bucket=stack.cluster.env["SPARKRING_S3_BUCKET"],
        secure=False,
        region="us-east-1",
    )
    for epoch in (1, 2):
        log = tmp_path / f"{epoch}.log"
        log.write_text(f"the driver of epoch {epoch}\n")
        bucket.put(log_shipping.log_key(name, job_id, epoch), log, log.stat().st_size)
    _log_in(browser, stack, stack.viewer)
    browser.get(f"{stack.url}/console/#/jobs/{name}")
    _until(
        browser,
        lambda: _text(browser, "#job-log").strip() == "the driver of epoch 2",
        "the last log",
    )
    assert "s9" in _text(browser, '#job-drivers [data-epoch="1"]')
    _click(browser, By.CSS_SELECTOR, '#job-drivers [data-epoch="1"] a')
    _until(
        browser,
        lambda: _text(browser, "#job-log").strip() == "the driver of epoch 1",
        "epoch 1's log",
    )
    assert "epoch 1" in _text(browser, "#job-log-title")
    _click(browser, By.CSS_SELECTOR, f'#job-runs [data-run="{run_id}"] a[data-attempt="2"]')
    _until(
        browser, lambda: _text(browser, "#job-log").strip() == "the driver of epoch 2", "attempt 2"
    )
    assert f"run {run_id} attempt 2" in _text(browser, "#job-log-title")


def test_alerts_page_lists_alerts_and_deliveries_and_sends_a_test(
    browser: webdriver.Chrome, stack: ApiStack
) -> None:
    name = f"alert-{uuid.uuid4().hex[:8]}"
    secret, path = "s3cret-not-on-the-page-anywhere", "/services/T0/B0/XXXXtoken"
    with stack.client(stack.operator) as http:
        made = http.post(
            f"{API}/alerts",
            # Nothing listens on port 9: each attempt fails to connect, and is retried.
            json={"name": name, "webhook": f"http://127.0.0.1:9{path}", "secret": secret,
                  "on": ["failed", "restarted"], "job": "etl-*"},
        )  # fmt: skip
    assert made.status_code == 201, made.text
    row = f"tr[data-alert='{name}']"
    _log_in(browser, stack, stack.operator)
    browser.get(stack.url + "/console/#/alerts")
    _until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, row), "the alert's row")
    cells = _text(browser, row)
    assert "http://127.0.0.1:9/…" in cells and "failed, restarted" in cells and "etl-*" in cells
    assert _text(browser, f"{row} td[data-field='secret']") == "yes"
    assert secret not in browser.page_source and "XXXXtoken" not in browser.page_source
    # Send test asks first: dismissed, nothing is queued; accepted, a delivery is.
    _click(browser, By.CSS_SELECTOR, f"{row} button.send-test")
    _until(browser, lambda: _alert(browser), "the confirmation")
    assert browser.switch_to.alert.text == f"Send a test delivery of alert {name}?"
    browser.switch_to.alert.dismiss()
    with stack.client(stack.viewer) as http:
        assert http.get(f"{API}/alerts/deliveries", params={"alert": name}).json() == []
    _click(browser, By.CSS_SELECTOR, f"{row} button.send-test")
    _until(browser, lambda: _alert(browser), "the confirmation")
    browser.switch_to.alert.accept()
    _until(browser, lambda: "queued" in _text(browser, "#alert-outcome"), "the outcome")
    with stack.client(stack.viewer) as http:
        (delivery,) = http.get(f"{API}/alerts/deliveries", params={"alert": name}).json()
    assert (
        _text(browser, "#alert-outcome") == f"alert {name}: test delivery {delivery['id']} queued"
    )
    # The server's sender tries it at once: refused, pending, retried later.
    line = f"#deliveries tr[data-delivery='{delivery['id']}']"
    _until(
        browser,
        lambda: "could not connect" in _text(browser, line),
        "the delivery's failed attempt",
    )
    assert _text(browser, f"{line} td.status") == "pending"
    assert int(_text(browser, f"{line} td.attempts")) >= 1
    _screenshot(browser, "alerts")
    # A viewer sees the page, not the button.
    _log_in(browser, stack, stack.viewer)
    browser.get(stack.url + "/console/#/alerts")
    _until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, row), "the alert's row")
    _until(
        browser,
        lambda: not browser.find_element(By.CSS_SELECTOR, f"{row} button.send-test").is_enabled(),
        "Send test disabled",
    )
