"""Settings: environment, TOML file, precedence and clear errors that never leak secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from server import settings as settings_module

REQUIRED = {
    "SPARKRING_DATABASE_URL": "postgresql://u:hunter2@db/sparkring",
    "SPARKRING_ZK_HOSTS": "zk:2181",
    "SPARKRING_S3_ENDPOINT": "s3:9000",
    "SPARKRING_S3_ACCESS_KEY": "access",
    "SPARKRING_S3_SECRET_KEY": "topsecret",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("SPARKRING_"):
            monkeypatch.delenv(name)


def test_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in REQUIRED.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARKRING_CAPACITY", "7")
    loaded = settings_module.load()
    assert loaded.capacity == 7
    assert loaded.zk_hosts == "zk:2181"
    assert "topsecret" not in repr(loaded)
    assert "hunter2" not in repr(loaded)


def test_toml_file_with_either_key_style_and_env_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sparkring.toml"
    lines = [f'{key} = "{value}"' for key, value in REQUIRED.items()]
    lines += ["capacity = 2", 'SPARKRING_ROLE = "worker"']
    config.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("SPARKRING_CAPACITY", "9")
    loaded = settings_module.load(config)
    assert loaded.role is settings_module.Role.WORKER
    assert loaded.capacity == 9


def test_overrides_beat_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in REQUIRED.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARKRING_SERVER_ID", "from-env")
    assert settings_module.load(server_id="from-flag").server_id == "from-flag"


def test_missing_key_is_named() -> None:
    with pytest.raises(settings_module.SettingsError, match="SPARKRING_DATABASE_URL is not set"):
        settings_module.load()


def test_bad_value_is_named_without_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in REQUIRED.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARKRING_CAPACITY", "lots")
    monkeypatch.setenv("SPARKRING_SERVER_ID", "bad id/../x")
    with pytest.raises(settings_module.SettingsError) as caught:
        settings_module.load()
    message = str(caught.value)
    assert "SPARKRING_CAPACITY" in message and "SPARKRING_SERVER_ID" in message
    assert "topsecret" not in message and "hunter2" not in message


def test_unknown_key_in_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('datbase_url = "x"\n')
    with pytest.raises(settings_module.SettingsError, match="unknown key 'datbase_url'"):
        settings_module.load(config)


def test_invalid_toml_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("capacity = = 3\n")
    with pytest.raises(settings_module.SettingsError, match="not valid TOML"):
        settings_module.load(config)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"SPARKRING_LEASE_TTL": "4", "SPARKRING_WATCHDOG_MARGIN": "4"}, "WATCHDOG_MARGIN"),
        (
            {"SPARKRING_LEASE_TTL": "8", "SPARKRING_LEASE_RENEW_INTERVAL": "6"},
            "LEASE_RENEW_INTERVAL",
        ),
        ({"SPARKRING_DB_IDLE_IN_TRANSACTION_TIMEOUT": "5"}, "DB_IDLE_IN_TRANSACTION_TIMEOUT"),
    ],
)
def test_timings_that_break_the_lease_protocol_are_refused(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, str], named: str
) -> None:
    for key, value in {**REQUIRED, **values}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(settings_module.SettingsError, match=named):
        settings_module.load()


def test_every_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('datbase_url = "x"\nSPARKRING_ZK_HOST = "y"\ncapacity = 2\ncapacty = 3\n')
    with pytest.raises(settings_module.SettingsError) as caught:
        settings_module.load(config)
    assert str(caught.value).endswith("unknown keys 'datbase_url', 'SPARKRING_ZK_HOST', 'capacty'")


@pytest.mark.parametrize("hosts", ["localhost:12181x", "zk1:2181,,zk2:2181", "zk:0", ":2181"])
def test_a_mistyped_zk_hosts_is_named(monkeypatch: pytest.MonkeyPatch, hosts: str) -> None:
    for key, value in REQUIRED.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARKRING_ZK_HOSTS", hosts)
    with pytest.raises(
        settings_module.SettingsError, match="SPARKRING_ZK_HOSTS: must be HOST:PORT"
    ):
        settings_module.load()


@pytest.mark.parametrize("hosts", ["zk:2181", "zk1:2181,zk2:2182/chroot", "zk", "[::1]:2181"])
def test_zk_hosts_as_zookeeper_takes_them(monkeypatch: pytest.MonkeyPatch, hosts: str) -> None:
    for key, value in REQUIRED.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARKRING_ZK_HOSTS", hosts)
    assert settings_module.load().zk_hosts == hosts


def test_a_command_requires_only_what_it_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKRING_DATABASE_URL", REQUIRED["SPARKRING_DATABASE_URL"])
    monkeypatch.setenv("SPARKRING_ZK_HOSTS", "")
    loaded = settings_module.load(require=())
    assert loaded.require("database_url") is loaded
    with pytest.raises(settings_module.SettingsError) as caught:
        loaded.require("zk_hosts", "s3_endpoint")
    assert str(caught.value) == (
        "invalid settings: SPARKRING_ZK_HOSTS is empty; SPARKRING_S3_ENDPOINT is not set"
    )
    with pytest.raises(settings_module.SettingsError, match="SPARKRING_S3_SECRET_KEY is not set"):
        settings_module.load()  # a server requires every service's settings


def test_missing_and_bad_keys_are_named_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKRING_CAPACITY", "abc")
    with pytest.raises(settings_module.SettingsError) as caught:
        settings_module.load()
    message = str(caught.value)
    assert "SPARKRING_CAPACITY" in message and "SPARKRING_DATABASE_URL is not set" in message


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30d", 2592000.0),
        ("12h", 43200.0),
        ("90m", 5400.0),
        ("3600s", 3600.0),
        ("3600", 3600.0),
        ("0", 0.0),
        ("1.5h", 5400.0),
        (" 7D ", 604800.0),
    ],
)
def test_history_retention_is_a_duration(
    monkeypatch: pytest.MonkeyPatch, value: str, seconds: float
) -> None:
    monkeypatch.setenv("SPARKRING_HISTORY_RETENTION", value)
    assert settings_module.load(require=()).history_retention == seconds


def test_history_retention_defaults_to_30_days_and_a_toml_number_is_seconds(
    tmp_path: Path,
) -> None:
    assert settings_module.load(require=()).history_retention == 30 * 86400
    config = tmp_path / "retention.toml"
    config.write_text("history_retention = 7200\n")
    assert settings_module.load(config, require=()).history_retention == 7200


@pytest.mark.parametrize("value", ["30 days", "-1d", "d", "1w", "", "1e3"])
def test_a_bad_history_retention_is_named(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SPARKRING_HISTORY_RETENTION", value)
    with pytest.raises(settings_module.SettingsError) as caught:
        settings_module.load(require=())
    assert "SPARKRING_HISTORY_RETENTION: must be a duration like 30d" in str(caught.value)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"SPARKRING_ZK_AUTH_PREVIOUS": "old:pw-old"}, "SPARKRING_ZK_AUTH_PREVIOUS needs"),
        ({"SPARKRING_TLS_CERT": "/etc/ssl/a.crt"}, "SPARKRING_TLS_CERT and SPARKRING_TLS_KEY"),
        ({"SPARKRING_TLS_KEY": "/etc/ssl/a.key"}, "SPARKRING_TLS_CERT and SPARKRING_TLS_KEY"),
    ],
)
def test_settings_that_go_together_are_refused_alone(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, str], named: str
) -> None:
    for key, value in {**REQUIRED, **values}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SPARKRING_ZK_AUTH", raising=False)
    with pytest.raises(settings_module.SettingsError, match=named) as caught:
        settings_module.load()
    assert "pw-old" not in str(caught.value)
