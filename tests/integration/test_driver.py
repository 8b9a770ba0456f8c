"""Driver building (argv, environment, lease file: pure and fast) and, marked ``spark``,
real spark-submit runs of the sample jobs under the watchdog."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server import driver, rundir, watchdog
from testing import sink, waiting

JOBS = Path(__file__).resolve().parents[2] / "examples" / "jobs"
SPARK_SUBMIT = Path("/opt/spark/bin/spark-submit")


def make_spec(**changes: Any) -> driver.DriverSpec:
    values: dict[str, Any] = {
        "job": "etl",
        "kind": "streaming",
        "epoch": 3,
        "attempt": 1,
        "server": "server-a",
        "main": Path("/cache/etl.py"),
        "py_files": [Path("/cache/lib.zip"), Path("/cache/util.py")],
        "conf": {"spark.sql.shuffle.partitions": "2", "spark.executor.memory": "1g"},
        "args": ["--input", "x"],
        "master": "local[1]",
        "checkpoint_dir": Path("/ckpt/etl"),
        "run_dir": Path("/work/runs/etl/3"),
        "spark_submit": SPARK_SUBMIT,
        "python": "/usr/bin/python3",
    }
    values.update(changes)
    return driver.DriverSpec(**values)


# --- argv ---------------------------------------------------------------------------------


def test_argv_is_options_then_main_then_args() -> None:
    assert driver.build_argv(make_spec()) == [
        str(SPARK_SUBMIT),
        "--master",
        "local[1]",
        "--name",
        "sparkring-etl",
        "--deploy-mode",
        "client",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.executor.memory=1g",
        "--py-files",
        "/cache/lib.zip,/cache/util.py",
        "/cache/etl.py",
        "--input",
        "x",
    ]


def test_argv_without_py_files_or_conf_has_no_empty_options() -> None:
    argv = driver.build_argv(make_spec(py_files=[], conf={}, args=[]))
    assert "--py-files" not in argv and "--conf" not in argv
    assert argv[-1] == "/cache/etl.py"


def test_arguments_travel_verbatim_never_through_a_shell() -> None:
    hostile = ["; rm -rf /", "$(id)", "a b", "--master", "'\"", ""]
    argv = driver.build_argv(make_spec(args=hostile))
    assert argv[-len(hostile) :] == hostile
    assert argv[1:3] == ["--master", "local[1]"]  # an argument cannot replace an option


def test_sparkring_conf_keys_never_reach_spark() -> None:
    argv = driver.build_argv(make_spec(conf={"sparkring.note": "x", "spark.a": "b=c"}))
    assert "spark.a=b=c" in argv  # '=' in a value is fine
    assert not any(arg.startswith("sparkring.") for arg in argv)


def test_a_jar_main_needs_its_class() -> None:
    with pytest.raises(driver.DriverError, match=r"job etl: .*sparkring\.main\.class"):
        driver.build_argv(make_spec(main=Path("/cache/app.jar"), py_files=[]))


def test_a_jar_main_gets_class_before_the_jar() -> None:
    spec = make_spec(
        main=Path("/cache/app.jar"), py_files=[], conf={"sparkring.main.class": "com.x.Main"}
    )
    argv = driver.build_argv(spec)
    assert argv[-5:] == ["--class", "com.x.Main", "/cache/app.jar", "--input", "x"]


def test_py_files_with_a_jar_main_are_refused() -> None:
    spec = make_spec(main=Path("/cache/app.jar"), conf={"sparkring.main.class": "com.x.Main"})
    with pytest.raises(driver.DriverError, match="--py-files apply to Python mains"):
        driver.build_argv(spec)


def test_a_zip_main_runs_through_a_launcher_and_ships_the_zip_first() -> None:
    argv = driver.build_argv(make_spec(main=Path("/cache/app.zip")))
    assert argv[argv.index("--py-files") + 1] == "/cache/app.zip,/cache/lib.zip,/cache/util.py"
    assert argv[-3] == f"/work/runs/etl/3/{driver.ZIP_LAUNCHER_FILE}"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"main": Path("/cache/etl.sh")}, "must be a .py, .zip, .egg or .jar"),
        ({"kind": "cron"}, "unknown kind 'cron'"),
        ({"checkpoint_dir": None}, "streaming job needs a checkpoint directory"),
        ({"main": Path("etl.py")}, "must be an absolute path"),
        ({"conf": {"bad key": "1"}}, "invalid Spark conf key"),
        ({"conf": {"a=b": "1"}}, "invalid Spark conf key"),
        ({"conf": {"spark.x": "1\n2"}}, "newline"),
        ({"job": ""}, "empty job name"),
    ],
)
def test_bad_specs_fail_with_a_clear_message(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(driver.DriverError, match=message):
        driver.build_argv(make_spec(**changes))


def test_a_batch_job_needs_no_checkpoint() -> None:
    assert driver.build_argv(make_spec(kind="batch", checkpoint_dir=None))


conf_keys = st.from_regex(r"spark\.[a-z]{1,8}(\.[a-zA-Z0-9]{1,8}){0,2}", fullmatch=True)
no_nul = st.text(st.characters(blacklist_characters="\x00\n"), max_size=20)


@given(
    conf=st.dictionaries(conf_keys, no_nul, max_size=5),
    args=st.lists(st.text(st.characters(blacklist_characters="\x00"), max_size=20), max_size=6),
    py_files=st.lists(st.from_regex(r"/c/[a-z]{1,6}\.(py|zip)", fullmatch=True), max_size=3),
)
def test_argv_property_everything_once_in_order(
    conf: dict[str, str], args: list[str], py_files: list[str]
) -> None:
    spec = make_spec(conf=conf, args=args, py_files=[Path(p) for p in py_files])
    argv = driver.build_argv(spec)
    main_at = len(argv) - len(args) - 1
    assert argv[main_at] == "/cache/etl.py" and argv[main_at + 1 :] == args
    options = argv[1:main_at]
    confs = [options[i + 1] for i, arg in enumerate(options) if arg == "--conf"]
    assert confs == [f"{k}={v}" for k, v in conf.items()]
    if py_files:
        assert options[options.index("--py-files") + 1].split(",") == py_files
    assert options[options.index("--name") + 1] == "sparkring-etl"


# --- environment --------------------------------------------------------------------------

SECRETS = {
    "SPARKRING_DATABASE_URL": "postgresql://u:pw@db/sparkring",
    "SPARKRING_S3_SECRET_KEY": "s3-secret",
    "SPARKRING_S3_ACCESS_KEY": "s3-access",
    "SPARKRING_ZK_AUTH": "user:pw",
    "SPARKRING_CHECKPOINT_DIR": "/inherited/from/elsewhere",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "PGPASSWORD": "pg",
    "GITHUB_TOKEN": "gh",
}
BASE = {"PATH": "/usr/bin:/bin", "HOME": "/root", "JAVA_HOME": "/usr/lib/jvm/java", **SECRETS}


def test_env_sets_the_job_variables() -> None:
    env = driver.build_env(make_spec(), BASE)
    assert env["SPARKRING_JOB"] == "etl"
    assert env["SPARKRING_EPOCH"] == "3"
    assert env["SPARKRING_SERVER"] == "server-a"
    assert env["SPARKRING_ATTEMPT"] == "1"
    assert env["SPARKRING_CHECKPOINT_DIR"] == "/ckpt/etl"
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == "/usr/bin/python3"
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert env["PATH"] == BASE["PATH"] and env["JAVA_HOME"] == BASE["JAVA_HOME"]


def test_env_drops_every_secret() -> None:
    env = driver.build_env(make_spec(), BASE)
    for name in (
        "SPARKRING_DATABASE_URL",
        "SPARKRING_S3_SECRET_KEY",
        "SPARKRING_S3_ACCESS_KEY",
        "SPARKRING_ZK_AUTH",
        "AWS_SECRET_ACCESS_KEY",
        "PGPASSWORD",
        "GITHUB_TOKEN",
    ):
        assert name not in env
    for secret in ("pw", "s3-secret", "s3-access", "aws", "pg", "gh"):
        assert not any(secret in value.split(":") or value == secret for value in env.values())


def test_env_names_the_run_and_a_scheduled_runs_fire_time() -> None:
    env = driver.build_env(make_spec(), {**BASE, "SPARKRING_SCHEDULED_TIME": "inherited"})
    assert env["SPARKRING_RUN_ID"] == "etl-e3"
    assert "SPARKRING_SCHEDULED_TIME" not in env
    spec = make_spec(
        kind="batch", checkpoint_dir=None, run_id="42", scheduled_time="2026-11-25T20:00:05Z"
    )
    env = driver.build_env(spec, BASE)
    assert env["SPARKRING_RUN_ID"] == "42"
    assert env["SPARKRING_SCHEDULED_TIME"] == "2026-11-25T20:00:05Z"


def test_batch_env_has_no_checkpoint_even_if_inherited() -> None:
    env = driver.build_env(make_spec(kind="batch", checkpoint_dir=None), BASE)
    assert "SPARKRING_CHECKPOINT_DIR" not in env


def test_env_keeps_an_explicit_spark_local_ip_and_extra_env_cannot_forge_identity() -> None:
    spec = make_spec(extra_env={"SPARKRING_JOB": "other", "MY_OPTION": "1"})
    env = driver.build_env(spec, {**BASE, "SPARK_LOCAL_IP": "10.0.0.5"})
    assert env["SPARK_LOCAL_IP"] == "10.0.0.5"
    assert env["MY_OPTION"] == "1"
    assert env["SPARKRING_JOB"] == "etl"


# --- lease file and launch preconditions ---------------------------------------------------


def test_confirm_lease_replaces_the_file_atomically(tmp_path: Path) -> None:
    lease_file = tmp_path / "lease.json"
    rundir.write_lease(lease_file, 123.5)
    rundir.write_lease(lease_file, 124.25)
    assert rundir.read_lease(lease_file) == 124.25
    assert [p.name for p in tmp_path.iterdir()] == ["lease.json"]  # no temporary left


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_confirm_lease_refuses_a_non_finite_deadline(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        rundir.write_lease(tmp_path / "lease.json", bad)


def test_an_unreadable_lease_file_reads_as_none(tmp_path: Path) -> None:
    lease_file = tmp_path / "lease.json"
    for text in ("", "{", '{"deadline": "soon"}', '{"deadline": true}', "[1]"):
        lease_file.write_text(text)
        assert rundir.read_lease(lease_file) is None
    assert rundir.read_lease(tmp_path / "missing.json") is None


def test_default_spark_submit_is_the_wheel_s() -> None:
    path = driver.default_spark_submit()
    assert path.name == "spark-submit" and path.is_file()
    assert path.parent.parent.name == "pyspark"


def test_launch_refuses_a_missing_artifact(tmp_path: Path) -> None:
    spec = make_spec(
        main=tmp_path / "gone.py",
        py_files=[],
        run_dir=tmp_path / "run",
        spark_submit=Path(sys.executable),
    )
    with pytest.raises(driver.DriverError, match=r"gone\.py is missing"):
        driver.launch(spec, watchdog.lease_clock() + 10)
    assert not (tmp_path / "run").exists()  # nothing started


# --- real spark-submit ----------------------------------------------------------------------


def spark_spec(tmp_path: Path, **changes: Any) -> driver.DriverSpec:
    values: dict[str, Any] = {
        "job": "sample",
        "kind": "batch",
        "epoch": 5,
        "attempt": 2,
        "server": "server-b",
        "master": "local[1]",
        "run_dir": tmp_path / "run",
        # Keep the JVM lean on a 2-core machine.
        "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"},
        "python": sys.executable,
    }
    values.update(changes)
    return driver.DriverSpec(**values)


@pytest.mark.spark
def test_batch_sum_runs_to_exit_0_with_the_job_variables(tmp_path: Path) -> None:
    output = tmp_path / "sum.json"
    spec = spark_spec(tmp_path, main=JOBS / "batch_sum.py", args=[str(output), "--n", "1000"])
    handle = driver.launch(spec, watchdog.lease_clock() + 120, base_env={**os.environ, **SECRETS})
    outcome = handle.wait(120)
    assert outcome is not None, "batch_sum did not finish in 120 s"
    assert outcome.reason == driver.Reason.EXITED and outcome.exit_code == 0, (
        handle.log_file.read_text()[-3000:]
    )
    result = json.loads(output.read_text())
    assert result["sum"] == 999 * 1000 // 2
    assert result["env"] == {
        "SPARKRING_JOB": "sample",
        "SPARKRING_EPOCH": "5",
        "SPARKRING_SERVER": "server-b",
        "SPARKRING_ATTEMPT": "2",
        "SPARKRING_CHECKPOINT_DIR": None,
    }
    # The server's secrets did not reach the driver.
    assert result["sparkring_names"] == [
        "SPARKRING_ATTEMPT",
        "SPARKRING_EPOCH",
        "SPARKRING_JOB",
        "SPARKRING_RUN_DIR",  # the run's mark: every process of the run carries it
        "SPARKRING_RUN_ID",
        "SPARKRING_SERVER",
    ]
    assert not set(SECRETS) & set(result["secret_names"])
    assert "batch_sum: sum of range(1000) = 499500" in handle.log_file.read_text()


@pytest.mark.spark
@pytest.mark.long(30)
def test_streaming_counter_resumes_exactly_once_after_sigkill(tmp_path: Path) -> None:
    output, heartbeats = tmp_path / "out", tmp_path / "heartbeats.jsonl"
    records = tmp_path / "records.jsonl"
    base = spark_spec(
        tmp_path,
        kind="streaming",
        main=JOBS / "streaming_counter.py",
        args=[str(output), "--heartbeats", str(heartbeats), "--rows-per-second", "20"],
        checkpoint_dir=tmp_path / "checkpoint",
    )

    first = driver.launch(
        dataclasses.replace(base, epoch=1, run_dir=tmp_path / "run1"),
        watchdog.lease_clock() + 120,
        records=records,
    )
    try:
        waiting.wait_until(lambda: sink.committed_batches(output) >= 3, 90, interval=0.2)
    finally:
        first.kill()  # SIGKILL mid-stream: no chance to finish the batch in flight
    before = sink.committed_values(output)
    assert before, "the first run committed nothing"

    second = driver.launch(
        dataclasses.replace(base, epoch=2, run_dir=tmp_path / "run2"),
        watchdog.lease_clock() + 120,
        records=records,
    )
    try:
        batches = sink.committed_batches(output)
        waiting.wait_until(lambda: sink.committed_batches(output) >= batches + 3, 90, interval=0.2)
    finally:
        outcome = second.stop(grace=20)
    assert outcome.reason == driver.Reason.STOPPED
    assert outcome.exit_code == 0, second.log_file.read_text()[-3000:]
    assert "streaming_counter: stopped on SIGTERM" in second.log_file.read_text()

    values = sink.committed_values(output)
    assert len(values) == len(set(values)), "a value was written twice"
    assert sorted(values) == list(range(max(values) + 1)), "a value is missing"
    assert max(values) > max(before), "the second run added nothing"

    # The two drivers never overlapped: heartbeats of epoch 1 all precede those of 2,
    # and so do the watchdog's lifetime records.
    beats = [json.loads(line) for line in heartbeats.read_text().splitlines()]
    first_beats = [b["t"] for b in beats if b["epoch"] == "1"]
    second_beats = [b["t"] for b in beats if b["epoch"] == "2"]
    assert first_beats and second_beats and max(first_beats) < min(second_beats)
    lifetimes = [json.loads(line) for line in records.read_text().splitlines()]
    ended_1 = next(r["t"] for r in lifetimes if r["epoch"] == 1 and r["event"] == "ended")
    started_2 = next(r["t"] for r in lifetimes if r["epoch"] == 2 and r["event"] == "started")
    assert max(first_beats) <= ended_1 <= started_2 <= min(second_beats)


def test_pinned_artifacts_keep_their_names_and_outlive_the_cache_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    main = cache / ("a" * 64 + ".py")
    lib = cache / ("b" * 64 + ".zip")
    other = cache / ("c" * 64 + ".zip")
    for path, content in ((main, b"print(1)\n"), (lib, b"zip-1"), (other, b"zip-2")):
        path.write_bytes(content)
    pinned = driver.pin_artifacts(
        tmp_path / "run", [(main, "etl.py"), (lib, "lib.zip"), (other, "lib.zip")]
    )
    assert [p.name for p in pinned] == ["etl.py", "lib.zip", "2-lib.zip"]
    for path in (main, lib, other):
        path.unlink()  # the cache evicts its entries while the run goes on
    assert [p.read_bytes() for p in pinned] == [b"print(1)\n", b"zip-1", b"zip-2"]
