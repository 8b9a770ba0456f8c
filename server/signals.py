"""Signal handling of the server process, in one place.

The first SIGTERM or SIGINT asks for a graceful shutdown (stop claiming, hand jobs off,
release, leave); a second one exits at once with ``ExitCode.KILLED`` (drivers are then
left to their watchdogs, which kill them before their leases expire).

With ``on_term`` given (a server configured with a hand-over window), SIGTERM calls it
instead: a planned restart that leaves the drivers running for the successor. SIGINT
(Ctrl-C) always hands the jobs off to other servers.

The supervisor (``server supervise``) does not interpret signals: ``forward`` passes
each SIGTERM and SIGINT to it, and it sends them on to its child, the server.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from server import exit_codes


def install(request_stop: Callable[[], None], on_term: Callable[[], None] | None = None) -> None:
    received: list[int] = []

    def handle(signum: int, _frame: object) -> None:
        received.append(signum)
        if len(received) == 1:
            if signum == signal.SIGTERM and on_term is not None:
                on_term()
            else:
                request_stop()
            return
        sys.stderr.write("second signal: exiting now\n")
        os._exit(exit_codes.ExitCode.KILLED)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def forward(handler: Callable[[int], None]) -> None:
    """Call ``handler(signum)`` on every SIGTERM and SIGINT (it must not block)."""

    def handle(signum: int, _frame: object) -> None:
        handler(signum)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
