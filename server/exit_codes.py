"""Named exit codes of sparkring processes.

The watchdog (``python -m server.watchdog``) exits with one of these so that its parent,
or a server that adopts it after a restart, can tell why a driver ended even without the
result file. The server and its supervisor (``server supervise``) add their own codes here.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # the driver exited 0 on its own
    USAGE = 2  # bad command line (argparse's convention)
    # Watchdog: the driver exited non-zero on its own; its code is in result.json.
    DRIVER_FAILED = 10
    # Watchdog: the lease confirmation was overdue; the driver group was killed.
    LEASE_EXPIRED = 11
    # Watchdog: asked to stop (SIGTERM); the driver group was terminated.
    STOPPED = 12
    # Watchdog: the driver command could not be started (not found, not executable).
    SPAWN_FAILED = 13
    # Watchdog: asked to kill at once (SIGUSR1): every descendant was SIGKILLed.
    KILL_REQUESTED = 14
    # Server: start-up refused (bad settings, schema not migrated, id taken).
    CONFIG_ERROR = 78  # sysexits' EX_CONFIG
    # Server: ZooKeeper or PostgreSQL could not be reached at start-up. Not final: the
    # supervisor starts the server again (drivers it adopted are left to their
    # watchdogs, so the next start adopts them again).
    UNAVAILABLE = 69  # sysexits' EX_UNAVAILABLE
    # Server: a second SIGTERM/SIGINT during shutdown; drivers left to their watchdogs.
    KILLED = 79
    # Server: a supervised thread died or the registry refused us; exiting to be restarted.
    UNHEALTHY = 80
    # An unexpected error inside a sparkring process (sysexits' EX_SOFTWARE).
    INTERNAL_ERROR = 70
    # Supervisor: the server crashed too often in a row; the container engine's (or
    # systemd's) restart policy takes over (sysexits' EX_TEMPFAIL: try again later).
    CRASH_LOOP = 75


# Exit codes of a driver ended by SIGTERM: killed by the signal, or the JVM's 128 + 15.
SIGTERM_EXITS = frozenset({-15, 143})
