"""server/tokens.py on PostgreSQL: only hashes are stored, revocation is immediate and
guarded, the cluster credential is created once and then stable."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from server import tokens
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
