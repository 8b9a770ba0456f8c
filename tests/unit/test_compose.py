"""The deployment files: docker-compose.yml, .env.example, Dockerfile, .dockerignore.

No Docker engine runs here, but Debian's docker-compose (v1) validates and resolves a
compose file without one, so the checks run on what compose itself makes of the file.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from server import settings as settings_module
from server import spark_master
from testing import services

REPO = services.REPO
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOYMENT_DOC = REPO / "docs" / "deployment.md"
STANDINS_FILE = REPO / "scripts" / "compose-smoke" / "docker-compose.standins.yml"
PG_STANDBY_STANDINS_FILE = (
    REPO / "scripts" / "compose-smoke" / "docker-compose.pg-standby.standins.yml"
)
PG_STANDBY_FILE = REPO / "docker-compose.pg-standby.yml"
SMOKE_SCRIPT = REPO / "scripts" / "compose-smoke.sh"
# Services whose images are third-party: the only ones the stand-in override replaces.
THIRD_PARTY = {"zookeeper", "postgres", "minio", "minio-setup"}
# The standby pair: Spark's masters recover through ZooKeeper under a path of their own.
SPARK_MASTERS = ("spark-master-1", "spark-master-2")
SPARK_MASTER_URL = "spark://spark-master-1:7077,spark-master-2:7077"
SPARK_ZK_DIR = "/spark-ha"
# A healthcheck argument with any of these needs a shell (or podman 4.3 splits it).
NEEDS_SHELL = re.compile(r"""[\s$;|&<>`'"*?(){}\[\]~\\]""")

# Interpolations like ${NAME}, ${NAME:-default}, ${NAME:?message}; $$ escapes are not.
INTERPOLATION = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([-?])[^}]*)?\}")
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|ACCESS_KEY|CREDENTIAL|DATABASE_URL", re.I)
URL_WITH_PASSWORD = re.compile(r"://[^/@\s:]+:[^/@\s]+@")
SERVERS_NEED = {
    "zookeeper": "service_healthy",
    "postgres": "service_healthy",
    "minio": "service_healthy",
    "minio-setup": "service_completed_successfully",
    "spark-master-1": "service_healthy",
    "spark-master-2": "service_healthy",
    "migrate": "service_completed_successfully",
}


def _docker_compose() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        message = "docker-compose is not installed: run scripts/bootstrap.sh"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def _env_file_values(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def _compose(env_file: Path, *files: Path, args: tuple[str, ...] = ("config",)):
    # A clean environment: variables exported in the developer's shell (the local
    # stack's SPARKRING_* for instance) must not decide whether the file validates.
    argv = [_docker_compose(), "--project-directory", str(REPO), "--env-file", str(env_file)]
    for file in files or (COMPOSE_FILE,):
        argv += ["-f", str(file)]
    return subprocess.run(
        [*argv, *args],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _secrets_left_empty() -> list[str]:
    """The variables .env.example leaves empty for the operator to fill in: those whose
    comment above says they are secret (an empty build argument is no secret)."""
    names, comment = [], ""
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.lstrip().startswith("#"):
            comment += line.lower()
            continue
        name, _, value = line.partition("=")
        if name.strip() and not value.strip() and "secret" in comment:
            names.append(name.strip())
        comment = ""
    return names


def _filled_values() -> dict[str, str]:
    """.env.example with a value of the right shape for each secret it leaves empty,
    as an operator (or scripts/compose-smoke.sh) fills them in."""
    values = _env_file_values(ENV_EXAMPLE)
    shaped = {
        "ZK_AUTH": "test-user:test-password",
        # A Fernet key (SPARKRING_SECRET_KEYS): 32 bytes, url-safe base64.
        "SECRET_KEYS": base64.urlsafe_b64encode(b"k" * 32).decode(),
    }
    for name in _secrets_left_empty():
        values[name] = shaped.get(name, f"test-{name.lower()}")
    return values


def _write_env(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    return path


@pytest.fixture(scope="module")
def filled_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_env(tmp_path_factory.mktemp("env") / "filled.env", _filled_values())


def _resolved(env_file: Path, *files: Path) -> dict[str, Any]:
    result = _compose(env_file, *files)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def resolved(filled_env: Path) -> dict[str, Any]:
    """docker-compose.yml as compose resolves it with .env.example, its secrets filled in."""
    return _resolved(filled_env)


def shell_dependent(test: object) -> list[str]:
    """Why a resolved healthcheck ``test`` would need a shell; empty when it is exec form."""
    if not isinstance(test, list) or not test:
        return [f"not an exec-form list: {test!r}"]
    if test[0] != "CMD":
        return [f"starts with {test[0]!r}, not CMD"]
    if len(test) < 2:
        return ["no command"]
    return [
        f"argument {arg!r} needs a shell" for arg in test[1:] if not arg or NEEDS_SHELL.search(arg)
    ]


@pytest.mark.parametrize(
    "test",
    [
        ["CMD-SHELL", "pg_isready"],
        "pg_isready -U x",
        ["CMD", "python", "-c", "import urllib.request; urllib.request.urlopen('http://x/')"],
        ["CMD", "pg_isready", "-U", "$POSTGRES_USER"],
        ["CMD", "sh", "-c", "true || false"],
        ["CMD"],
        ["NONE"],
    ],
)
def test_shell_check_catches_shell_healthchecks(test: object) -> None:
    assert shell_dependent(test) != []


@pytest.mark.parametrize("override", [None, STANDINS_FILE], ids=["compose", "stand-ins"])
def test_every_healthcheck_is_exec_form_without_a_shell(
    override: Path | None, filled_env: Path
) -> None:
    """podman 4.3 splits healthcheck arguments with spaces; exec form works everywhere."""
    files = (COMPOSE_FILE,) if override is None else (COMPOSE_FILE, override)
    services_ = _resolved(filled_env, *files)["services"]
    checked = {name for name, s in services_.items() if "healthcheck" in s}
    assert checked == set(services_) - {"migrate", "minio-setup"}, "a service lost its check"
    for name in checked:
        assert shell_dependent(services_[name]["healthcheck"]["test"]) == [], name


def test_sparkring_healthchecks_use_the_image_s_own_probe(resolved: dict[str, Any]) -> None:
    for name in (*SPARK_MASTERS, "spark-worker", "server"):
        test = resolved["services"][name]["healthcheck"]["test"]
        assert test[1:4] == ["python", "-m", "server.cli.health"], name
        assert test[4].startswith("http://127.0.0.1:"), name


def test_standins_replace_only_third_party_images(
    resolved: dict[str, Any], filled_env: Path
) -> None:
    override = yaml.safe_load(STANDINS_FILE.read_text())["services"]
    assert set(override) == THIRD_PARTY
    # Only images: podman-compose 1.6 appends to overridden lists (a healthcheck test
    # became both commands), so the stand-ins run the compose file's own commands.
    assert all(set(service) == {"image"} for service in override.values())
    with_standins = _resolved(filled_env, COMPOSE_FILE, STANDINS_FILE)["services"]
    for name, service in with_standins.items():
        if name in THIRD_PARTY:
            assert service["image"].startswith("localhost/sparkring-standin/"), name
        else:
            assert service == resolved["services"][name], f"{name} changed by the stand-ins"


def test_smoke_script_runs_every_step() -> None:
    text = SMOKE_SCRIPT.read_text()
    steps = re.findall(r"^(?:  )?step ([a-z0-9-]+) ", text, re.M)
    assert steps == [
        "engine",
        "standin-images",
        "build-image",
        "infrastructure",
        "db-upgrade",
        "servers",
        "pyspark-job",
        "pi-batch",
        "data-team-job",
        "failover",
        "pg-failover",
        "pi-after",
        "scale-to-4",
        "teardown",
    ]
    assert "run --rm --no-deps migrate" in text
    # Both Spark masters come up and are waited for (compose starts no "spark-master").
    assert re.search(r"compose up -d [^\n]*spark-master-1 spark-master-2", text)
    assert all(f"wait_healthy {name} 1" in text for name in SPARK_MASTERS)
    assert "compose-smoke:" in (REPO / "Makefile").read_text()


def test_compose_file_validates_once_the_secrets_are_filled_in(filled_env: Path) -> None:
    result = _compose(filled_env, args=("config", "-q"))
    assert result.returncode == 0, result.stderr


def test_env_example_as_it_is_does_not_start_the_cluster() -> None:
    """No password of .env.example works as it is: each is empty, and compose refuses an
    empty one with a message naming it."""
    empty = _secrets_left_empty()
    assert {"POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD", "S3_SECRET_KEY", "ZK_AUTH"} <= set(empty)
    for name, value in _env_file_values(ENV_EXAMPLE).items():
        # An access key is an account's name (like a user name): its secret is the password.
        is_secret = SECRET_NAME.search(name) and not name.endswith("_ACCESS_KEY")
        if is_secret or name.endswith("_AUTH"):
            assert value == "", f".env.example gives {name} a value that would work as it is"
    result = _compose(ENV_EXAMPLE, args=("config", "-q"))
    assert result.returncode != 0, "compose accepted .env.example's empty passwords"
    assert any(f"set {name} in .env" in result.stderr for name in empty), result.stderr


def test_smoke_script_generates_every_secret_env_example_leaves_empty() -> None:
    text = SMOKE_SCRIPT.read_text()
    for name in _secrets_left_empty():
        made = r"\$\((?:fernet_)?secret\)"
        assert re.search(rf"^{name}=\S*{made}$", text, re.M), f"smoke sets no {name}"


def _required_variables() -> set[str]:
    text = COMPOSE_FILE.read_text()
    return {m.group(1) for m in INTERPOLATION.finditer(text) if m.group(2) == "?"}


def test_credentials_are_required_not_defaulted(tmp_path: Path) -> None:
    required = _required_variables()
    secrets = {"POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD", "S3_SECRET_KEY", "ZK_AUTH"}
    assert secrets <= required
    values = _filled_values()
    for name in sorted(required):
        for how, env in (
            ("missing", {k: v for k, v in values.items() if k != name}),
            ("empty", {**values, name: ""}),
        ):
            env_file = _write_env(tmp_path / f"{how}-{name}.env", env)
            result = _compose(env_file, args=("config", "-q"))
            assert result.returncode != 0, f"compose accepted a {how} {name}"
            assert f"set {name} in .env" in result.stderr, result.stderr
            if name in secrets:
                assert values[name] not in result.stderr


def _published(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each port compose resolved."""
    ports = []
    for port in service.get("ports", []):
        if isinstance(port, dict):  # long form: only a target, published on every address
            ports.append(("", str(port.get("published", "")), str(port["target"])))
        else:
            address, host_port, target = str(port).split("/")[0].rsplit(":", 2)
            ports.append((address, host_port, target))
    return ports


def test_published_ports_bind_to_loopback_unless_configured(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    """The MinIO console, the Spark UI and the servers' API/console are reachable from the
    host only, unless UI_BIND says otherwise."""
    published = {n: _published(s) for n, s in resolved["services"].items() if s.get("ports")}
    assert set(published) == {"minio", "spark-master-1", "spark-master-2", "server"}
    for name, ports in published.items():
        assert all(address == "127.0.0.1" for address, _, _ in ports), f"{name}: {ports}"
    env_file = _write_env(tmp_path / "bind.env", {**_filled_values(), "UI_BIND": "10.1.2.3"})
    rebound = _resolved(env_file)["services"]
    for name in published:
        assert all(address == "10.1.2.3" for address, _, _ in _published(rebound[name])), name


def test_env_example_documents_every_variable_compose_reads() -> None:
    used = {m.group(1) for m in INTERPOLATION.finditer(COMPOSE_FILE.read_text())}
    documented = set(_env_file_values(ENV_EXAMPLE))
    assert used - documented == set(), "read by docker-compose.yml but not in .env.example"
    assert documented - used == set(), "in .env.example but never read by docker-compose.yml"


def _sparkring_env(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    return {k: str(v) for k, v in environment.items() if k.startswith("SPARKRING_")}


def test_every_sparkring_variable_is_a_real_setting(resolved: dict[str, Any]) -> None:
    fields = settings_module.Settings.model_fields
    seen = set()
    for name, service in resolved["services"].items():
        for variable in _sparkring_env(service):
            field = variable.removeprefix(settings_module.ENV_PREFIX).lower()
            assert field in fields, f"{name}: {variable} is not a sparkring setting"
            seen.add(field)
    required = {name for name, field in fields.items() if field.is_required()}
    assert required <= seen


@pytest.mark.parametrize("service", ["server", "migrate"])
def test_sparkring_processes_get_valid_settings(resolved: dict[str, Any], service: str) -> None:
    environment = _sparkring_env(resolved["services"][service])
    values = {k.removeprefix("SPARKRING_").lower(): v for k, v in environment.items()}
    loaded = settings_module.Settings(**values)
    assert loaded.spark_master == SPARK_MASTER_URL
    assert loaded.database_url.get_secret_value().startswith("postgresql://")
    # The chroot carries digest ACLs: every process that touches it authenticates.
    assert loaded.zk_auth.get_secret_value() == "test-user:test-password"


def test_servers_wait_for_every_service_they_need(resolved: dict[str, Any]) -> None:
    services_ = resolved["services"]
    depends_on = services_["server"]["depends_on"]
    assert {name: d["condition"] for name, d in depends_on.items()} == SERVERS_NEED
    for name, condition in SERVERS_NEED.items():
        assert name in services_
        if condition == "service_healthy":
            assert services_[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        else:
            assert services_[name]["restart"] == "no", f"{name} is one-shot"
    assert services_["server"]["healthcheck"]["test"]


def test_migrate_is_one_shot_db_upgrade_after_postgres(resolved: dict[str, Any]) -> None:
    migrate = resolved["services"]["migrate"]
    assert migrate["command"] == ["sparkring", "db", "upgrade"]
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    # The same image as the servers: the schema head is the one the servers expect.
    assert migrate["image"] == resolved["services"]["server"]["image"]


def test_servers_scale_with_unique_ids(resolved: dict[str, Any]) -> None:
    server = resolved["services"]["server"]
    assert server["deploy"]["replicas"] == 3
    # podman-compose starts one replica unless the (default) mode is spelled out.
    for name, service in resolved["services"].items():
        if "replicas" in service.get("deploy", {}):
            assert service["deploy"].get("mode") == "replicated", name
    # Unset id -> the container's host name (its id), unique per replica; a fixed
    # id, host name, container name or host port would break `--scale`.
    assert "SPARKRING_SERVER_ID" not in server["environment"]
    assert "hostname" not in server and "container_name" not in server
    assert all(host_port == "" for _, host_port, _ in _published(server))
    assert settings_module.Settings.model_fields["server_id"].default_factory is socket.gethostname


def test_servers_run_under_the_supervisor_with_tini_as_pid_1(resolved: dict[str, Any]) -> None:
    """A crash of `server run` restarts it inside the container (its drivers are adopted);
    tini stays PID 1 to reap orphans. The other services keep their own commands."""
    services_ = resolved["services"]
    assert services_["server"]["command"] == ["sparkring", "server", "supervise"]
    assert services_["server"]["stop_signal"] == "SIGTERM"
    instructions = _instructions(DOCKERFILE.read_text())
    assert [args for keyword, args in instructions if keyword == "ENTRYPOINT"] == ['["tini", "--"]']
    assert [args for keyword, args in instructions if keyword == "CMD"] == [
        '["sparkring", "server", "supervise"]'
    ]
    for name in SPARK_MASTERS:
        assert services_[name]["command"][:2] == [
            "spark-class",
            "org.apache.spark.deploy.master.Master",
        ]
    assert services_["spark-worker"]["command"][:2] == [
        "spark-class",
        "org.apache.spark.deploy.worker.Worker",
    ]
    assert all("entrypoint" not in services_[name] for name in ("server", *SPARK_MASTERS))


def _java_options(text: str) -> dict[str, str]:
    """``-Dname=value`` options of a JVM options string, by name."""
    options = [option for option in text.split() if option.startswith("-D")]
    return dict(option.removeprefix("-D").split("=", 1) for option in options)


def spark_ha_problems(master: dict[str, Any], zk_hosts: str, zk_root: str) -> list[str]:
    """Why a resolved master service would not be a standby recovering through ZooKeeper."""
    options = _java_options(master.get("environment", {}).get("SPARK_DAEMON_JAVA_OPTS", ""))
    problems = []
    if options.get("spark.deploy.recoveryMode") != "ZOOKEEPER":
        problems.append("spark.deploy.recoveryMode is not ZOOKEEPER")
    if options.get("spark.deploy.zookeeper.url") != zk_hosts:
        problems.append(f"spark.deploy.zookeeper.url is not the servers' ensemble {zk_hosts}")
    directory = options.get("spark.deploy.zookeeper.dir", "")
    if directory != SPARK_ZK_DIR:
        problems.append(f"spark.deploy.zookeeper.dir {directory!r} is not {SPARK_ZK_DIR}")
    if directory == zk_root or directory.startswith(f"{zk_root}/"):
        problems.append("Spark's recovery state sits under sparkring's root")
    return problems


def test_spark_ha_check_catches_a_master_without_recovery() -> None:
    master = {"environment": {"SPARK_DAEMON_JAVA_OPTS": "-Dspark.deploy.zookeeper.dir=/sparkring"}}
    assert spark_ha_problems(master, "zookeeper:2181", "/sparkring") == [
        "spark.deploy.recoveryMode is not ZOOKEEPER",
        "spark.deploy.zookeeper.url is not the servers' ensemble zookeeper:2181",
        "spark.deploy.zookeeper.dir '/sparkring' is not /spark-ha",
        "Spark's recovery state sits under sparkring's root",
    ]


def test_two_spark_masters_recover_through_the_compose_zookeeper(
    resolved: dict[str, Any],
) -> None:
    """A standby master takes over when the active one dies (Spark's ZOOKEEPER recovery
    mode); workers register with both, drivers are given both."""
    services_ = resolved["services"]
    assert "spark-master" not in services_
    environment = services_["server"]["environment"]
    for name in SPARK_MASTERS:
        master = services_[name]
        assert master["hostname"] == name
        command = master["command"]
        assert command[command.index("--host") + 1] == name
        assert command[command.index("--port") + 1] == "7077"
        problems = spark_ha_problems(
            master, environment["SPARKRING_ZK_HOSTS"], environment["SPARKRING_ZK_ROOT"]
        )
        assert problems == [], name
        assert master["depends_on"]["zookeeper"]["condition"] == "service_healthy"
    masters = spark_master.endpoints(SPARK_MASTER_URL)
    assert [(e.host, e.port) for e in masters] == [(name, 7077) for name in SPARK_MASTERS]
    worker = services_["spark-worker"]
    assert worker["command"][-1] == SPARK_MASTER_URL
    assert {name: d["condition"] for name, d in worker["depends_on"].items()} == {
        name: "service_healthy" for name in SPARK_MASTERS
    }
    for name in ("server", "migrate"):
        assert services_[name]["environment"]["SPARKRING_SPARK_MASTER"] == SPARK_MASTER_URL


def test_health_check_probes_the_configured_port(resolved: dict[str, Any]) -> None:
    server = resolved["services"]["server"]
    port = server["environment"]["SPARKRING_HEALTH_PORT"]
    assert f"127.0.0.1:{port}/healthz" in " ".join(server["healthcheck"]["test"])
    assert [target for _, _, target in _published(server)] == [str(port)]


def test_checkpoints_live_on_a_volume_shared_by_servers_and_workers(
    resolved: dict[str, Any],
) -> None:
    services_ = resolved["services"]
    root = services_["server"]["environment"]["SPARKRING_CHECKPOINT_ROOT"]
    for name in ("server", "spark-worker"):
        mounts = [v.split(":")[:2] for v in services_[name]["volumes"]]
        assert ["checkpoints", root] in mounts, f"{name} does not mount checkpoints at {root}"
    assert "checkpoints" in resolved["volumes"]


def test_jobs_write_to_an_output_volume_of_the_drivers_user_on_servers_and_workers(
    resolved: dict[str, Any],
) -> None:
    """A driver (on a server) and its executors (on the workers) write one job's output:
    the same volume at the same path on both, and its folder in the image belongs to the
    drivers' user, whose owner a new volume takes (issue 43: the smoke's stream could
    not write its output and crash-looped into FAILED)."""
    services_ = resolved["services"]
    for name in ("server", "spark-worker"):
        mounts = [v.split(":")[:2] for v in services_[name]["volumes"]]
        assert ["output", "/var/lib/sparkring/output"] in mounts, name
    assert "output" in resolved["volumes"]
    runs = " ".join(
        args for keyword, args in _instructions(DOCKERFILE.read_text()) if keyword == "RUN"
    )
    assert re.search(
        r"chown sparkring-driver:sparkring-driver [^&]*/var/lib/sparkring/output", runs
    )
    assert "/var/lib/sparkring/output/" in SMOKE_SCRIPT.read_text()


def test_stateful_services_keep_data_on_named_volumes(resolved: dict[str, Any]) -> None:
    expected = {
        "postgres": "/var/lib/postgresql/data",
        "minio": "/data",
        "zookeeper": "/data",
    }
    for name, path in expected.items():
        named = {
            v.split(":")[1]: v.split(":")[0]
            for v in resolved["services"][name]["volumes"]
            if not v.startswith(("/", "."))
        }
        assert named.get(path) in resolved["volumes"], f"{name}:{path} is not a named volume"


def test_no_credential_is_written_into_the_compose_file() -> None:
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    environments = [raw.get("x-sparkring-env", {})]
    environments += [s.get("environment") or {} for s in raw["services"].values()]
    for environment in environments:
        for name, value in environment.items():
            if SECRET_NAME.search(name):
                assert "${" in str(value), f"{name} is a literal, not from .env"
                assert not URL_WITH_PASSWORD.search(str(INTERPOLATION.sub("", str(value))))


# --- docker-compose.pg-standby.yml --------------------------------------------------


def test_pg_standby_override_replicates_synchronously_to_a_standby_the_servers_know(
    resolved: dict[str, Any], filled_env: Path
) -> None:
    """The override adds a standby that streams from the compose PostgreSQL and that
    every commit waits for, gives the servers and the migration both nodes in one
    multi-host URL that lands on the one taking writes, and changes nothing else."""
    services_ = _resolved(filled_env, COMPOSE_FILE, PG_STANDBY_FILE)["services"]
    standby = services_["postgres-standby"]
    assert standby["image"] == resolved["services"]["postgres"]["image"]
    assert standby["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert shell_dependent(standby["healthcheck"]["test"]) == []
    script = standby["command"][0]
    assert "pg_basebackup" in script and "--write-recovery-conf" in script
    assert "application_name=postgres_standby" in script
    assert "ALTER SYSTEM SET synchronous_standby_names = 'postgres_standby'" in script
    assert [v.split(":")[:2] for v in standby["volumes"]] == [
        ["postgres-standby-data", "/var/lib/postgresql/data"]
    ]
    assert "host replication all all scram-sha-256" in services_["postgres"]["command"][0]
    values = _filled_values()
    url = (
        f"postgresql://{values['POSTGRES_USER']}:{values['POSTGRES_PASSWORD']}"
        f"@postgres:5432,postgres-standby:5432/{values['POSTGRES_DB']}"
        "?target_session_attrs=read-write"
    )
    for name in ("server", "migrate"):
        service, before = services_[name], resolved["services"][name]
        assert service["environment"]["SPARKRING_DATABASE_URL"] == url, name
        assert service["environment"] == {**before["environment"], "SPARKRING_DATABASE_URL": url}
        standby_dependency = {"postgres-standby": {"condition": "service_healthy"}}
        assert service["depends_on"] == {**before["depends_on"], **standby_dependency}, name
    changed = {"postgres", "postgres-standby", "server", "migrate"}
    for name, service in services_.items():
        if name not in changed:
            assert service == resolved["services"][name], f"{name} changed by the override"


def test_pg_standby_standins_replace_only_the_standby_s_image(filled_env: Path) -> None:
    """The smoke's COMPOSE_SMOKE_PG_STANDBY=1 with stand-ins runs the override's own
    commands: its stand-in override gives the standby the postgres stand-in, nothing more."""
    override = yaml.safe_load(PG_STANDBY_STANDINS_FILE.read_text())["services"]
    assert override == {"postgres-standby": {"image": "localhost/sparkring-standin/postgres:15"}}
    files = (COMPOSE_FILE, PG_STANDBY_FILE)
    plain = _resolved(filled_env, *files)["services"]
    standins = (STANDINS_FILE, PG_STANDBY_STANDINS_FILE)
    with_standins = _resolved(filled_env, *files, *standins)["services"]
    for name, service in with_standins.items():
        if name in THIRD_PARTY | {"postgres-standby"}:
            assert service["image"].startswith("localhost/sparkring-standin/"), name
            service = {**service, "image": plain[name]["image"]}
        assert service == plain[name], f"{name} changed by the stand-ins"


def test_pg_standby_override_reads_only_documented_variables_and_writes_no_credential() -> None:
    text = PG_STANDBY_FILE.read_text()
    used = {m.group(1) for m in INTERPOLATION.finditer(text)}
    assert used <= set(_env_file_values(ENV_EXAMPLE)), "read by the override, not documented"
    for service in yaml.safe_load(text)["services"].values():
        for name, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(name):
                assert "${" in str(value), f"{name} is a literal, not from .env"


# --- Dockerfile -------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: continuations joined, heredoc bodies skipped."""
    instructions: list[tuple[str, str]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines, "").strip()
        keyword, _, arguments = line.strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        heredoc = re.search(r"<<-?'?\"?([A-Za-z_]+)", arguments)
        if keyword.upper() == "RUN" and heredoc:
            terminator = heredoc.group(1)
            for body in lines:
                if body.strip() == terminator:
                    break
    return instructions


def secrets_in_dockerfile(text: str) -> list[str]:
    """ENV and ARG instructions whose name or value looks like a credential."""
    problems = []
    for keyword, arguments in _instructions(text):
        if keyword not in ("ENV", "ARG"):
            continue
        pairs = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)(?:[= ]\s*(\"[^\"]*\"|\S*))?", arguments)
        for name, value in pairs:
            if SECRET_NAME.search(name) or URL_WITH_PASSWORD.search(value):
                problems.append(f"{keyword} {name}")
    return problems


def test_dockerfile_has_no_secret_in_env_or_arg() -> None:
    text = DOCKERFILE.read_text()
    assert secrets_in_dockerfile(text) == []
    keywords = [keyword for keyword, _ in _instructions(text)]
    assert "FROM" in keywords and "ENV" in keywords and "ARG" in keywords


def test_dockerfile_builds_with_buildah_1_28() -> None:
    """podman 4.3's buildah expands no variable in a stage name and has no heredocs."""
    instructions = _instructions(DOCKERFILE.read_text())
    for keyword, arguments in instructions:
        if keyword == "FROM":
            image, *rest = arguments.split()
            # The base image may come from the global ARG (a stand-in where no
            # registry can be reached); nothing else in a FROM may be a variable.
            assert image == "${PYTHON_IMAGE}" or "$" not in image, arguments
            assert "$" not in " ".join(rest), arguments
        assert not (keyword == "RUN" and arguments.startswith("<<")), "heredoc RUN"
    copied = [args.split()[0] for keyword, args in instructions if keyword == "COPY"]
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"


@pytest.mark.parametrize(
    "line",
    [
        "ENV SPARKRING_S3_SECRET_KEY=abc",
        "ARG POSTGRES_PASSWORD",
        "ENV A=1 \\\n    SPARKRING_DATABASE_URL=postgresql://u:pw@db/sparkring",
        "ARG MIRROR=https://user:pw@mirror.example/maven2",
        "ENV GITHUB_TOKEN token-value",
    ],
)
def test_secret_check_catches_secret_like_values(line: str) -> None:
    assert secrets_in_dockerfile(f"FROM python:3.11-slim\n{line}\n") != []


def test_dockerfile_is_python_311_with_jre_17_running_unprivileged() -> None:
    instructions = _instructions(DOCKERFILE.read_text())
    arguments = {keyword: args for keyword, args in instructions}
    text = DOCKERFILE.read_text()
    assert "python:3.11-slim" in text and "openjdk-17-jre-headless" in text
    assert arguments["USER"] not in ("root", "0")
    assert "sparkring" in arguments["CMD"]


def test_dockerignore_admits_only_the_package_sources() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "the build context must be an allow-list"
    admitted = {line[1:] for line in lines if line.startswith("!")}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.split(".")[0] for p in pyproject["tool"]["setuptools"]["packages"]}
    expected = {"pyproject.toml", "constraints.txt", "README.md", "docker/s3a_jars.py"}
    assert admitted == packages | expected


# --- docs/deployment.md -----------------------------------------------------------


def test_zookeeper_ensemble_override_in_the_docs_validates(
    tmp_path: Path, filled_env: Path
) -> None:
    """The 3-node ensemble override shown in docs/deployment.md is a valid compose file."""
    blocks = re.findall(r"```yaml\n(# docker-compose\.zk-ensemble\.yml\n.*?)```", _doc(), re.S)
    assert len(blocks) == 1, "docs/deployment.md lost its ensemble override"
    override = tmp_path / "docker-compose.zk-ensemble.yml"
    override.write_text(blocks[0])
    resolved = _resolved(filled_env, COMPOSE_FILE, override)
    services_ = resolved["services"]
    nodes = ["zookeeper", "zookeeper-2", "zookeeper-3"]
    for number, node in enumerate(nodes, start=1):
        assert str(services_[node]["environment"]["ZOO_MY_ID"]) == str(number)
        assert services_[node]["healthcheck"]["test"]
        assert services_["server"]["depends_on"][node]["condition"] == "service_healthy"
    hosts = services_["server"]["environment"]["SPARKRING_ZK_HOSTS"]
    assert hosts == ",".join(f"{node}:2181" for node in nodes)
    # Spark's standby masters recover through the whole ensemble too.
    root = services_["server"]["environment"]["SPARKRING_ZK_ROOT"]
    for name in SPARK_MASTERS:
        assert spark_ha_problems(services_[name], hosts, root) == [], name
        for node in nodes:
            assert services_[name]["depends_on"][node]["condition"] == "service_healthy"


def _doc() -> str:
    return DEPLOYMENT_DOC.read_text()


def test_job_code_runs_as_the_driver_user_never_the_servers(resolved: dict[str, Any]) -> None:
    """Servers start their drivers as sparkring-driver (so they run as root in the
    container, to switch users); executors run as that user too; the image says so."""
    services_ = resolved["services"]
    server = services_["server"]
    assert server["environment"]["SPARKRING_DRIVER_USER"] == "sparkring-driver"
    assert server["user"] == "root"
    assert services_["spark-worker"]["user"] == "sparkring-driver"
    text = DOCKERFILE.read_text()
    assert "--uid 10002 --user-group" in text and "sparkring-driver" in text
    env = [args for keyword, args in _instructions(text) if keyword == "ENV"]
    assert "SPARKRING_DRIVER_USER=sparkring-driver" in env
