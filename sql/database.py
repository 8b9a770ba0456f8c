"""Engines for PostgreSQL: URL normalisation and a connection check with a clean error.

A URL may list several hosts, a primary and its standbys, in libpq's form
(``postgresql://u:pw@db-a:5432,db-b:5432/sparkring``) or SQLAlchemy's
(``postgresql://u:pw@/sparkring?host=db-a:5432&host=db-b:5432``). libpq tries them in
order; with several hosts :func:`parse_url` asks for ``target_session_attrs=read-write``
unless the URL says otherwise, so that a standby is never taken for the primary. After
a failover, a session whose host became read-only (a demoted primary) or is shutting
down is discarded with the whole pool at its first refusal (:func:`create_engine`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError


class DatabaseError(Exception):
    """PostgreSQL is unreachable or the URL is wrong; the message never shows a password."""


class DatabaseUnreachable(DatabaseError):
    """The URL is valid but PostgreSQL did not answer (down, refused, timed out)."""


class InvalidURL(DatabaseError):
    """The database URL cannot be used. ``problem`` says why without showing any part of
    the URL: a fragment of the password must reach no message and no log."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"SPARKRING_DATABASE_URL: {problem}")
        self.problem = problem


URL_FORM = "postgresql://user:password@host:port/database"
# Schemes of PostgreSQL URLs; all of them are served by the psycopg 3 driver.
POSTGRESQL_SCHEMES = frozenset(
    {"postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"}
)
PORT_PROBLEM = "the port must be a number in 1-65535"
AT_PROBLEM = (
    "holds more than one '@': an '@' in the password (or the user name, database name or "
    "options) must be percent-encoded as %40, as in postgresql://user:p%40ss@host:5432/db"
)
USER_PROBLEM = (
    "has an '@' that does not end a user name: a '/' in the user name must be "
    "percent-encoded as %2F, an '@' anywhere but before the host as %40"
)


def parse_url(raw: str) -> URL:
    """The URL of ``SPARKRING_DATABASE_URL`` with the psycopg 3 driver
    (``postgresql://`` and ``postgres://`` accepted), or :class:`InvalidURL`.

    The one literal ``@`` of a URL is the one between ``user:password`` and the host:
    parsed with another one, part of the password would become the host or the database
    name, which messages show."""
    if raw.count("@") > 1:
        raise InvalidURL(AT_PROBLEM)
    url = _make_url(_hosts_to_query(raw))
    if url.drivername not in POSTGRESQL_SCHEMES:
        raise InvalidURL(f"must point at PostgreSQL ({URL_FORM}), not {url.drivername!r}")
    if "@" in raw and url.username is None:
        raise InvalidURL(USER_PROBLEM)
    if url.port is not None and not 1 <= url.port <= 65535:
        raise InvalidURL(PORT_PROBLEM)
    if not url.database:
        raise InvalidURL(f"names no database ({URL_FORM})")
    url = url.set(drivername="postgresql+psycopg")
    if len(hosts(url)) > 1 and "target_session_attrs" not in url.query:
        url = url.update_query_dict({"target_session_attrs": "read-write"})
    return url


# libpq's multi-host form: scheme://[userinfo@]host[:port],host[:port]/rest
_MULTI_HOST = re.compile(r"^(?P<head>[^:/]+://(?:[^@/]*@)?)(?P<hosts>[^/?]*,[^/?]*)(?P<rest>.*)$")


def _hosts_to_query(raw: str) -> str:
    """libpq's ``host1:port1,host2:port2`` in the authority, rewritten as SQLAlchemy's
    ``?host=host1:port1&host=host2:port2`` (which it cannot parse otherwise)."""
    match = _MULTI_HOST.match(raw)
    if match is None:
        return raw
    params = []
    for item in match["hosts"].split(","):
        if not item:
            raise InvalidURL("lists an empty host between commas")
        if "[" in item:
            raise InvalidURL("IPv6 addresses are not taken in a list of hosts: use host names")
        host, _, port = item.partition(":")
        _port_number(port or "5432")
        params.append(f"host={host}:{port or 5432}")
    rest = match["rest"]
    joined = "&".join(params)
    return f"{match['head']}{rest}{'&' if '?' in rest else '?'}{joined}"


