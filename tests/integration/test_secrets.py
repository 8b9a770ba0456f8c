"""Secrets (scheduler/secrets.py) and a job's environment (jobs.env, jobs.secret_env) on
a real PostgreSQL: values kept only encrypted, decrypted as stored when a driver starts,
rotated under a new key, refused by name (never echoed) when anything is wrong."""

from __future__ import annotations

import types

import pytest
import sqlalchemy as sa
from cryptography.fernet import MultiFernet

from scheduler import job_revisions, job_spec, job_views, secrets
from server import runs, warm
from server import settings as settings_module
from testing import factories

VALUE = b"pa55-w0rd-that-must-never-show"


@pytest.fixture
def box() -> MultiFernet:
    return secrets.parse_keys(secrets.new_key())


def test_a_value_is_stored_encrypted_and_read_back_as_stored_now(engine: sa.Engine, box) -> None:
    with engine.begin() as conn:
        assert secrets.put(conn, "db-password", VALUE, box, "cli:test") == 1
        stored = conn.execute(sa.text("SELECT ciphertext FROM secrets")).scalar_one()
        assert VALUE.decode() not in stored
        got = secrets.values_for(conn, {"DB_PASSWORD": "db-password"}, box)
        assert got == {"DB_PASSWORD": VALUE.decode()}
        assert secrets.put(conn, "db-password", b"second", box, "cli:test") == 2
        assert secrets.values_for(conn, {"X": "db-password"}, box) == {"X": "second"}


def test_rotation_re_encrypts_under_the_first_key_and_the_old_key_can_go(
    engine: sa.Engine,
) -> None:
    old, new = secrets.new_key(), secrets.new_key()
    with engine.begin() as conn:
        secrets.put(conn, "token", VALUE, secrets.parse_keys(old), None)
        with pytest.raises(secrets.KeyProblem) as refused:
            secrets.values_for(conn, {"T": "token"}, secrets.parse_keys(new))
        assert "'token'" in str(refused.value) and new not in str(refused.value)
        assert secrets.rotate(conn, secrets.parse_keys(f"{new},{old}")) == 1
        assert secrets.values_for(conn, {"T": "token"}, secrets.parse_keys(new)) == {
            "T": VALUE.decode()
        }


