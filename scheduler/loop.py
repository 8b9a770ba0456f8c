"""The shell of every side thread in a server: a named daemon thread, the event that
stops it and the event that wakes it early.

A side loop subclasses :class:`Loop` and writes only its body: :meth:`Loop.step` for
one that runs a step again and again (the history pruner, the schedule firer, the
alert sender, the health monitor, the auto-rollback watch, the Spark master watch), or
:meth:`Loop.run` for one with a body of its own (the coordinator, the NOTIFY listener),
which reads :attr:`Loop.stopping` and :attr:`Loop.woken` itself.

:meth:`Loop.stop` is idempotent and sets both events, so every wait of the body ends
at once; it waits for the thread at most the loop's ``join_timeout`` (never for the
calling thread itself: a body may stop its own loop).
"""

from __future__ import annotations

import threading


class Loop:
    def __init__(
        self,
        name: str,
        *,
        join_timeout: float,
        interval: float = 0.0,
        first_wait: float = 0.0,
    ) -> None:
        self.stopping = threading.Event()
        self.woken = threading.Event()
        self._join_timeout = join_timeout
        self.interval = interval
        self._first_wait = first_wait
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self.woken.set()

    def begin_stop(self) -> None:
        """Idempotent: ask the body to end, without waiting for it."""
        self.stopping.set()
        self.woken.set()

    def stop(self, timeout: float | None = None) -> None:
        """Idempotent: ask the body to end and wait for it (a step in flight ends
        first) at most ``timeout`` seconds (default: the loop's ``join_timeout``)."""
        self.begin_stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._join_timeout if timeout is None else timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def run(self) -> None:
        """Wait ``first_wait`` seconds (0: none), then run :meth:`step` until stopped,
        waiting between two steps what the last one returned: None for ``interval``,
        0 for no wait at all. A :meth:`wake` ends a wait early."""
        wait: float | None = self._first_wait
        while True:
            if wait is None:
                wait = self.interval
            if wait > 0:
                self.woken.wait(wait)
                self.woken.clear()
            if self.stopping.is_set():
                return
            wait = self.step()

    def step(self) -> float | None:
        """One pass of a periodic loop; it handles its own failures (one that escapes
        ends the thread)."""
        raise NotImplementedError