def _port_number(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InvalidURL(PORT_PROBLEM)
    return int(text)


def hosts(url: URL) -> list[tuple[str, int]]:
    """Every (host, port) a URL lists, in the order libpq tries them."""
    listed = url.query.get("host")
    if listed is None:
        return [(url.host or "localhost", url.port or 5432)]
    items = [listed] if isinstance(listed, str) else list(listed)
    names = [name for item in items for name in item.split(",")]
    ports_text = url.query.get("port")
    ports = str(ports_text).split(",") if isinstance(ports_text, str) else []
    result = []
    for i, name in enumerate(names):
        host, _, port = name.partition(":")
        if not host:
            raise InvalidURL("lists an empty host")
        if not port and i < len(ports) and ports[i]:
            port = ports[i]
        result.append((host, _port_number(port) if port else url.port or 5432))
    return result


def _make_url(raw: str) -> URL:
    try:
        return sa.make_url(raw)
    except ArgumentError:
        raise InvalidURL(f"must be a URL like {URL_FORM}") from None
    except ValueError:  # the port is not a number
        raise InvalidURL(PORT_PROBLEM) from None


def describe(url: URL) -> str:
    """Hosts, ports and database of a URL, for messages (never user or password)."""
    listed = ",".join(f"{host}:{port}" for host, port in hosts(url))
    return f"{listed}/{url.database}"


# TCP keepalives on every connection: a peer that vanished (host down, cable cut) is
# noticed in about idle + interval * count = 11 s instead of the kernel's two hours.
# Keepalives probe an idle connection only. A statement sent into a cut waits on TCP's
# retransmissions instead, whose backoff doubles (0.2 s ... 12.8 s, 25.6 s): a lease
# renewal sent into a 20 s cut was answered 25 s in, after the heal, and its server's
# drivers died at their deadlines meanwhile. ``tcp_user_timeout`` drops a connection
# whose sent data stays unacknowledged for 5 s (less than a lease), so the next
# statement connects again (tests/chaos/test_database_cut.py).
TCP_SETTINGS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,
}


@dataclass(frozen=True)
class SessionLimits:
    """PostgreSQL session timeouts of a server process, seconds (0 = none).

    A server's sessions must never wait longer than its leases allow: a renewal stuck
    behind a row lock (a coordinator paused inside its target update) would let every
    driver of the server die at its watchdog deadline. ``lock_timeout`` makes such a
    wait fail so that the next renewal tries again, and
    ``idle_in_transaction_timeout`` ends the paused holder's transaction, releasing its
    locks. Interactive commands (uploads hold a transaction while they send the
    object) use no limits."""

    lock_timeout: float
    idle_in_transaction_timeout: float
    statement_timeout: float

    def options(self) -> str:
        def ms(seconds: float) -> int:
            return max(0, round(seconds * 1000))

        return " ".join(
            [
                f"-c lock_timeout={ms(self.lock_timeout)}",
                f"-c idle_in_transaction_session_timeout={ms(self.idle_in_transaction_timeout)}",
                f"-c statement_timeout={ms(self.statement_timeout)}",
            ]
        )


def create_engine(
    raw_url: str,
    *,
    pool_size: int = 5,
    connect_timeout: float = 5.0,
    limits: SessionLimits | None = None,
) -> Engine:
    url = parse_url(raw_url)
    connect_args: dict[str, object] = {
        "connect_timeout": max(1, int(connect_timeout)),
        "application_name": "sparkring",
        **TCP_SETTINGS,
    }
    if limits is not None:
        connect_args["options"] = limits.options()
    engine = sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args=connect_args,
    )
    event.listen(engine, "handle_error", _discard_after_failover)
    return engine


# SQLSTATEs of a session that must not be used again: its host became read-only (a
# demoted primary after a failover: SELECT 1 still answers, every write is refused) or
# is shutting down or restarting (admin_shutdown, crash_shutdown, cannot_connect_now).
_GONE_OVER = frozenset({"25006", "57P01", "57P02", "57P03"})


def _discard_after_failover(context: sa.engine.ExceptionContext) -> None:
    """Count such a refusal as a disconnect: SQLAlchemy then discards the whole pool,
    and the next checkout connects again (to the writable host of a multi-host URL)."""
    state = getattr(context.original_exception, "sqlstate", None)
    if state in _GONE_OVER:
        context.is_disconnect = True


def explain(exc: BaseException, url: URL) -> str:
    """One line saying why talking to the database failed, with no secret in it."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    if url.password:
        reason = reason.replace(str(url.password), "***")
    return f"cannot reach PostgreSQL at {describe(url)}: {reason}"


def check(engine: Engine) -> None:
    """Open one connection, raising :class:`DatabaseError` with a clear line on failure."""
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except DBAPIError as exc:
        raise DatabaseUnreachable(explain(exc, engine.url)) from None
