"""The supervisor of ``sparkring server run`` inside a container (``server supervise``).

In a container the main process's death ends the container, and every driver with it.
The image therefore runs this small supervisor under tini: it runs the server as its
child and restarts it at once when it crashes, so the restarted server (same id, same
work dir) adopts the drivers whose watchdogs are still alive. The watchdogs run in
sessions of their own; nothing here ever signals them.

How the child's end is handled:

- killed by a signal the supervisor did not forward, or an exit code not listed below
  (1: an uncaught exception, 69 UNAVAILABLE, 70 INTERNAL_ERROR, 80 UNHEALTHY...) -> a
  crash: restart after ``delay * 2**(crashes in the window - 1)`` seconds (capped);
- more than ``limit`` crashes within ``window`` seconds -> give up with
  ``ExitCode.CRASH_LOOP``, so that the container engine's restart policy takes over;
- exit 0, 2 USAGE, 78 CONFIG_ERROR or 79 KILLED -> final: exit with the child's code;
- SIGTERM or SIGINT to the supervisor -> forwarded to the child (each signal, so a
  second one still means "exit at once"); whatever the child does next is final. A
  signal during the back-off before a restart: no restart, exit with the crash's status.

The child runs in a process group of its own, so that a Ctrl-C in a terminal reaches it
once (forwarded), not twice; and it is SIGKILLed if the supervisor dies, so that a
restarted supervisor never finds the work dir held by an orphaned server.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from server import defaults, exit_codes, signals

log = logging.getLogger(__name__)

# Codes after which a restart cannot help, or was not wanted (docs/operations.md).
FINAL = frozenset(
    {
        exit_codes.ExitCode.OK,
        exit_codes.ExitCode.USAGE,
        exit_codes.ExitCode.CONFIG_ERROR,
        exit_codes.ExitCode.KILLED,
    }
)
# How often the wait for the child looks for signals to forward, seconds.
POLL_S = 0.1
# linux/prctl.h. libc is loaded here, not in the forked child: a dlopen between fork
# and exec could wait forever on a lock another thread held at the fork.
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def server_argv(config: Path | None, options: Mapping[str, object | None]) -> list[str]:
    """``sparkring server run`` with the given options (None: left out), as an argv list."""
    argv = [sys.executable, "-m", "server"]
    if config is not None:
        argv += ["--config", str(config)]
    argv += ["server", "run"]
    for option, value in options.items():
        if value is not None:
            argv += [option, str(value)]
    return argv


class CrashHistory:
    """The crashes of the last ``window`` seconds: the delay before the next restart, or
    None when there were more than ``limit`` of them (a crash loop)."""

    def __init__(self, limit: int, window: float, delay: float, delay_max: float) -> None:
        self.limit = limit
        self.window = window
        self.delay = delay
        self.delay_max = delay_max
        self._times: collections.deque[float] = collections.deque()

    def record(self, now: float) -> float | None:
        self._times.append(now)
        while now - self._times[0] > self.window:
            self._times.popleft()
        if len(self._times) > self.limit:
            return None
        return min(self.delay * 2 ** (len(self._times) - 1), self.delay_max)

    def __len__(self) -> int:
        return len(self._times)


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when the supervisor dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        restart_delay: float = defaults.SUPERVISOR_RESTART_DELAY_S,
        restart_delay_max: float = defaults.SUPERVISOR_RESTART_DELAY_MAX_S,
        crash_limit: int = defaults.SUPERVISOR_CRASH_LIMIT,
        crash_window: float = defaults.SUPERVISOR_CRASH_WINDOW_S,
    ) -> None:
        self.argv = list(argv)
        self._crashes = CrashHistory(crash_limit, crash_window, restart_delay, restart_delay_max)
        # Signals received and not yet forwarded. A signal handler only appends here:
        # the main loop does the forwarding, so a signal that arrives while a child is
        # being spawned is neither lost nor sent twice.
        self._received: list[int] = []

    def handle_signal(self, signum: int) -> None:
        self._received.append(signum)

    def stop(self) -> None:
        """Ask the child to stop (SIGTERM, as ``docker stop``) and not restart it."""
        if not self._received:
            self._received.append(signal.SIGTERM)

    def run(self) -> int:
        """Run the child until it ends for good; the supervisor's exit code."""
        log.info("supervising the server", extra={"action": "supervise", "argv": self.argv})
        while True:
            child = subprocess.Popen(self.argv, process_group=0, preexec_fn=_die_with_parent)
            log.info("server started", extra={"action": "child_started", "pid": child.pid})
            code, signalled = self._wait(child)
            if signalled or code in FINAL:
                log.info(
                    "server exited; not restarting it",
                    extra={
                        "action": "child_exited",
                        "pid": child.pid,
                        "exit_code": code,
                        "signalled": signalled,
                    },
                )
                return _exit_status(code)
            delay = self._crashes.record(time.monotonic())
            if delay is None:
                log.error(
                    "server keeps crashing; giving up",
                    extra={
                        "action": "crash_loop",
                        "exit_code": code,
                        "crashes": len(self._crashes),
                        "window_s": self._crashes.window,
                    },
                )
                return exit_codes.ExitCode.CRASH_LOOP
            log.warning(
                "server crashed; restarting it to adopt its drivers",
                extra={
                    "action": "restart",
                    "pid": child.pid,
                    "exit_code": code,
                    "crashes": len(self._crashes),
                    "delay_s": delay,
                },
            )
            if self._pause(delay):
                return _exit_status(code)

    def _wait(self, child: subprocess.Popen[bytes]) -> tuple[int, bool]:
        """Wait for the child, forwarding each signal received meanwhile; its return code
        and whether it was sent a signal."""
        forwarded = 0
        while True:
            while forwarded < len(self._received):
                signum = self._received[forwarded]
                log.info(
                    "forwarding a signal to the server",
                    extra={"action": "forward", "signal": signal.Signals(signum).name},
                )
                child.send_signal(signum)
                forwarded += 1
            try:
                return child.wait(timeout=POLL_S), forwarded > 0
            except subprocess.TimeoutExpired:
                continue

    def _pause(self, seconds: float) -> bool:
        """Sleep before a restart; True as soon as a signal says not to restart."""
        deadline = time.monotonic() + seconds
        while not self._received:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, POLL_S))
        return True


def _exit_status(code: int) -> int:
    """A child's return code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def main(supervisor: Supervisor) -> int:
    """Run ``supervisor`` with SIGTERM and SIGINT forwarded to its child; the exit code."""
    signals.forward(supervisor.handle_signal)
    return supervisor.run()
