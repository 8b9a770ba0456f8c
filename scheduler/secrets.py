"""Secrets a job's driver receives as environment variables (``jobs.secret_env``).

A secret is a name and a value. The value is kept only encrypted, in ``secrets``, with
Fernet (AES-128-CBC and HMAC-SHA256, from ``cryptography``) under a key the database never
holds: ``SPARKRING_SECRET_KEYS``, one or more Fernet keys separated by commas. The first
key encrypts; every key decrypts, so a key is rotated by putting the new one first on
every server, running ``sparkring secret rotate`` (each value encrypted anew under it),
then dropping the old one (docs/secrets.md).

Nothing here returns a value but :func:`values_for`, which a server calls to start a
driver; every other function names secrets and never shows their values. An error
names the secret and the problem, never the value or a key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sql import tables

if TYPE_CHECKING:  # cryptography is imported where a value is encrypted or decrypted
    from cryptography.fernet import MultiFernet

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A variable a job may set: a POSIX-style name outside the names sparkring sets itself.
VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_PREFIX = "SPARKRING_"
# Set by the server for every driver (server/driver.py build_env): a job cannot override.
RESERVED = frozenset({"PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP"})
# The largest value a secret may have (a certificate, a key file): 64 KiB.
MAX_VALUE_BYTES = 64 * 1024
KEYS_SETTING = "SPARKRING_SECRET_KEYS"


class SecretError(ValueError):
    """Bad input or a refused command (the message names the secret, never its value)."""


class SecretNotFound(SecretError):
    """No secret of that name."""


class SecretInUse(SecretError):
    """The secret is referred to by a job's current definition."""


class KeyProblem(SecretError):
    """No key, a malformed key, or a value no key decrypts."""


@dataclass(frozen=True)
class Listed:
    name: str
    version: int
    created_at: datetime
    updated_at: datetime
    updated_by: str | None
    jobs: tuple[str, ...]  # the jobs whose current definition refers to it

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "updated_by": self.updated_by,
            "jobs": list(self.jobs),
        }


def parse_keys(text: str) -> MultiFernet:
    """``SPARKRING_SECRET_KEYS`` as a MultiFernet; refused by position, never echoed."""
    from cryptography.fernet import Fernet, MultiFernet

    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise KeyProblem(
            f"{KEYS_SETTING} is not set: secrets cannot be encrypted or decrypted here "
            "(make one with 'sparkring secret keygen')"
        )
    fernets = []
    for position, key in enumerate(keys, 1):
        try:
            fernets.append(Fernet(key.encode("ascii")))
        except (ValueError, UnicodeEncodeError):
            raise KeyProblem(
                f"{KEYS_SETTING}: key {position} is not a Fernet key "
                "(32 url-safe base64-encoded bytes; 'sparkring secret keygen' makes one)"
            ) from None
    return MultiFernet(fernets)


