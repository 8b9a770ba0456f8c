"""Run ``sparkring`` commands for the tests, each in a process of its own, without paying
the CLI's start-up each time.

A test process starts one *forking parent* (``python -m tests.cli_runner SOCKET``): it
imports the CLI and the libraries its commands load (about 0.8 CPU-second), then forks a
child per command. The child is a real process: it takes the command's environment,
working directory and stdin, writes to its own stdout and stderr, runs
``server.cli.main.main()`` (the entry point of ``python -m server``), runs the exit
handlers and ends with the command's exit code, so exit codes, one-line errors and
``--help`` text are what a user sees. What it skips is only the import of modules the
parent already holds. The suite ran about 520 commands at ~0.9 CPU-second of start-up
each (docs/benchmarks.md, "Where the CPU goes").

Tests of the start-up itself (``tests/test_cli_startup.py``), of long-running commands
read while they run (``job logs --follow``) and of ``server run`` keep spawning
``python -m server``: there the process is what is under test.

The parent is single-threaded (fork is safe), holds no connection, and exits when the
test process that started it closes its stdin. ``run`` is safe to call from several
threads: each call has its own connection and child.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PROGRAM = "sparkring"
# What ``python -m server`` shows as argv[0] (click names the program from it).
MAIN_PATH = str(REPO / "server" / "__main__.py")
# Modules the commands import inside their functions: loaded once, in the parent.
PRELOAD = (
    "server.cli.main",
    "server.clients",
    "server.tls",
    "server.logs",
    "server.log_shipping",
    "server.web.audit",
    "server.web.endpoint",
    "server.web.livelog",
    "resource_center.catalog",
    "resource_center.store",
    "registry.election",
    "registry.servers",
    "scheduler.alerts",
    "scheduler.coordinator",
    "scheduler.jobs",
    "scheduler.notify",
    "scheduler.placement",
    "scheduler.ring",
    "scheduler.runs",
    "scheduler.schedule",
    "sql.migrate",
    "rich.console",
    "rich.progress",
    "rich.table",
    "rich.text",
)


# ---------------------------------------------------------------------------- client

_lock = threading.Lock()
_parent: subprocess.Popen[bytes] | None = None
_socket_path: str | None = None


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    input: str | None = None,
    timeout: float = 120,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, "-m", "server", *args], env=env, input=input,
    capture_output=True, text=True, timeout=timeout, cwd=cwd)``, minus the start-up.
    Raises ``subprocess.TimeoutExpired`` (the child killed) as ``subprocess.run`` does."""
    argv = [sys.executable, "-m", "server", *args]
    request = {
        "args": list(args),
        "env": dict(env),
        "input": input,
        "cwd": str(cwd) if cwd is not None else os.getcwd(),
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(_ensure_parent())
        conn.sendall(json.dumps(request).encode() + b"\n")
        reader = conn.makefile("rb")
        pid: int | None = None
        try:
            pid = json.loads(reader.readline())["pid"]
            line = reader.readline()
        except TimeoutError:
            if pid is not None:
                _kill(pid)
            raise subprocess.TimeoutExpired(argv, timeout) from None
        finally:
            reader.close()
    if not line:
        raise RuntimeError(f"the CLI child for {' '.join(args)} ended without an answer")
    answer = json.loads(line)
    return subprocess.CompletedProcess(argv, answer["code"], answer["stdout"], answer["stderr"])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _ensure_parent() -> str:
    global _parent, _socket_path
    with _lock:
        if _parent is not None and _parent.poll() is None and _socket_path is not None:
            return _socket_path
        folder = tempfile.mkdtemp(prefix="sparkring-cli-")
        path = os.path.join(folder, "fork.sock")
        parent = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_runner", path],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert parent.stdout is not None
        ready = parent.stdout.readline()
        if ready != b"ready\n":
            parent.kill()
            raise RuntimeError(f"the CLI's forking parent did not start: {ready!r}")
        parent.stdout.close()
        _parent, _socket_path = parent, path
        atexit.register(_stop_parent, parent)
        return path


def _stop_parent(parent: subprocess.Popen[bytes]) -> None:
    if parent.stdin is not None:
        parent.stdin.close()  # the parent exits at EOF
    try:
        parent.wait(timeout=10)
    except subprocess.TimeoutExpired:
        parent.kill()
        parent.wait()


# ---------------------------------------------------------------------------- parent


def serve(path: str) -> None:
    """The forking parent: preload, listen on ``path``, fork a child per connection, and
    exit when stdin reaches EOF (the test process is gone)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # Children are reaped by the kernel; each child puts the default back for its own.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                if not os.read(sys.stdin.fileno(), 4096):
                    listener.close()
                    os.unlink(path)
                    return
                continue
            conn, _ = listener.accept()
            if os.fork() == 0:
                selector.close()
                listener.close()
                _child(conn)  # never returns
            conn.close()


def _child(conn: socket.socket) -> None:
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(os.open(os.devnull, os.O_RDONLY), sys.stdin.fileno())
        reader = conn.makefile("rb")
        request = json.loads(reader.readline())
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        code = _run_command(request, out, err)
        answer = {"code": code, "stdout": _text(out), "stderr": _text(err)}
        conn.sendall(json.dumps(answer).encode() + b"\n")
    except BaseException:  # the answer is lost; the client sees an empty line
        traceback.print_exc()
    finally:
        os._exit(0)


def _run_command(request: dict[str, Any], out: Any, err: Any) -> int:
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["input"] is not None:
        stdin = tempfile.TemporaryFile()
        stdin.write(request["input"].encode())
        stdin.seek(0)
        os.dup2(stdin.fileno(), 0)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.argv = [MAIN_PATH, *request["args"]]
    sys.modules["__main__"].__package__ = "server"  # click names the program from it
    try:
        from server.cli import main as cli_main

        cli_main.main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _text(file: Any) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="replace").replace("\r\n", "\n")


if __name__ == "__main__":
    serve(sys.argv[1])
