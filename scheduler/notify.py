"""Wake-ups over PostgreSQL LISTEN/NOTIFY; polling stays the fallback.

Two channels: ``sparkring_jobs`` (a job was created or its desired state changed: the
coordinator recomputes, owners react) and ``sparkring_targets`` (the coordinator wrote
new targets: servers poll now). A notification only says "look again"; the payload is a
hint for logs, never a source of truth, so a lost notification costs one poll interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import psycopg
import sqlalchemy as sa

from scheduler import loop
from sql import database

JOBS_CHANNEL = "sparkring_jobs"
TARGETS_CHANNEL = "sparkring_targets"

log = logging.getLogger(__name__)


def notify(conn: sa.Connection, channel: str, payload: str = "") -> None:
    """Queue a notification; PostgreSQL delivers it when the transaction commits."""
    conn.execute(sa.select(sa.func.pg_notify(channel, payload)))


def conninfo(database_url: str) -> str:
    """A libpq connection string from a SQLAlchemy URL (password kept, never logged):
    every host it lists, and its options (``sslmode``, ``target_session_attrs``)."""
    url = database.parse_url(database_url)
    listed = database.hosts(url)
    options = {k: v for k, v in url.query.items() if k not in ("host", "port")}
    parts = {
        **{k: v if isinstance(v, str) else v[-1] for k, v in options.items()},
        "host": ",".join(host for host, _ in listed),
        "port": ",".join(str(port) for _, port in listed),
        "dbname": url.database or "",
        "user": url.username or "",
        "password": url.password or "",
        "application_name": "sparkring-listener",
        "connect_timeout": "5",
        # A listener cut off from PostgreSQL notices it as the servers' engines do.
        **{k: str(v) for k, v in database.TCP_SETTINGS.items()},
    }
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in parts.items() if v})


class Listener(loop.Loop):
    """A named daemon thread that LISTENs and calls ``on_notify(channel, payload)``.

    It reconnects with a capped backoff when PostgreSQL goes away; ``on_notify`` is also
    called with channel ``""`` after every (re)connection, because notifications sent
    while disconnected are lost and the caller should poll once.
    """

    def __init__(
        self,
        database_url: str,
        channels: Iterable[str],
        on_notify: Callable[[str, str], None],
        *,
        name: str = "pg-listener",
    ) -> None:
        self._conninfo = conninfo(database_url)
        self._channels = tuple(channels)
        self._on_notify = on_notify
        self._connected = threading.Event()
        super().__init__(name, join_timeout=5)

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def run(self) -> None:
        delay = 0.2
        while not self.stopping.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    for channel in self._channels:
                        conn.execute(f"LISTEN {channel}")
                    self._connected.set()
                    delay = 0.2
                    self._on_notify("", "connected")
                    while not self.stopping.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._on_notify(note.channel, note.payload)
            except psycopg.Error as exc:
                self._connected.clear()
                log.warning(
                    "listener lost PostgreSQL; reconnecting",
                    extra={"action": "listen_retry", "error": type(exc).__name__},
                )
                self.stopping.wait(delay)
                delay = min(delay * 2, 5.0)
