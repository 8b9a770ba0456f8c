"""The one place settings are read: ``SPARKRING_*`` environment variables or a TOML file.

Precedence, highest first: explicit overrides (command-line flags), environment
variables, the TOML file given with ``--config``, the defaults in ``server/defaults.py``.
The TOML file may use either the field names (``database_url``) or the environment
names (``SPARKRING_DATABASE_URL``). Everything is validated once, at start-up; a bad or
missing value raises :class:`SettingsError` naming the key. Secrets are ``SecretStr`` and
never appear in ``repr``, logs or errors.

The addresses and credentials of the services (:data:`SERVICE_KEYS`) are required by a
server, which uses them all, but a CLI command needs only those of the services it
talks to: it loads with ``require=()`` and :meth:`Settings.require` checks each key where
it is used (``server/clients.py``), with the same error naming the key.
"""

from __future__ import annotations

import math
import os
import re
import socket
import tomllib
import urllib.parse
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from resource_center import defaults as resource_defaults
from scheduler import destinations
from server import defaults
from sql import database

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

ENV_PREFIX = "SPARKRING_"


class SettingsError(Exception):
    """A setting is missing or invalid; the message names the key and never the value."""


# Settings without a usable default: empty means "not set" until a user of the key
# requires it. A server requires them all; a CLI command those of the services it uses.
SERVICE_KEYS = ("database_url", "zk_hosts", "s3_endpoint", "s3_access_key", "s3_secret_key")
DATABASE_KEYS = ("database_url",)
ZOOKEEPER_KEYS = ("zk_hosts",)
S3_KEYS = ("s3_endpoint", "s3_access_key", "s3_secret_key")


# A duration as operators write it: "30d", "12h", "90m", "3600s" or plain seconds.
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_HELP = "a duration like 30d, 12h, 90m, 3600s or plain seconds"


