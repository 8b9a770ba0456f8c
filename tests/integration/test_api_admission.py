"""The API refuses a write before it reads the body (issue 23, item 2): the token and
the declared length are checked first, and a body sent without a length is cut at the
cap while it is read. A real server; the requests are written on a raw socket
(``testing/rawhttp.py``) so that a refusal given before the body is read shows as one: an
answer to a body announced and never sent, or one that comes while most of a 64 MiB body
is still unsent. No clock: a loaded machine cannot make them fail, nor pass
(``tests/unit/test_rawhttp.py`` shows the client sees a server that reads the body first)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testing import rawhttp, waiting
from testing.api_helpers import API, ApiStack, api_stack

MIB = 1024 * 1024
ARTIFACT_LIMIT = 4 * MIB


@pytest.fixture(scope="module")
def stack(
    postgres_url: str, stack_env: dict[str, str], zk_hosts: str, s3_endpoint: str, tmp_path_factory
) -> Iterator[ApiStack]:
    yield from api_stack(
        postgres_url,
        stack_env,
        Path(tmp_path_factory.mktemp("admission")),
        {"SPARKRING_MAX_ARTIFACT_BYTES": str(ARTIFACT_LIMIT)},
    )


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.mark.parametrize(
    ("token", "status", "fragment"),
    [
        (None, 401, "bearer token is required"),
        ("srt_not-a-real-token", 401, "unknown or revoked"),
        ("viewer", 403, "needs an operator"),
    ],
)
def test_a_write_is_refused_on_its_token_before_the_body_arrives(
    stack: ApiStack, token: str | None, status: int, fragment: str
) -> None:
    """64 MiB are announced and none sent: any answer is one given without the body."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers = _auth(stack.viewer if token == "viewer" else token)
    answer = rawhttp.post(stack.url, f"{API}/jobs", headers=headers, declared=64 * MIB)
    assert answer.status == status, answer
    assert fragment in answer.error()


def test_an_oversized_json_body_is_refused_on_its_declared_length(stack: ApiStack) -> None:
    answer = rawhttp.post(stack.url, f"{API}/jobs", headers=_auth(stack.operator), declared=2 * MIB)
    assert answer.status == 413, answer
    assert (
        answer.error() == f"the request body of {2 * MIB} bytes is above the limit of {MIB} bytes"
    )


def test_a_chunked_json_body_is_cut_at_the_limit(stack: ApiStack) -> None:
    answer = rawhttp.post(
        stack.url, f"{API}/jobs", headers=_auth(stack.operator), body_bytes=3 * MIB, chunked=True
    )
    assert answer.status == 413, answer
    assert answer.error() == f"the request body is above the limit of {MIB} bytes"


def test_an_upload_above_the_artifact_limit_is_refused_on_its_declared_length(
    stack: ApiStack,
) -> None:
    headers = {
        "Authorization": f"Bearer {stack.operator}",
        "Content-Type": "multipart/form-data; boundary=x",
    }
    answer = rawhttp.post(stack.url, f"{API}/resources/big", headers=headers, declared=64 * MIB)
    assert answer.status == 413, answer
    assert "SPARKRING_MAX_ARTIFACT_BYTES" in answer.error()


def test_a_chunked_upload_is_cut_at_the_artifact_limit(stack: ApiStack) -> None:
    headers = {
        "Authorization": f"Bearer {stack.operator}",
        "Content-Type": "multipart/form-data; boundary=x",
    }
    part = (
        b'--x\r\nContent-Disposition: form-data; name="file"; filename="big.py"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n"
    )
    answer = rawhttp.post(
        stack.url,
        f"{API}/resources/big",
        headers=headers,
        prefix=part,
        body_bytes=8 * MIB,
        chunked=True,
    )
    assert answer.status == 413, answer
    assert "SPARKRING_MAX_ARTIFACT_BYTES" in answer.error()


def test_a_64_mib_body_without_a_token_leaves_the_servers_memory_flat(stack: ApiStack) -> None:
    pid = stack.cluster.pid("s1")
    before = _rss_bytes(pid)
    for _ in range(3):
        answer = rawhttp.post(stack.url, f"{API}/jobs", headers={}, body_bytes=64 * MIB)
        assert answer.status == 401, answer
        assert answer.body_sent < 64 * MIB, answer
    growth = _rss_bytes(pid) - before
    assert growth < 10 * MIB, f"RSS grew {growth / MIB:.1f} MiB"


def test_writes_within_the_limits_still_work(stack: ApiStack, tmp_path: Path) -> None:
    name = f"adm-{uuid.uuid4().hex[:8]}"
    stack.create_job(name)
    artifact = tmp_path / "small.py"
    artifact.write_text("print('hi')\n")
    with stack.client(stack.operator) as http:
        reply = http.post(
            f"{API}/resources/small-{name}", files={"file": ("small.py", artifact.read_bytes())}
        )
        assert reply.status_code == 201, reply.text
        assert http.post(f"{API}/jobs/{name}/start").json()["outcome"] == "started"
    # The server outlived the refused bodies: it answers its health probe, healthy once
    # more within 30 s (its ZooKeeper session may be suspended a moment on a loaded machine).
    with httpx.Client(base_url=stack.url, timeout=10) as anonymous:
        healthy = waiting.poll_until(
            lambda: anonymous.get("/healthz").status_code == 200, 30, interval=0.5
        )
        assert healthy, anonymous.get("/healthz").text
