"""Settings errors as a user meets them: the real CLI, exit 78, one line naming the key,
never a traceback and never a fragment of a password; and ``--version``.

No service is needed: a URL that gets past the settings points at a closed port.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from server import settings as settings_module
from sql import database

REPO = Path(__file__).resolve().parents[2]
CONFIG_ERROR = 78
KEY = "SPARKRING_DATABASE_URL"
PREFIX = f"error: invalid settings: {KEY}: "
# Every other service setting, pointing at closed ports: `server run` gets as far as the
# database URL and no further.
OTHER_SERVICES = {
    "SPARKRING_ZK_HOSTS": "127.0.0.1:1",
    "SPARKRING_S3_ENDPOINT": "127.0.0.1:1",
    "SPARKRING_S3_ACCESS_KEY": "access",
    "SPARKRING_S3_SECRET_KEY": "secret",
}

# (URL, what the line must say, fragments of its password that must never be shown)
BAD_URLS = [
    pytest.param(
        "postgresql://u:s3cretPW@127.0.0.1:abc/x",
        "port must be a number",
        ("s3cret", "retPW"),
        id="port-not-a-number",
    ),
    pytest.param(
        "postgresql://u:s3cretPW@127.0.0.1:70000/x",
        "port must be a number",
        ("s3cret", "retPW"),
        id="port-out-of-range",
    ),
    pytest.param(
        "postgresql://u:s3c@retPW@127.0.0.1:1/x",
        "%40",
        ("s3c", "retPW"),
        id="unescaped-at-in-password",
    ),
    pytest.param(
        "postgresql://u:s3c@ret:PW@127.0.0.1:1/x",
        "%40",
        ("s3c", "ret:PW", "PW@"),
        id="unescaped-at-and-colon-in-password",
    ),
    pytest.param(
        "postgresql://a/b:s3cretPW@127.0.0.1:1/x",
        "%2F",
        ("s3cret", "retPW", "a/b"),
        id="unescaped-slash-in-user-name",
    ),
    pytest.param(
        "postgresql://u:s3cretPW@127.0.0.1:1/x?application_name=a@b",
        "%40",
        ("s3cret", "retPW"),
        id="unescaped-at-in-the-options",
    ),
    pytest.param(
        "mysql://u:s3cretPW@127.0.0.1:1/x",
        "must point at PostgreSQL",
        ("s3cret", "retPW"),
        id="not-postgresql",
    ),
    pytest.param(
        "not a url s3cretPW",
        "postgresql://user:password@host:port/database",
        ("s3cret", "retPW"),
        id="not-a-url",
    ),
    pytest.param(
        "postgresql://u:s3cretPW@127.0.0.1:1",
        "names no database",
        ("s3cret", "retPW"),
        id="no-database",
    ),
]


def _run(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m server ARGS`` of this checkout with exactly ``env`` as its settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    pythonpath = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        env={**base, "PYTHONPATH": pythonpath, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _assert_refused(
    result: subprocess.CompletedProcess[str], says: str, secrets: tuple[str, ...]
) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == CONFIG_ERROR, (result.returncode, output)
    assert "Traceback" not in output, output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), output
    assert says in lines[0], lines[0]
    for secret in secrets:
        assert secret not in output, (secret, output)


@pytest.mark.parametrize(("url", "says", "secrets"), BAD_URLS)
def test_a_bad_database_url_is_one_line_exit_78(
    tmp_path: Path, url: str, says: str, secrets: tuple[str, ...]
) -> None:
    _assert_refused(_run({KEY: url}, "job", "list", cwd=tmp_path), says, secrets)


@pytest.mark.parametrize(("url", "says", "secrets"), BAD_URLS)
def test_a_server_with_a_bad_database_url_is_refused(
    tmp_path: Path, url: str, says: str, secrets: tuple[str, ...]
) -> None:
    env = {
        **OTHER_SERVICES,
        KEY: url,
        "SPARKRING_WORK_DIR": str(tmp_path / "work"),
        "SPARKRING_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
    }
    _assert_refused(_run(env, "server", "run", "--id", "s1", cwd=tmp_path), says, secrets)


def test_a_bad_database_url_in_the_config_file_is_named(tmp_path: Path) -> None:
    config = tmp_path / "sparkring.toml"
    config.write_text("database_url = 'postgresql://u:s3c@retPW@127.0.0.1:1/x'\n")
    result = _run({}, "--config", str(config), "job", "list", cwd=tmp_path)
    _assert_refused(result, "%40", ("s3c", "retPW"))


def test_an_unreachable_database_is_named_without_user_or_password(tmp_path: Path) -> None:
    url = "postgresql://admin:s3cretPW@127.0.0.1:1/x"
    result = _run({KEY: url}, "job", "list", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert result.stderr.startswith("error: cannot reach PostgreSQL at 127.0.0.1:1/x: "), output
    assert "s3cret" not in output and "admin" not in output, output


# ------------------------------------------------------------- the settings layer


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p%40ss@db:5432/sparkring",  # an '@' percent-encoded
        "postgres://u:pa/ss@db/sparkring",  # a '/' in a password is unambiguous
        "postgresql+psycopg://postgres@127.0.0.1:5432/sparkring",
        "postgresql://u:pw@[::1]:5432/sparkring",
        "postgresql:///sparkring",  # the local socket
        "postgresql://u:pw@db/sparkring?sslmode=require&application_name=a%40b",
    ],
)
def test_database_urls_postgresql_takes(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    _clear_settings(monkeypatch)
    monkeypatch.setenv(KEY, url)
    loaded = settings_module.load(require=())
    assert loaded.database_url.get_secret_value() == url


@pytest.mark.parametrize(("url", "says", "secrets"), BAD_URLS)
def test_load_names_the_database_url(
    monkeypatch: pytest.MonkeyPatch, url: str, says: str, secrets: tuple[str, ...]
) -> None:
    _clear_settings(monkeypatch)
    monkeypatch.setenv(KEY, url)
    with pytest.raises(settings_module.SettingsError) as caught:
        settings_module.load(require=())
    message = str(caught.value)
    assert message.startswith(f"invalid settings: {KEY}: ") and says in message, message
    assert not any(secret in message for secret in secrets), message


def test_a_rendered_url_is_read_back_as_it_was() -> None:
    """A server hands each watchdog its URL rendered (server/launch.py): special
    characters come back percent-encoded, and the one-'@' rule still holds."""
    url = database.parse_url(
        "postgresql://us%40er:p%40ss%2Fx%3Fy@db:5432/d%40b?application_name=a%40b"
    )
    rendered = url.render_as_string(hide_password=False)
    assert rendered.count("@") == 1
    assert database.parse_url(rendered) == url
    assert url.password == "p@ss/x?y" and url.database == "d@b"


def _clear_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SPARKRING_"):
            monkeypatch.delenv(name)


# ------------------------------------------------------------------------ --version


def test_version_is_the_one_of_pyproject(tmp_path: Path) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    result = _run({}, "--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"sparkring {project['version']}\n", result.stdout


def test_the_server_reports_the_package_version() -> None:
    from importlib import metadata

    from server import process

    assert process.VERSION == metadata.version("sparkring")
