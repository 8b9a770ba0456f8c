"""The error a failed driver is remembered by: one line naming its cause.

A crash's ``last_error`` and its ``crashed``/``failed`` event carry
``driver exited with exit code N: <cause>`` (the prefix is what tells a driver's own
failure from an outage: ``testing/chaos/invariants.py``), where the cause is the driver's
first exception line (:func:`first_exception`), e.g.
``SparkException: Failed to connect to master 127.0.0.1:7077: Exception thrown in
awaitResult`` or ``ValueError: bad input``. The full trace stays in the driver log.
Never the watchdog's own lines (``sparkring-watchdog[pid] ... driver ended``).

Pure text handling; read from the start and the end of the log the watchdog writes
(``rundir.LOG_FILE``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# At most this many characters in a recorded error (one line).
MAX_CHARS = 300
# How much of the log is read: the start (the first exception of a driver that died
# early) and the end (of one that failed late), bytes.
HEAD_BYTES = 256 * 1024
TAIL_BYTES = 64 * 1024

# "26/11/25 11:02:20 WARN StandaloneAppClient$ClientEndpoint: Failed to connect to master"
_LOG4J = re.compile(
    r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (?P<level>[A-Z]+) (?P<logger>\S+): (?P<msg>.*)$"
)
# "org.apache.spark.SparkException: Exception thrown in awaitResult:" (qualified only:
# a bare word ending in Error is too often plain text), optionally after the JVM's
# 'Exception in thread "main" '.
_JAVA = re.compile(
    r'^(?:Exception in thread "[^"]*" )?'
    r"(?P<name>(?:[A-Za-z_$][\w$]*\.)+[A-Za-z_$][\w$]*(?:Exception|Error|Throwable))"
    r"(?::\s*(?P<msg>.*))?$"
)
# The last line of a Python traceback: "ValueError: boom", "KeyboardInterrupt".
_PYTHON = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?::\s*(?P<msg>.*))?$")
_TRACEBACK = "Traceback (most recent call last):"
_WATCHDOG = re.compile(r"sparkring-watchdog\[\d+\]")
_SPACE = re.compile(r"\s+")


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _line(name: str, message: str | None) -> str:
    message = (message or "").strip().rstrip(":").strip()
    return f"{_short(name)}: {message}" if message else _short(name)


def _python_exception(lines: list[str], start: int) -> str | None:
    """The exception that ends the traceback whose header is ``lines[start]``."""
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if not line or line[0].isspace():
            continue  # a frame or its source line
        match = _PYTHON.match(line)
        if match is None:
            return None
        name, message = match["name"], match["msg"]
        # py4j: the Java exception follows on the next line, after ": ".
        if _short(name) == "Py4JJavaError" and index + 1 < len(lines):
            java = _JAVA.match(lines[index + 1].removeprefix(": ").strip())
            if java is not None:
                return _line(java["name"], java["msg"])
        return _line(name, message)
    return None


def first_exception(text: str) -> str | None:
    """The first exception in a driver log, as ``ShortName: message``; None if none.

    A Java exception logged right after a WARN/ERROR line of Spark's (``Failed to
    connect to master ...``, then ``SparkException: Exception thrown in awaitResult``)
    takes that line's message first: it is the one that names the cause."""
    lines = [line.rstrip() for line in text.splitlines()]
    logged: str | None = None
    for index, line in enumerate(lines):
        if _WATCHDOG.search(line):
            continue
        if line.strip() == _TRACEBACK:
            found = _python_exception(lines, index)
            if found is not None:
                return found
            continue
        log4j = _LOG4J.match(line)
        if log4j is not None:
            logged = log4j["msg"] if log4j["level"] in ("WARN", "ERROR", "FATAL") else None
            continue
        java = _JAVA.match(line)
        if java is not None:
            if logged:
                own = (java["msg"] or "").strip().rstrip(":").strip()
                message = f"{logged}: {own}" if own and own not in logged else logged
                return _line(java["name"], message)
            return _line(java["name"], java["msg"])
        if line and not line[0].isspace():
            logged = None
    return None


def last_line(text: str) -> str | None:
    """The last non-empty line that is not the watchdog's own."""
    for line in reversed(text.splitlines()):
        if line.strip() and not _WATCHDOG.search(line):
            return line.strip()
    return None


def one_line(text: str, limit: int = MAX_CHARS) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    flat = _SPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def read_log(path: Path) -> str:
    """The start and the end of the log at ``path`` ("" when it cannot be read)."""
    try:
        with path.open("rb") as f:
            head = f.read(HEAD_BYTES)
            size = f.seek(0, os.SEEK_END)
            if size <= HEAD_BYTES:
                return head.decode(errors="replace")
            f.seek(max(HEAD_BYTES, size - TAIL_BYTES))
            tail = f.read()
    except OSError:
        return ""
    return head.decode(errors="replace") + "\n" + tail.decode(errors="replace")


def crash_error(reason: str, exit_code: int | None, log_file: Path) -> str:
    """The error recorded for a run that ended as a crash, by its server or by its
    watchdog alike: how it ended, then the driver's first exception line (else its last
    log line), one line of at most :data:`MAX_CHARS`."""
    error = f"driver {reason} with exit code {exit_code}"
    text = read_log(log_file)
    cause = first_exception(text) or last_line(text)
    return one_line(f"{error}: {cause}" if cause else error)
