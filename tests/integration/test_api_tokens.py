"""scheduler/tokens.py on PostgreSQL: only hashes are stored, revocation is immediate and
guarded, the cluster credential is created once and then stable."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from scheduler import tokens
from sql import tables


def test_a_token_is_stored_only_as_its_hash_and_authenticates_to_its_role(
    engine: sa.Engine,
) -> None:
    with engine.begin() as conn:
        token = tokens.create(conn, "ci", "operator")
    with engine.connect() as conn:
        stored = conn.execute(sa.select(tables.api_tokens)).one()
        assert stored.token_sha256 == tokens.digest(token) and token not in str(stored)
        principal = tokens.authenticate(conn, token)
    assert principal == tokens.Principal("ci", tokens.Role.OPERATOR)
    assert principal.may_write and principal.actor == "token:ci"


@pytest.mark.parametrize("presented", ["", "srt_", "srt_nope", "x" * 300, "not-a-token"])
def test_unknown_or_malformed_tokens_authenticate_to_nobody(
    engine: sa.Engine, presented: str
) -> None:
    with engine.begin() as conn:
        tokens.create(conn, "ci", "viewer")
        assert tokens.authenticate(conn, presented) is None


def test_revoke_is_immediate_and_a_second_revoke_is_an_error(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        token = tokens.create(conn, "old", "viewer")
        tokens.revoke(conn, "old")
        assert tokens.authenticate(conn, token) is None
        with pytest.raises(tokens.TokenError, match="no active token named 'old'"):
            tokens.revoke(conn, "old")
        with pytest.raises(tokens.TokenError, match="no active token named 'never'"):
            tokens.revoke(conn, "never")
        [row] = tokens.list_tokens(conn)
    assert row["name"] == "old" and not row["active"]


def test_the_cluster_credential_is_created_once_and_reads_only(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        first = tokens.cluster_secret(conn)
    with engine.begin() as conn:
        assert tokens.cluster_secret(conn) == first
        principal = tokens.authenticate(conn, first)
    assert len(first) >= 32 and principal is not None
    assert principal.role == tokens.Role.CLUSTER and not principal.may_write


def test_a_token_with_an_expiry_works_until_then_and_is_listed_as_expired(
    engine: sa.Engine,
) -> None:
    with engine.begin() as conn:
        token = tokens.create(conn, "temp", "operator", expires_in=3600)
        forever = tokens.create(conn, "forever", "viewer")
        assert tokens.authenticate(conn, token) == tokens.Principal("temp", tokens.Role.OPERATOR)
        # The clock moves on: the expiry is now in the past.
        conn.execute(
            sa.text(
                "UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE name = 'temp'"
            )
        )
        with pytest.raises(tokens.TokenExpired) as expired:
            tokens.authenticate(conn, token)
        assert tokens.authenticate(conn, forever) is not None
        rows = {r["name"]: r for r in tokens.list_tokens(conn)}
    assert str(expired.value).startswith("token 'temp' expired at ")
    assert token not in str(expired.value)
    assert rows["temp"]["expired"] and not rows["temp"]["active"]
    assert rows["forever"]["expires_at"] is None and rows["forever"]["active"]


@pytest.mark.parametrize("expires_in", [0, -5, float("inf")])
def test_an_expiry_must_be_a_positive_duration(engine: sa.Engine, expires_in: float) -> None:
    with engine.begin() as conn, pytest.raises(tokens.TokenError, match="must expire after"):
        tokens.create(conn, "bad", "viewer", expires_in=expires_in)


def test_last_use_is_recorded_at_most_once_a_minute(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        token = tokens.create(conn, "ci", "viewer")
        assert tokens.list_tokens(conn)[0]["last_used_at"] is None
    with engine.begin() as conn:
        tokens.authenticate(conn, token)
        first = tokens.list_tokens(conn)[0]["last_used_at"]
    with engine.begin() as conn:
        tokens.authenticate(conn, token)
        assert tokens.list_tokens(conn)[0]["last_used_at"] == first
        conn.execute(sa.text("UPDATE api_tokens SET last_used_at = now() - interval '2 minutes'"))
    with engine.begin() as conn:
        tokens.authenticate(conn, token)
        assert tokens.list_tokens(conn)[0]["last_used_at"] > first
    assert first is not None


def test_a_bad_token_does_not_write_the_cluster_credential(engine: sa.Engine) -> None:
    """An unauthenticated request must not make the server write to the database."""
    with engine.begin() as conn:
        assert tokens.authenticate(conn, "no-prefix-guess") is None
        assert conn.execute(sa.text("SELECT count(*) FROM cluster_credential")).scalar_one() == 0


def test_a_token_name_with_a_trailing_newline_is_refused_by_name(engine: sa.Engine) -> None:
    with engine.begin() as conn, pytest.raises(tokens.TokenError, match="token name"):
        tokens.create(conn, "ci\n", "viewer")
