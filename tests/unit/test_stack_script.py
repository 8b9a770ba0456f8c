"""scripts/stack.py reads the ports an existing stack folder was created with (issue 29,
"The house and the harness"): a plain ``up``, ``env`` or ``status`` of a stack made
with SPARKRING_STACK_*_PORT set must not look for its services on the default ports.
No service is started here: each test has a stack folder of its own under tmp_path."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "stack.py"
CUSTOM = {"zk": 22181, "pg": 25432, "s3": 29000, "spark": 27077, "spark_ui": 28080}


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("stack_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "stack_script", module)
    spec.loader.exec_module(module)
    monkeypatch.setenv("SPARKRING_STACK_DIR", str(tmp_path / "stack"))
    for name in module.PORTS:
        monkeypatch.delenv(f"SPARKRING_STACK_{name.upper()}_PORT", raising=False)
    return module


def _created_with_custom_ports(stack: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``up`` records before it starts anything, with every port variable set."""
    with monkeypatch.context() as env:
        for name, number in CUSTOM.items():
            env.setenv(f"SPARKRING_STACK_{name.upper()}_PORT", str(number))
        stack.record_ports()


def test_a_stack_made_with_custom_ports_keeps_them_without_the_variables(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _created_with_custom_ports(stack, monkeypatch)
    assert {name: stack.port(name) for name in CUSTOM} == CUSTOM
    assert stack.main(["env"]) == 0
    exports = capsys.readouterr().out
    assert "127.0.0.1:25432/" in exports and "spark://127.0.0.1:27077" in exports, exports
    assert "12181" not in exports and "15432" not in exports, exports


def test_a_stack_from_before_the_ports_file_reads_them_from_its_env_json(
    stack: ModuleType,
) -> None:
    root = stack.stack_dir()
    root.mkdir(parents=True)
    (root / "zk").mkdir()
    (root / "zk" / "nodes").write_text("3")
    (root / "env.json").write_text(
        json.dumps(
            {
                "SPARKRING_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:25432/sparkring",
                "SPARKRING_ZK_HOSTS": "127.0.0.1:22181,127.0.0.1:22182,127.0.0.1:22183",
                "SPARKRING_S3_ENDPOINT": "127.0.0.1:29000",
                "SPARKRING_STACK_SPARK_MASTER_URL": "spark://127.0.0.1:27077",
                "SPARKRING_STACK_SPARK_UI_URL": "http://127.0.0.1:28080",
            }
        )
    )
    assert {name: stack.port(name) for name in CUSTOM} == CUSTOM
    assert stack.zk_hosts() == "127.0.0.1:22181,127.0.0.1:22182,127.0.0.1:22183"


def test_status_looks_at_the_recorded_ports(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        pg = listener.getsockname()[1]
        with monkeypatch.context() as env:
            env.setenv("SPARKRING_STACK_PG_PORT", str(pg))
            stack.record_ports()
        assert stack.status()["postgresql"] is True


def test_up_refuses_a_port_variable_that_contradicts_the_stack(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    _created_with_custom_ports(stack, monkeypatch)
    monkeypatch.setenv("SPARKRING_STACK_ZK_PORT", "12181")
    with pytest.raises(stack.StackError, match="SPARKRING_STACK_ZK_PORT=22181") as refused:
        stack.check_ports()
    assert "12181" in str(refused.value) and str(stack.stack_dir()) in str(refused.value)
    monkeypatch.setenv("SPARKRING_STACK_ZK_PORT", "22181")
    stack.check_ports()  # the same port again is no contradiction


def test_env_and_status_say_when_a_port_variable_disagrees_with_the_stack(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new shell with another stack's variables: ``env`` and ``status`` still speak of
    this stack's ports, and say on stderr which variable they ignore (issue 27: they
    used to ignore it silently)."""
    _created_with_custom_ports(stack, monkeypatch)
    monkeypatch.setenv("SPARKRING_STACK_ZK_PORT", "12181")
    stack.main(["env"])
    out, err = capsys.readouterr()
    assert f"127.0.0.1:{CUSTOM['zk']}" in out and "12181" not in out
    assert "SPARKRING_STACK_ZK_PORT=12181" in err and "ignored" in err
    stack.main(["status", "--json"])
    assert "SPARKRING_STACK_ZK_PORT=12181" in capsys.readouterr().err


def test_a_fresh_stack_takes_the_variables_then_the_defaults(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKRING_STACK_S3_PORT", "29000")
    stack.check_ports()
    stack.record_ports()
    recorded = json.loads((stack.stack_dir() / "ports.json").read_text())
    assert recorded == {**stack.PORTS, "s3": 29000}


# --- standby Spark masters (issue 29, "Standby masters") ---------------------------


def _java_options(env: dict[str, str]) -> dict[str, str]:
    options = env.get("SPARK_DAEMON_JAVA_OPTS", "").split()
    return dict(o.removeprefix("-D").split("=", 1) for o in options if o.startswith("-D"))


def test_one_spark_master_by_default_without_recovery(stack: ModuleType) -> None:
    assert stack.spark_masters_configured() == 1
    assert stack.spark_master_url() == "spark://127.0.0.1:17077"
    argv = stack.spark_master_argv(1, "spark-class")
    assert argv[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    assert argv[argv.index("--port") + 1] == "17077"
    assert argv[argv.index("--webui-port") + 1] == "18080"
    # An application that sets no spark.cores.max gets one core, as in compose.
    assert _java_options(stack.spark_master_env(1, {"SPARK_HOME": "/spark"})) == {
        "spark.deploy.defaultCores": "1"
    }


def test_two_spark_masters_stand_by_through_the_stack_zookeeper(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    _created_with_custom_ports(stack, monkeypatch)
    stack.zk_write_config(3)
    stack.spark_write_config(2)
    assert stack.spark_masters_configured() == 2
    # Each master its own RPC and UI port; the worker's UI keeps spark_ui + 1.
    assert [stack.spark_master_ports(i) for i in (1, 2)] == [(27077, 28080), (27078, 28082)]
    assert stack.spark_master_url() == "spark://127.0.0.1:27077,127.0.0.1:27078"
    for i in (1, 2):
        argv = stack.spark_master_argv(i, "spark-class")
        assert argv[argv.index("--port") + 1] == str(27076 + i)
        env = stack.spark_master_env(2, {"SPARK_HOME": "/spark"})
        assert env["SPARK_HOME"] == "/spark"
        assert _java_options(env) == {
            "spark.deploy.defaultCores": "1",
            "spark.deploy.recoveryMode": "ZOOKEEPER",
            "spark.deploy.zookeeper.url": "127.0.0.1:22181,127.0.0.1:22182,127.0.0.1:22183",
            "spark.deploy.zookeeper.dir": "/spark-ha",
        }
    worker = stack.spark_worker_argv("spark-class")
    assert worker[2] == "spark://127.0.0.1:27077,127.0.0.1:27078"
    assert worker[worker.index("--webui-port") + 1] == "28081"
    assert stack.settings_env()["SPARKRING_STACK_SPARK_MASTER_URL"] == stack.spark_master_url()


def test_up_takes_spark_masters_1_or_2(
    stack: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        stack.main(["up", "--help"])
    assert "--spark-masters {1,2}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        stack.main(["up", "--spark-masters", "3"])
    assert "invalid choice: 3" in capsys.readouterr().err


def test_a_master_ui_that_answers_without_json_yet_is_not_yet_up(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A master whose UI answers before its JSON is ready (an empty body) is waited for,
    not a crash of ``spark start`` (CI, 2026-11-27: JSONDecodeError out of wait_for)."""
    import http.server
    import threading

    bodies = [b"", b'{"workers": [{"state": "ALIVE"}]}']

    class Master(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.pop(0) if len(bodies) > 1 else bodies[0]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Master)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("SPARKRING_STACK_SPARK_UI_PORT", str(server.server_address[1]))
        assert stack._spark_workers_alive() is False
        assert stack._spark_workers_alive() is True
    finally:
        server.shutdown()
        server.server_close()


def test_up_only_starts_the_services_it_names_in_their_order(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``up --only zookeeper,postgresql`` (what scripts/test.sh runs while pip installs,
    before the venv holds the S3 server and Spark) starts those two and nothing else; a
    plain ``up`` afterwards starts the rest."""
    started: list[str] = []
    monkeypatch.setattr(stack, "zk_up", lambda nodes: started.append("zookeeper"))
    monkeypatch.setattr(stack, "pg_up", lambda standby: started.append("postgresql"))
    monkeypatch.setattr(stack, "s3_start", lambda: started.append("s3"))
    monkeypatch.setattr(stack, "spark_up", lambda masters: started.append("spark"))
    assert stack.main(["up", "--only", "postgresql,zookeeper"]) == 0
    assert started == ["zookeeper", "postgresql"]
    started.clear()
    assert stack.main(["up", "--only", "s3,spark", "--no-spark"]) == 0
    assert started == ["s3"]
    started.clear()
    assert stack.main(["up"]) == 0
    assert started == ["zookeeper", "postgresql", "s3", "spark"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        stack.main(["up", "--only", "zookeeper,kafka"])
    assert "unknown service kafka" in capsys.readouterr().err


# --- a PostgreSQL standby (issue 46, "PostgreSQL fails over too") -------------------


def test_the_standby_port_follows_the_primary_unless_its_variable_says(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    _created_with_custom_ports(stack, monkeypatch)
    assert stack.port("pg_standby") == CUSTOM["pg"] + 1
    assert json.loads((stack.stack_dir() / "ports.json").read_text())["pg_standby"] == 25433
    # Recorded: the variable of another shell does not move it any more.
    monkeypatch.setenv("SPARKRING_STACK_PG_STANDBY_PORT", "25999")
    assert stack.port("pg_standby") == 25433
    with pytest.raises(stack.StackError, match="SPARKRING_STACK_PG_STANDBY_PORT=25433"):
        stack.check_ports()


def test_a_fresh_stack_takes_the_standby_port_variable(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKRING_STACK_PG_PORT", "25432")
    monkeypatch.setenv("SPARKRING_STACK_PG_STANDBY_PORT", "26432")
    stack.record_ports()
    recorded = json.loads((stack.stack_dir() / "ports.json").read_text())
    assert (recorded["pg"], recorded["pg_standby"]) == (25432, 26432)


def test_with_a_standby_the_database_url_names_both_nodes_for_writes(
    stack: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    _created_with_custom_ports(stack, monkeypatch)
    single = "postgresql+psycopg://postgres@127.0.0.1:25432/sparkring"
    assert stack.settings_env()["SPARKRING_DATABASE_URL"] == single
    stack._write_pg_state(standby=True)
    assert stack.settings_env()["SPARKRING_DATABASE_URL"] == (
        "postgresql+psycopg://postgres@127.0.0.1:25432,127.0.0.1:25433/sparkring"
        "?target_session_attrs=read-write"
    )
    # After a promotion the URL stays the same: libpq finds whichever node takes writes.
    stack._write_pg_state(primary="pg_standby")
    assert "127.0.0.1:25432,127.0.0.1:25433/" in stack.settings_env()["SPARKRING_DATABASE_URL"]
    assert (stack.pg_primary(), stack.pg_standby()) == ("pg_standby", "pg")


def test_promote_without_a_standby_is_one_clear_line(
    stack: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack.main(["pg", "promote"]) == 1
    assert capsys.readouterr().err == (
        "stack: this stack has no PostgreSQL standby: run `stack.py up --pg-standby`\n"
    )
