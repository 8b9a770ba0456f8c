"""The destination policy of webhooks (scheduler/destinations.py): pure, with address
literals (no resolver), and through the alert sender: a refused destination is failed
at once, with no traffic."""

from __future__ import annotations

import ipaddress

import pytest

from scheduler import destinations

ALLOW_TEN = destinations.parse_networks("10.20.0.0/16")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:5432/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/hook",
        "http://192.168.1.1/",
        "http://172.16.0.1/",
        "http://100.64.0.1/",
        "http://0.0.0.0/",
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://224.0.0.1/",
    ],
)
def test_loopback_link_local_private_and_reserved_destinations_are_refused(url: str) -> None:
    with pytest.raises(destinations.DestinationError, match="resolves to"):
        destinations.check(url, ())


def test_public_addresses_and_allowed_networks_pass() -> None:
    destinations.check("https://8.8.8.8/hook", ())
    destinations.check("https://[2001:4860:4860::8888]/hook", ())
    destinations.check("http://10.20.3.4:8080/hook", ALLOW_TEN)
    with pytest.raises(destinations.DestinationError):
        destinations.check("http://10.21.3.4/hook", ALLOW_TEN)


def test_a_host_that_does_not_resolve_is_unresolved_not_refused() -> None:
    with pytest.raises(destinations.Unresolved):
        destinations.check("http://no-such-host.invalid/hook", ())


def test_the_allow_list_parses_cidrs_and_addresses_and_names_a_bad_entry() -> None:
    assert destinations.parse_networks(" 127.0.0.0/8, 10.1.2.3 ,") == (
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("10.1.2.3/32"),
    )
    with pytest.raises(ValueError, match="'nope' is not an address"):
        destinations.parse_networks("10.0.0.0/8,nope")
