"""Several PostgreSQL hosts in ``SPARKRING_DATABASE_URL`` (a primary and its standbys):
libpq's form and SQLAlchemy's, what messages show, and a first host that is down."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from scheduler import notify
from sql import database

LIBPQ_FORM = "postgresql://u:s3cretPW@db-a:5432,db-b:5433/sparkring?sslmode=require"
SQLALCHEMY_FORM = "postgresql://u:s3cretPW@/sparkring?host=db-a:5432&host=db-b:5433"


@pytest.mark.parametrize("raw", [LIBPQ_FORM, SQLALCHEMY_FORM])
def test_both_forms_name_every_host_and_ask_for_a_writable_one(raw: str) -> None:
    url = database.parse_url(raw)
    assert database.hosts(url) == [("db-a", 5432), ("db-b", 5433)]
    assert database.describe(url) == "db-a:5432,db-b:5433/sparkring"
    # A standby listed first must not be taken for the primary.
    assert url.query["target_session_attrs"] == "read-write"
    assert url.password == "s3cretPW" and url.username == "u"


def test_an_explicit_target_session_attrs_is_kept() -> None:
    url = database.parse_url(LIBPQ_FORM + "&target_session_attrs=primary")
    assert url.query["target_session_attrs"] == "primary"


def test_one_host_is_left_as_it_was() -> None:
    url = database.parse_url("postgresql://u:pw@db:5432/sparkring")
    assert database.hosts(url) == [("db", 5432)]
    assert "target_session_attrs" not in url.query
    assert database.describe(url) == "db:5432/sparkring"


def test_hosts_without_a_port_take_postgresqls() -> None:
    url = database.parse_url("postgresql://u@db-a,db-b:6000/sparkring")
    assert database.hosts(url) == [("db-a", 5432), ("db-b", 6000)]


def test_a_multi_host_url_renders_and_reads_back() -> None:
    """A server hands each watchdog its URL rendered (server/launch.py)."""
    url = database.parse_url(LIBPQ_FORM)
    assert database.parse_url(url.render_as_string(hide_password=False)) == url


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("postgresql://u:s3cretPW@db-a:5432,db-b:x/sparkring", "port must be a number"),
        ("postgresql://u:s3cretPW@db-a:5432,db-b:0/sparkring", "port must be a number"),
        ("postgresql://u:s3cretPW@db-a:5432,,db-b/sparkring", "empty host"),
        ("postgresql://u:s3cretPW@[::1]:5432,db-b/sparkring", "IPv6"),
    ],
)
def test_a_bad_host_list_is_named_without_the_password(raw: str, says: str) -> None:
    with pytest.raises(database.InvalidURL) as caught:
        database.parse_url(raw)
    assert says in str(caught.value) and "s3cret" not in str(caught.value)


def test_the_listeners_conninfo_lists_every_host() -> None:
    info = notify.conninfo(LIBPQ_FORM)
    parsed = dict(part.split("=", 1) for part in info.split())
    assert parsed["host"] == "db-a,db-b" and parsed["port"] == "5432,5433"
    assert parsed["target_session_attrs"] == "read-write"
    assert parsed["sslmode"] == "require"


def test_a_first_host_that_is_down_is_passed_over(postgres_url: str) -> None:
    """libpq tries the hosts in order: the primary is the one that answers writably."""
    url = database.parse_url(postgres_url)
    listed = [f"{host}:{port}" for host, port in database.hosts(url)]
    both = url.set(host=None, port=None).update_query_dict({"host": ["127.0.0.1:1", *listed]})
    engine = database.create_engine(both.render_as_string(hide_password=False), pool_size=1)
    try:
        database.check(engine)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_is_in_recovery()")).scalar() is False
    finally:
        engine.dispose()


def test_every_host_down_is_one_line_naming_them(postgres_url: str) -> None:
    engine = database.create_engine(
        "postgresql://u:s3cretPW@127.0.0.1:1,127.0.0.1:2/x", pool_size=1, connect_timeout=2
    )
    with pytest.raises(database.DatabaseUnreachable) as caught:
        database.check(engine)
    message = str(caught.value)
    assert message.startswith("cannot reach PostgreSQL at 127.0.0.1:1,127.0.0.1:2/x: "), message
    assert "s3cret" not in message


def test_a_session_that_became_read_only_is_not_reused(database_url: str) -> None:
    """After a failover the old primary may come back as a standby: its sessions answer
    ``SELECT 1`` (the pool's ping) but refuse every write. The first refusal discards
    the pool, so the next checkout connects again and finds the writable host."""
    engine = database.create_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            before = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
            conn.execute(sa.text("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"))
            conn.commit()
        with pytest.raises(sa.exc.DBAPIError) as caught, engine.connect() as conn:
            conn.execute(sa.text("CREATE TEMP TABLE t (x int)"))
        assert caught.value.connection_invalidated
        with engine.begin() as conn:
            after = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
            conn.execute(sa.text("CREATE TEMP TABLE t (x int)"))
        assert after != before
    finally:
        engine.dispose()
