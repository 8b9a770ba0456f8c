"""Optional TLS: the server's listener with SPARKRING_TLS_CERT / SPARKRING_TLS_KEY, and
the calls between servers (live-log relays, peer health) verified against
SPARKRING_TLS_CA. The certificates are made here, self-signed, for 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse

from registry import servers
from server import settings as settings_module
from server import tls
from server.web import dependencies, httpd, livelog
from server.web.routes import servers as server_routes
from testing import certificates

HOST = certificates.HOST
LOG = b"first line\nsecond line\n"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("tls")
    return {name: certificates.self_signed(folder, name) for name in ("server", "stranger")}


def _peer_app() -> FastAPI:
    """What a peer's listener answers to the calls under test."""
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict[str, object]:
        return {"healthy": True, "running": 1}

    @app.get("/logs/{job}")
    def logs(job: str, follow: bool = False) -> object:
        if not follow:
            return PlainTextResponse(LOG.decode())

        async def stream() -> AsyncIterator[bytes]:
            yield LOG

        return StreamingResponse(stream(), media_type="text/plain")

    return app


@pytest.fixture(scope="module")
def peer(certs: dict[str, tuple[Path, Path]]) -> Iterator[str]:
    """A listener with the server certificate: its https:// base URL."""
    cert, key = certs["server"]
    server = httpd.HttpServer(_peer_app(), 0, host=HOST, listener_tls=tls.server_tls(cert, key))
    server.start()
    try:
        yield f"{tls.scheme(tls.server_tls(cert, key))}://{HOST}:{server.port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def trusted(certs: dict[str, tuple[Path, Path]]) -> ssl.SSLContext:
    return tls.client_context(certs["server"][0])


@pytest.fixture(scope="module")
def untrusted(certs: dict[str, tuple[Path, Path]]) -> ssl.SSLContext:
    """Verifies against another self-signed certificate: the peer's is not trusted."""
    return tls.client_context(certs["stranger"][0])


def test_the_listener_speaks_tls_with_the_configured_certificate(
    peer: str, trusted: ssl.SSLContext
) -> None:
    assert peer.startswith("https://")
    with urllib.request.urlopen(f"{peer}/healthz", timeout=10, context=trusted) as reply:
        assert json.loads(reply.read()) == {"healthy": True, "running": 1}
    plain = peer.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, OSError)):
        urllib.request.urlopen(f"{plain}/healthz", timeout=10).read()


def test_a_client_that_does_not_trust_the_certificate_is_refused(
    peer: str, untrusted: ssl.SSLContext
) -> None:
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{peer}/healthz", timeout=10, context=untrusted)
    # The system's trust store (SPARKRING_TLS_CA unset) does not know a self-signed one.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{peer}/healthz", timeout=10, context=tls.client_context(None))


def test_log_relays_verify_the_peer_against_the_ca(
    peer: str, trusted: ssl.SSLContext, untrusted: ssl.SSLContext
) -> None:
    assert livelog.fetch(peer, "job", 10, "secret", verify=trusted) == LOG.decode()
    assert livelog.fetch(peer, "job", 10, "secret", verify=untrusted) is None

    stream = livelog.follow_remote(peer, "job", 10, "secret", verify=trusted)
    assert stream is not None and b"".join(stream) == LOG
    assert livelog.follow_remote(peer, "job", 10, "secret", verify=untrusted) is None


def test_the_async_relay_verifies_the_peer_against_the_ca(
    peer: str, trusted: ssl.SSLContext, untrusted: ssl.SSLContext
) -> None:
    async def relay(context: ssl.SSLContext) -> bytes | None:
        stream = await livelog.follow_remote_async(peer, "job", 10, "secret", verify=context)
        return None if stream is None else b"".join([chunk async for chunk in stream])

    assert asyncio.run(relay(trusted)) == LOG
    assert asyncio.run(relay(untrusted)) is None


def _backend(context: ssl.SSLContext) -> dependencies.Backend:
    def unused(*_args: object) -> None:
        raise AssertionError("not used by the peer health probe")

    return dependencies.Backend(
        server_id="self",
        engine=None,  # type: ignore[arg-type]
        status=unused,  # type: ignore[arg-type]
        members=dict,
        log_file=unused,
        shipped_log=unused,
        placement_epsilon=0.05,
        vnodes=1,
        peer_tls=context,
    )


def test_peer_health_verifies_the_peer_against_the_ca(
    peer: str, trusted: ssl.SSLContext, untrusted: ssl.SSLContext
) -> None:
    info = servers.ServerInfo(
        id="peer", host=HOST, pid=1, capacity=1, role="both", version="x", started_at=0.0,
        health_url=peer,
    )  # fmt: skip
    assert server_routes.health_of(_backend(trusted), {"peer": info})["peer"] == (
        True,
        {"healthy": True, "running": 1},
    )
    # Not verified: reported as unreachable, never as what an impostor said.
    assert server_routes.health_of(_backend(untrusted), {"peer": info})["peer"] == (None, None)


def test_cert_and_key_go_together_and_bad_files_are_named(
    certs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    cert = certs["server"][0]
    assert tls.server_tls(None, None) is None
    with pytest.raises(tls.TlsError, match="SPARKRING_TLS_CERT and SPARKRING_TLS_KEY go together"):
        tls.server_tls(cert, None)
    with pytest.raises(tls.TlsError, match="SPARKRING_TLS_KEY: no such file"):
        tls.server_tls(cert, tmp_path / "missing.key")
    # A key that is not the certificate's: refused at start, naming both settings, and
    # never showing the key's content.
    with pytest.raises(tls.TlsError, match=r"SPARKRING_TLS_CERT .* SPARKRING_TLS_KEY") as caught:
        tls.server_tls(cert, certs["stranger"][1])
    assert "PRIVATE KEY" not in str(caught.value)
    with pytest.raises(tls.TlsError, match="SPARKRING_TLS_CA: no such file"):
        tls.client_context(tmp_path / "missing.crt")


def test_the_settings_take_the_tls_files(certs: dict[str, tuple[Path, Path]]) -> None:
    cert, key = certs["server"]
    loaded = settings_module.Settings(tls_cert=cert, tls_key=key, tls_ca=cert)
    assert (loaded.tls_cert, loaded.tls_key, loaded.tls_ca) == (cert, key, cert)
    assert settings_module.Settings().tls_cert is None
