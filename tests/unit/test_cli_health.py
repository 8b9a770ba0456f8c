"""``sparkring health`` / ``python -m server.cli.health``: the containers' healthcheck probe.

Runs against a real HTTP server on 127.0.0.1 (an ephemeral port), as a container's
healthcheck runs against the process beside it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from server.cli import health as cli_health
from server.cli import main as cli
from testing import services


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 200 if self.path == "/healthz" else 503
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _closed_port() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = server.server_address[1]
    server.server_close()
    return port


def test_probe_accepts_2xx_and_names_the_failure_otherwise(base_url: str) -> None:
    assert cli_health.probe(f"{base_url}/healthz") is None
    assert cli_health.probe(f"{base_url}/other") == "answered HTTP 503"
    assert "unreachable" in (cli_health.probe(f"http://127.0.0.1:{_closed_port()}/") or "")
    assert cli_health.probe("ftp://127.0.0.1/") == "is not an http(s) URL"


def test_module_exit_codes_as_a_healthcheck_runs_it(base_url: str) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "server.cli.health", *args],
            cwd=services.REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )

    healthy = run(f"{base_url}/healthz")
    assert (healthy.returncode, healthy.stdout.strip()) == (0, f"healthy: {base_url}/healthz")
    unhealthy = run(f"{base_url}/other", "2")
    assert unhealthy.returncode == 1
    assert unhealthy.stderr.strip() == f"error: unhealthy: {base_url}/other answered HTTP 503"
    assert run().returncode == 2
    assert "TIMEOUT_SECONDS is not a number" in run(base_url, "soon").stderr


def test_module_imports_only_the_standard_library() -> None:
    """A probe every few seconds per container must not import the whole CLI (~1 s CPU)."""
    code = (
        "import sys, server.cli.health; "
        "heavy = {'typer', 'sqlalchemy', 'kazoo', 'rich', 'pyspark'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=services.REPO, capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == "[]", result.stderr


def test_cli_command(base_url: str) -> None:
    runner = CliRunner()
    ok = runner.invoke(cli.app, ["health", f"{base_url}/healthz"])
    assert ok.exit_code == 0 and "healthy" in ok.output
    bad = runner.invoke(cli.app, ["health", f"{base_url}/other", "--timeout", "2"])
    assert bad.exit_code == 1