def new_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise SecretError(
            f"secret name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def check_variable(variable: str, option: str) -> None:
    """Refuse a variable name a job may not set, naming the option it came from."""
    if not VARIABLE.match(variable):
        raise SecretError(
            f"{option} {variable!r}: a variable name is letters, digits and '_', "
            "not starting with a digit"
        )
    if variable.upper().startswith(RESERVED_PREFIX) or variable in RESERVED:
        raise SecretError(
            f"{option} {variable!r}: {RESERVED_PREFIX}* and {', '.join(sorted(RESERVED))} "
            "are set by the server for every driver"
        )


def _check_value(value: bytes) -> None:
    if len(value) > MAX_VALUE_BYTES:
        raise SecretError(f"a secret's value is at most {MAX_VALUE_BYTES} bytes, not {len(value)}")
    if b"\0" in value:
        raise SecretError("a secret's value cannot hold a NUL byte (it becomes a variable)")
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError("a secret's value must be UTF-8 text (it becomes a variable)") from None


def put(conn: sa.Connection, name: str, value: bytes, box: MultiFernet, actor: str | None) -> int:
    """Create the secret or give it a new value; returns its version (1 when created)."""
    check_name(name)
    _check_value(value)
    ciphertext = box.encrypt(value).decode("ascii")
    return conn.execute(
        sa.text(
            """
            INSERT INTO secrets (name, ciphertext, updated_by) VALUES (:name, :c, :actor)
            ON CONFLICT (name) DO UPDATE
               SET ciphertext = EXCLUDED.ciphertext, version = secrets.version + 1,
                   updated_at = now(), updated_by = EXCLUDED.updated_by
            RETURNING version
            """
        ),
        {"name": name, "c": ciphertext, "actor": actor},
    ).scalar_one()


def _users(conn: sa.Connection) -> dict[str, list[str]]:
    """Secret name -> the jobs whose current definition refers to it."""
    rows = conn.execute(
        sa.text(
            "SELECT s.value #>> '{}' AS secret, j.name FROM jobs j, "
            "jsonb_each(j.secret_env) s ORDER BY j.name"
        )
    ).all()
    users: dict[str, list[str]] = {}
    for row in rows:
        users.setdefault(row.secret, [])
        if row.name not in users[row.secret]:
            users[row.secret].append(row.name)
    return users


def listing(conn: sa.Connection) -> list[Listed]:
    t = tables.secrets
    users = _users(conn)
    rows = conn.execute(
        sa.select(t.c.name, t.c.version, t.c.created_at, t.c.updated_at, t.c.updated_by).order_by(
            t.c.name
        )
    ).all()
    return [Listed(*r, jobs=tuple(users.get(r.name, ()))) for r in rows]


def delete(conn: sa.Connection, name: str) -> None:
    """Delete the secret; refused while a job's current definition refers to it."""
    check_name(name)
    users = _users(conn).get(name, [])
    if users:
        raise SecretInUse(
            f"secret {name!r} is given to job(s) {', '.join(users)}; "
            "update them (--unset-secret-env) first"
        )
    deleted = conn.execute(sa.delete(tables.secrets).where(tables.secrets.c.name == name)).rowcount
    if not deleted:
        raise SecretNotFound(f"no secret named {name!r}")


def missing(conn: sa.Connection, names: Iterable[str]) -> list[str]:
    """The names among ``names`` that no secret has, sorted."""
    wanted = sorted(set(names))
    if not wanted:
        return []
    t = tables.secrets
    found = set(conn.execute(sa.select(t.c.name).where(t.c.name.in_(wanted))).scalars())
    return [n for n in wanted if n not in found]


def versions(conn: sa.Connection, names: Iterable[str]) -> dict[str, int]:
    """Secret name -> its version now, for the names among ``names`` that exist."""
    wanted = set(names)
    if not wanted:
        return {}
    t = tables.secrets
    return dict(conn.execute(sa.select(t.c.name, t.c.version).where(t.c.name.in_(wanted))).all())


def values_for(
    conn: sa.Connection, secret_env: Mapping[str, str], box: MultiFernet | None
) -> dict[str, str]:
    """The variables of ``secret_env`` (variable -> secret name) with their values, as
    stored now: a driver started after a secret changed gets its new value."""
    from cryptography.fernet import InvalidToken

    if not secret_env:
        return {}
    if box is None:
        raise KeyProblem(
            f"{KEYS_SETTING} is not set on this server: it cannot give the job its secrets"
        )
    t = tables.secrets
    stored = dict(
        conn.execute(
            sa.select(t.c.name, t.c.ciphertext).where(t.c.name.in_(set(secret_env.values())))
        ).all()
    )
    out: dict[str, str] = {}
    for variable, name in sorted(secret_env.items()):
        if name not in stored:
            raise SecretNotFound(f"{variable}: no secret named {name!r}")
        try:
            out[variable] = box.decrypt(stored[name].encode("ascii")).decode("utf-8")
        except InvalidToken:
            raise KeyProblem(
                f"{variable}: secret {name!r} was encrypted with a key not in "
                f"{KEYS_SETTING} on this server"
            ) from None
    return out


def rotate(conn: sa.Connection, box: MultiFernet) -> int:
    """Encrypt every value anew under the first key; returns how many were rewritten."""
    from cryptography.fernet import InvalidToken

    t = tables.secrets
    rows = conn.execute(sa.select(t.c.name, t.c.ciphertext).with_for_update()).all()
    for row in rows:
        try:
            fresh = box.rotate(row.ciphertext.encode("ascii")).decode("ascii")
        except InvalidToken:
            raise KeyProblem(
                f"secret {row.name!r} was encrypted with a key not in {KEYS_SETTING}; "
                "nothing was rotated"
            ) from None
        conn.execute(sa.update(t).where(t.c.name == row.name).values(ciphertext=fresh))
    return len(rows)


def check_env(env: Mapping[str, str], secret_env: Mapping[str, str]) -> None:
    """Refuse variables a job may not set, and one given both a value and a secret."""
    for variable in env:
        check_variable(variable, "--env")
    for variable, name in secret_env.items():
        check_variable(variable, "--secret-env")
        check_name(name)
    both = sorted(set(env) & set(secret_env))
    if both:
        raise SecretError(
            f"variable(s) {', '.join(both)} given both --env and --secret-env: keep one"
        )


def parse_pairs(pairs: Sequence[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` strings (``--env``, ``--secret-env``) to a dict, refused by name."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SecretError(f"{option} {key or pair!r} is not KEY=VALUE")
        out[key] = value
    return out