def parse_duration(value: object) -> float:
    """Seconds of a duration: ``"30d"``, ``"12h"``, ``"90m"``, ``"3600s"``, ``"3600"`` or
    a non-negative number. Raises ValueError (without echoing the value) otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"must be {DURATION_HELP}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(str(value).strip().lower())
        if match is None:
            raise ValueError(f"must be {DURATION_HELP}")
        seconds = float(match[1]) * _UNIT_SECONDS[match[2]]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"must be {DURATION_HELP}")
    return seconds


class Role(StrEnum):
    BOTH = "both"  # runs jobs and may be elected coordinator
    COORDINATOR = "coordinator"  # may be elected coordinator, runs no jobs
    WORKER = "worker"  # runs jobs, never coordinates


class Settings(BaseSettings):
    """Typed settings of one sparkring process."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", case_sensitive=False, frozen=True
    )

    database_url: SecretStr = SecretStr("")
    # HOST:PORT[,HOST:PORT...][/chroot], as ZooKeeper clients take it.
    zk_hosts: str = ""
    zk_root: str = defaults.ZK_ROOT
    zk_session_timeout: float = Field(defaults.ZK_SESSION_TIMEOUT_S, gt=0)
    # "user:password" for ZooKeeper digest authentication; empty disables ACLs.
    zk_auth: SecretStr = SecretStr("")
    # The credential being replaced, while it is rotated (docs/security.md): held as a
    # second identity, and nodes are readable by both. Needs zk_auth.
    zk_auth_previous: SecretStr = SecretStr("")
    s3_endpoint: str = ""
    s3_access_key: SecretStr = SecretStr("")
    s3_secret_key: SecretStr = SecretStr("")
    s3_bucket: str = resource_defaults.S3_BUCKET
    s3_secure: bool = resource_defaults.S3_SECURE
    s3_region: str = resource_defaults.S3_REGION
    spark_master: str = defaults.SPARK_MASTER
    checkpoint_root: Path = Path(defaults.CHECKPOINT_ROOT)
    work_dir: Path = Path(defaults.WORK_DIR)
    server_id: str = Field(default_factory=socket.gethostname)
    capacity: int = Field(defaults.CAPACITY, ge=0)
    role: Role = Role(defaults.ROLE)
    lease_ttl: float = Field(defaults.LEASE_TTL_S, gt=0)
    watchdog_margin: float = Field(defaults.WATCHDOG_MARGIN_S, gt=0)
    lease_renew_interval: float = Field(defaults.LEASE_RENEW_INTERVAL_S, gt=0)
    lease_lapse_grace: float = Field(defaults.LEASE_LAPSE_GRACE_S, gt=0)
    defer_streak: int = Field(defaults.DEFER_STREAK, ge=0)
    defer_avoid: float = Field(defaults.DEFER_AVOID_S, ge=0)
    poll_interval: float = Field(defaults.POLL_INTERVAL_S, gt=0)
    handover_window: float = Field(defaults.HANDOVER_WINDOW_S, ge=0)
    db_lock_timeout: float = Field(defaults.DB_LOCK_TIMEOUT_S, gt=0)
    db_idle_in_transaction_timeout: float = Field(defaults.DB_IDLE_IN_TRANSACTION_TIMEOUT_S, gt=0)
    db_statement_timeout: float = Field(defaults.DB_STATEMENT_TIMEOUT_S, gt=0)
    stop_grace: float = Field(defaults.STOP_GRACE_S, ge=0)
    # Warm hand-off: the old owner's longest wait for the target's warm driver, seconds
    # (docs/drivers.md, "Warm hand-off"); 0: no wait (a claim still takes a warm driver).
    warm_ready_wait: float = Field(defaults.WARM_READY_WAIT_S, ge=0)
    restart_backoff_base: float = Field(defaults.RESTART_BACKOFF_BASE_S, ge=0)
    restart_backoff_max: float = Field(defaults.RESTART_BACKOFF_MAX_S, ge=0)
    max_artifact_bytes: int = Field(defaults.MAX_ARTIFACT_BYTES, gt=0)
    cache_max_bytes: int = Field(resource_defaults.CACHE_MAX_BYTES, gt=0)
    placement_epsilon: float = Field(defaults.PLACEMENT_EPSILON, gt=0)
    # Settle window of sticky placement, seconds (server/defaults.py).
    placement_settle: float = Field(defaults.PLACEMENT_SETTLE_S, ge=0)
    # Minimum residency of a gentle join, seconds (server/defaults.py).
    min_residency: float = Field(defaults.MIN_RESIDENCY_S, ge=0)
    health_port: int = Field(defaults.HEALTH_PORT, ge=0, le=65535)
    # Health monitor of the local drivers, seconds (server/health.py, docs/drivers.md).
    health_interval: float = Field(defaults.HEALTH_INTERVAL_S, gt=0)
    stall_timeout: float = Field(defaults.STALL_TIMEOUT_S, gt=0)
    resource_wait_timeout: float = Field(defaults.RESOURCE_WAIT_TIMEOUT_S, gt=0)
    # Host name other servers and the CLI use to reach this server's HTTP endpoint.
    advertise_host: str = Field(default_factory=socket.gethostname)
    # The console's address as people reach it (behind a proxy, say), for the link in
    # each alert (docs/alerts.md); unset, this server's own listener.
    console_url: str | None = None
    # How often a server looks for alert deliveries to send, seconds.
    alert_interval: float = Field(defaults.ALERT_INTERVAL_S, gt=0)
    # Networks (comma-separated CIDRs or addresses) a webhook may reach although they are
    # not public: loopback, private, link-local... are refused otherwise (docs/alerts.md).
    alert_allow_networks: str = ""
    # Webhooks are verified against the system's trust store; true also trusts
    # SPARKRING_TLS_CA (a receiver inside the cluster with a certificate of its CA).
    alert_trust_cluster_ca: bool = False
    # PEM certificate chain and key of the HTTP listener (server/tls.py): both or
    # neither; unset, the API and console are plain HTTP.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # PEM CA (or a self-signed certificate) calls to a server's listener are verified
    # against; unset, the system's trust store.
    tls_ca: Path | None = None
    # How long a driver start retries an unreachable S3 before deferring the job, seconds.
    s3_fetch_retry: float = Field(resource_defaults.S3_FETCH_RETRY_S, ge=0)
    # How long job events and shipped driver logs are kept, seconds; a duration such as
    # "30d" is accepted (parse_duration). 0 keeps them forever.
    history_retention: float = defaults.HISTORY_RETENTION_S
    # Optional JSON-lines file where watchdogs record each driver's start and end
    # (job, epoch, server, pid, time): evidence for chaos tests and audits.
    driver_records: Path | None = None
    # The OS user (name or uid) drivers run as, with its own group; empty: the server's
    # own user, which lets a job read the server's credentials (docs/drivers.md).
    driver_user: str = ""
    # How many nice steps below the server and its watchdogs drivers run (0-19; 0: the
    # same priority). A host thawed after a pause, or saturated by its drivers, must
    # still run the watchdog that is to kill a driver whose lease ran out (docs/drivers.md).
    driver_nice: int = Field(defaults.DRIVER_NICE, ge=0, le=19)
    # Fernet keys, comma-separated, of the secrets jobs get (scheduler/secrets.py): the
    # first encrypts, all decrypt. Unset: no secret can be made or given here.
    secret_keys: SecretStr = SecretStr("")

    @field_validator("database_url")
    @classmethod
    def _database_url_is_postgresql(cls, value: SecretStr) -> SecretStr:
        """Parsed here, once, so that a bad URL is a settings error naming the key; the
        message never shows any part of the URL (sql/database.py)."""
        if value.get_secret_value():  # not set: refused where it is required
            try:
                database.parse_url(value.get_secret_value())
            except database.InvalidURL as exc:
                raise ValueError(exc.problem) from None
        return value

    @field_validator("zk_hosts")
    @classmethod
    def _zk_hosts_are_host_port_pairs(cls, value: str) -> str:
        hosts = value.partition("/")[0]
        if not value:
            return value  # not set: refused where it is required (Settings.require)
        for entry in hosts.split(","):
            try:
                parts = urllib.parse.urlsplit("//" + entry.strip())
                valid = bool(parts.hostname) and parts.port != 0 and not parts.path
            except ValueError:  # a port that is not a number in 0-65535
                valid = False
            if not valid:
                raise ValueError(
                    "must be HOST:PORT[,HOST:PORT...][/chroot] with ports 1-65535 "
                    "(e.g. zk1:2181,zk2:2181)"
                )
        return value

    @field_validator("history_retention", mode="before")
    @classmethod
    def _history_retention_is_a_duration(cls, value: object) -> float:
        return parse_duration(value) if value is not None else defaults.HISTORY_RETENTION_S

    @field_validator("secret_keys")
    @classmethod
    def _secret_keys_are_fernet_keys(cls, value: SecretStr) -> SecretStr:
        if value.get_secret_value().strip():
            from scheduler import secrets  # cryptography: only where keys are set

            try:
                secrets.parse_keys(value.get_secret_value())
            except secrets.SecretError as exc:  # names the key's position, never the key
                raise ValueError(str(exc).removeprefix(secrets.KEYS_SETTING + ": ")) from None
        return value

    def secret_box(self) -> MultiFernet | None:
        """``secret_keys`` as the MultiFernet that encrypts and decrypts; None: unset."""
        from scheduler import secrets

        text = self.secret_keys.get_secret_value()
        return secrets.parse_keys(text) if text.strip() else None

    @field_validator("alert_allow_networks")
    @classmethod
    def _alert_allow_networks_are_networks(cls, value: str) -> str:
        destinations.parse_networks(value)  # its ValueError names the bad entry
        return value

    def alert_networks(self) -> tuple[destinations.Network, ...]:
        """``alert_allow_networks``, parsed."""
        return destinations.parse_networks(self.alert_allow_networks)

    @field_validator("zk_root")
    @classmethod
    def _zk_root_is_absolute(cls, value: str) -> str:
        if not value.startswith("/") or (value.endswith("/") and value != "/"):
            raise ValueError("must be an absolute ZooKeeper path like /sparkring")
        return value

    @field_validator("server_id")
    @classmethod
    def _server_id_is_a_name(cls, value: str) -> str:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
        if not value or len(value) > 64 or not set(value) <= allowed:
            raise ValueError("must be 1-64 characters of letters, digits, '-', '_' or '.'")
        return value

    @model_validator(mode="after")
    def _pairs_are_complete(self) -> Settings:
        """Settings that mean nothing alone (server/tls.py, docs/security.md)."""
        p = ENV_PREFIX
        if self.zk_auth_previous.get_secret_value() and not self.zk_auth.get_secret_value():
            raise ValueError(
                f"{p}ZK_AUTH_PREVIOUS needs {p}ZK_AUTH: the previous credential is held "
                "only while rotating to a new one"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(f"{p}TLS_CERT and {p}TLS_KEY go together: set both or neither")
        return self

    @model_validator(mode="after")
    def _timings_fit_the_lease(self) -> Settings:
        """The timing assumptions of the lease protocol (docs/drivers.md), checked once.

        A driver may live ``lease_guard`` = TTL - margin after the renewal that
        confirmed it; renewals, and the longest a renewal can be held up by a lock
        held in a paused transaction, must fit inside it."""
        p = ENV_PREFIX
        if self.watchdog_margin >= self.lease_ttl:
            raise ValueError(
                f"{p}WATCHDOG_MARGIN ({self.watchdog_margin} s) must be below "
                f"{p}LEASE_TTL ({self.lease_ttl} s)"
            )
        if self.lease_renew_interval >= self.lease_guard:
            raise ValueError(
                f"{p}LEASE_RENEW_INTERVAL ({self.lease_renew_interval} s) must be below "
                f"{p}LEASE_TTL - {p}WATCHDOG_MARGIN ({self.lease_guard} s)"
            )
        held = self.db_idle_in_transaction_timeout + self.db_lock_timeout
        if held >= self.lease_guard:
            raise ValueError(
                f"{p}DB_IDLE_IN_TRANSACTION_TIMEOUT + {p}DB_LOCK_TIMEOUT ({held} s) must be "
                f"below {p}LEASE_TTL - {p}WATCHDOG_MARGIN ({self.lease_guard} s)"
            )
        return self

    def require(self, *names: str) -> Settings:
        """Self, once every setting in ``names`` is set (a key the caller uses): else
        :class:`SettingsError` naming each missing one."""
        problems = [
            f"{ENV_PREFIX}{name.upper()} is "
            + ("empty" if name in self.model_fields_set else "not set")
            for name in names
            if not _unwrapped(getattr(self, name))
        ]
        if problems:
            raise SettingsError(f"invalid settings: {'; '.join(problems)}")
        return self

    @property
    def lease_guard(self) -> float:
        """Seconds a driver may live without a confirmed renewal (watchdog deadline)."""
        return self.lease_ttl - self.watchdog_margin


def _unwrapped(value: Any) -> Any:
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise SettingsError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from exc
    values: dict[str, Any] = {}
    unknown = []
    for key, value in raw.items():
        name = key.lower()
        name = name.removeprefix(ENV_PREFIX.lower())
        if name not in Settings.model_fields:
            unknown.append(repr(key))
        values[name] = value
    if unknown:
        noun = "unknown key" if len(unknown) == 1 else "unknown keys"
        raise SettingsError(f"config file {path}: {noun} {', '.join(unknown)}")
    return values


def _describe(error: dict[str, Any]) -> str:
    if not error["loc"]:  # a rule across several keys: its message names them
        return str(error["msg"]).removeprefix("Value error, ")
    key = ENV_PREFIX + "_".join(str(part) for part in error["loc"]).upper()
    if error["type"] == "missing":
        return f"{key} is not set"
    return f"{key}: {str(error['msg']).removeprefix('Value error, ')}"


def load(
    config: Path | None = None, *, require: tuple[str, ...] = SERVICE_KEYS, **overrides: Any
) -> Settings:
    """Read settings once; raise :class:`SettingsError` naming every bad key.

    ``require``: the keys without a default that must be set (all of them for a server;
    ``()`` for a CLI command, which requires each where it uses it)."""
    values = _read_toml(config) if config is not None else {}
    # Environment beats the file: drop file values that the environment also sets.
    env_names = {name.upper() for name in os.environ}
    values = {k: v for k, v in values.items() if (ENV_PREFIX + k).upper() not in env_names}
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        loaded = Settings(**values)
    except ValidationError as exc:
        problems = [_describe(error) for error in exc.errors()]
        set_names = {k for k, v in values.items() if _unwrapped(v)} | {
            name.upper() for name, value in os.environ.items() if value
        }
        problems += [
            f"{ENV_PREFIX}{name.upper()} is not set"
            for name in require
            if name not in set_names and (ENV_PREFIX + name).upper() not in set_names
        ]
        raise SettingsError(f"invalid settings: {'; '.join(problems)}") from None
    return loaded.require(*require)