def test_a_value_without_a_key_or_a_secret_is_refused_by_name(engine: sa.Engine, box) -> None:
    with engine.begin() as conn:
        with pytest.raises(secrets.KeyProblem, match="SPARKRING_SECRET_KEYS is not set"):
            secrets.values_for(conn, {"T": "token"}, None)
        with pytest.raises(secrets.SecretNotFound, match="T: no secret named 'token'"):
            secrets.values_for(conn, {"T": "token"}, box)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (b"x" * (secrets.MAX_VALUE_BYTES + 1), "at most 65536 bytes"),
        (b"a\0b", "NUL"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_a_value_a_variable_cannot_hold_is_refused(
    engine: sa.Engine, box, value: bytes, fragment: str
) -> None:
    with engine.begin() as conn, pytest.raises(secrets.SecretError, match=fragment):
        secrets.put(conn, "s", value, box, None)


def test_a_secret_given_to_a_job_cannot_be_deleted(engine: sa.Engine, box) -> None:
    with engine.begin() as conn:
        secrets.put(conn, "api-key", VALUE, box, None)
    factories.job(engine, "uses-it", start=False, secret_env={"API_KEY": "api-key"})
    with engine.begin() as conn:
        listed = {row.name: row for row in secrets.listing(conn)}
        assert listed["api-key"].jobs == ("uses-it",)
        with pytest.raises(secrets.SecretInUse, match="uses-it"):
            secrets.delete(conn, "api-key")
    with engine.begin() as conn:
        job_revisions.update(conn, "uses-it", job_spec.Change(unset_secret_env=["API_KEY"]))
        secrets.delete(conn, "api-key")
        with pytest.raises(secrets.SecretNotFound):
            secrets.delete(conn, "api-key")


@pytest.mark.parametrize(
    ("env", "secret_env", "fragment"),
    [
        ({"SPARKRING_JOB": "x"}, {}, "set by the server"),
        ({"PYSPARK_PYTHON": "/bin/sh"}, {}, "set by the server"),
        ({"1BAD": "x"}, {}, "variable name"),
        ({"A": "x"}, {"A": "s"}, "both --env and --secret-env"),
        ({}, {"A": "no-such-secret"}, "no secret named 'no-such-secret'"),
    ],
)
def test_a_job_environment_that_cannot_be_given_is_refused(
    engine: sa.Engine, env: dict[str, str], secret_env: dict[str, str], fragment: str
) -> None:
    with engine.begin() as conn:
        secrets.put(conn, "s", VALUE, secrets.parse_keys(secrets.new_key()), None)
    with pytest.raises(job_spec.JobError, match=fragment):
        factories.job(engine, "refused", start=False, env=env, secret_env=secret_env)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one() == 0


def test_env_is_a_revision_and_its_history_names_secrets_never_values(
    engine: sa.Engine, box
) -> None:
    with engine.begin() as conn:
        secrets.put(conn, "warehouse", VALUE, box, None)
    factories.job(engine, "etl", start=False, env={"REGION": "eu"})
    with engine.begin() as conn:
        revised = job_revisions.update(
            conn,
            "etl",
            job_spec.Change(env={"REGION": "us"}, secret_env={"DB_PASSWORD": "warehouse"}),
        )
        assert set(revised.changed) == {"env", "secret_env"}
        history = job_revisions.history(conn, "etl")
        shown = job_views.show(conn, "etl").as_json()
    assert history[-1]["diff"] == [
        "env REGION 'eu' -> 'us'",
        "secret_env DB_PASSWORD='warehouse' added",
    ]
    assert shown["env"] == {"REGION": "us"} and shown["secret_env"] == {"DB_PASSWORD": "warehouse"}
    assert VALUE.decode() not in repr(history) + repr(shown)
    with engine.begin() as conn, pytest.raises(job_spec.JobConflict, match="not set"):
        job_revisions.update(conn, "etl", job_spec.Change(unset_env=["NOPE"]))


def test_a_bad_secret_key_setting_is_refused_without_echoing_it() -> None:
    bad = "not-a-fernet-key-but-a-secret-value"
    with pytest.raises(settings_module.SettingsError) as refused:
        settings_module.load(require=(), secret_keys=f"{secrets.new_key()},{bad}")
    message = str(refused.value)
    assert "SPARKRING_SECRET_KEYS" in message and "key 2" in message
    assert bad not in message


def test_a_warm_driver_holding_a_secret_given_a_new_value_since_is_not_taken(
    engine: sa.Engine, box, tmp_path
) -> None:
    """server/warm.py: a warm driver read its secrets when it was pre-started; a claim
    takes it only if none has had a new value since (else it starts cold, with the new)."""
    with engine.begin() as conn:
        secrets.put(conn, "token", VALUE, box, None)
        held = secrets.versions(conn, ["token", "absent"])
    assert held == {"token": 1}
    warm_run = runs.WarmRun(
        job_id=1, name="j", kind="streaming", epoch=2, attempt=1, revision=1,
        run_dir=tmp_path, secret_versions=held,
    )  # fmt: skip
    ctx = types.SimpleNamespace(engine=engine)
    assert not warm._secrets_changed(ctx, warm_run)
    with engine.begin() as conn:
        secrets.put(conn, "token", b"rotated", box, None)
    assert warm._secrets_changed(ctx, warm_run)


def test_a_driver_spec_never_shows_its_variables_in_a_repr(tmp_path) -> None:
    from server import driver

    spec = driver.DriverSpec(
        job="j", kind="batch", epoch=1, attempt=1, server="s1", main=tmp_path / "m.py",
        run_dir=tmp_path, master="local[1]", extra_env={"DB_PASSWORD": VALUE.decode()},
    )  # fmt: skip
    assert VALUE.decode() not in repr(spec) and VALUE.decode() not in str(spec)
