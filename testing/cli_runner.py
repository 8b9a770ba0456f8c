"""Run ``sparkring`` commands for the tests, each in a process of its own, without paying
the CLI's start-up each time.

A test process starts one *forking parent* (``python -m testing.cli_runner SOCKET``): it
imports the CLI and the libraries its commands load (about 0.8 CPU-second), then forks a
child per command. The child is a real process: it takes the command's environment,
working directory and stdin, writes to its own stdout and stderr, runs
``server.cli.main.main()`` (the entry point of ``python -m server``), runs the exit
handlers and ends with the command's exit code, so exit codes, one-line errors and
``--help`` text are what a user sees. What it skips is only the import of modules the
parent already holds. The suite ran about 520 commands at ~0.9 CPU-second of start-up
each (docs/history/benchmarks.md, "Where the CPU goes").

Tests of the start-up itself (``tests/integration/test_cli_startup.py``) and of long-running
commands
read while they run (``job logs --follow``) keep spawning ``python -m server``: there the
process is what is under test.

``start`` does the same for a long-running ``sparkring server run`` (``testing/cluster.py``
starts the tests' servers with it): the parent forks a *monitor*, the monitor forks the
server, in a session of its own, its stdout and stderr appended to a log file, and
reports the server's pid and, when it ends, its status. ``start`` returns a ``Detached``,
driven as the ``subprocess.Popen`` it stands in for (``pid``, ``poll``, ``wait``,
``send_signal``, ``kill``, ``returncode``: a negative signal number when a signal ended
it). The server skips about 0.9 CPU-second of imports; everything after them (settings
read from its environment, registration, threads, signal handlers, exit) is the real
one's. Its ``/proc/PID/cmdline`` and ``environ`` are the parent's, not
``python -m server server run ...``: what reads them (the watchdog's process-group
look-up) reads drivers, which are exec'd as ever.

The parent is single-threaded (fork is safe), holds no connection, and exits when the
test process that started it closes its stdin. ``run`` and ``start`` are safe to call
from several threads: each call has its own connection and child.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
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
    "scheduler.audit",
    "server.web.endpoint",
    "server.web.livelog",
    "resource_center.catalog",
    "resource_center.store",
    "registry.election",
    "registry.servers",
    "scheduler.alerts",
    "scheduler.coordinator",
    "scheduler.job_events",
    "scheduler.job_revisions",
    "scheduler.job_spec",
    "scheduler.job_views",
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
    # ``server run``: the process, its web endpoint and its signals.
    "server.process",
    "server.signals",
    "server.web.endpoint",
)
# What a running server imports on its way, when installed (the HTTP client's transport,
# the web server's protocols): loaded once too, and skipped where absent.
PRELOAD_IF_PRESENT = (
    "httpcore",
    "trio",
    "pydantic.v1",
    "wsproto",
    "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.wsproto_impl",
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
    request = _request(args, env, cwd, input=input)
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


def start(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    log: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
) -> Detached:
    """``subprocess.Popen([sys.executable, "-m", "server", *args], env=env, cwd=cwd,
    stdout=log, stderr=STDOUT, stdin=DEVNULL, start_new_session=True)`` with ``log``
    opened for appending, minus the start-up."""
    request = _request(args, env, cwd, log=str(log))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_ensure_parent())
        conn.sendall(json.dumps(request).encode() + b"\n")
        process = Detached([sys.executable, "-m", "server", *args], conn)
        process.read_pid(timeout=30)
    except BaseException:
        conn.close()
        raise
    return process


class Detached:
    """A process ``start`` forked, driven as a ``subprocess.Popen``. Its status comes
    from its monitor over ``conn``; signals go through a pidfd opened as soon as the pid
    is known, so one never reaches a later process that reused the pid."""

    def __init__(self, args: list[str], conn: socket.socket) -> None:
        self.args = args
        self.pid = 0
        self.returncode: int | None = None
        self._conn = conn
        self._buffer = b""
        self._pidfd: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Detached pid={self.pid} returncode={self.returncode} args={self.args!r}>"

    def read_pid(self, timeout: float) -> None:
        line = self._line(time.monotonic() + timeout)
        if line is None:
            raise RuntimeError(f"the forking parent did not start {' '.join(self.args)}")
        self.pid = json.loads(line)["pid"]
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # gone already; its status follows
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                self._read_status(time.monotonic())
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            with self._lock:  # in slices, so poll() from another thread is not held up
                slice_end = time.monotonic() + 0.2
                self._read_status(slice_end if deadline is None else min(slice_end, deadline))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return  # as Popen: a process known to have ended gets no signal
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_status(self, deadline: float) -> None:
        line = self._line(deadline)
        if line is None:
            return
        self.returncode = int(json.loads(line)["code"])
        self._conn.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _line(self, deadline: float) -> bytes | None:
        """The monitor's next line, or None at the deadline."""
        while b"\n" not in self._buffer:
            wait = max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], wait)[0]:
                return None
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError(f"the monitor of {' '.join(self.args)} ended without its status")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line


def _request(
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    *,
    input: str | None = None,
    log: str | None = None,
) -> dict[str, Any]:
    """What the parent is asked: a command (``log`` None: its output answered) or a
    long-running process (its output appended to ``log``)."""
    return {
        "args": list(args),
        "env": dict(env),
        "input": input,
        "cwd": str(cwd) if cwd is not None else os.getcwd(),
        "log": log,
    }


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
            [sys.executable, "-m", "testing.cli_runner", path],
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
    for name in PRELOAD_IF_PRESENT:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
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
        if request.get("log") is not None:
            _monitor(conn, request)
            return
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        code = _run_command(request, out.fileno(), err.fileno())
        answer = {"code": code, "stdout": _text(out), "stderr": _text(err)}
        conn.sendall(json.dumps(answer).encode() + b"\n")
    except BaseException:  # the answer is lost; the client sees an empty line
        traceback.print_exc()
    finally:
        os._exit(0)


def _monitor(conn: socket.socket, request: dict[str, Any]) -> None:
    """Fork the long-running process, report its pid, wait for it, report its status
    (``subprocess.Popen.returncode``'s convention: -N when signal N ended it)."""
    pid = os.fork()
    if pid == 0:
        conn.close()
        _detached(request)  # never returns
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    except OSError:
        pass  # the test process is gone


def _detached(request: dict[str, Any]) -> None:
    code = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)  # the process holds its log as stdout and stderr only
        code = _run_command(request, 1, 2)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _run_command(request: dict[str, Any], out: int, err: int) -> int:
    """Run the command as ``python -m server`` would, its stdout and stderr on the file
    descriptors ``out`` and ``err``; its exit code."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["input"] is not None:
        stdin = tempfile.TemporaryFile()
        stdin.write(request["input"].encode())
        stdin.seek(0)
        os.dup2(stdin.fileno(), 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8",
        write_through=bool(request["env"].get("PYTHONUNBUFFERED")),
    )
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
        threading._shutdown()  # as the interpreter's exit: its non-daemon threads first
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


def one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """A command that failed with exit 1 and one line on stderr, no traceback, holding
    every fragment; that line."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


if __name__ == "__main__":
    serve(sys.argv[1])
