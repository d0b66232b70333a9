"""One ``status`` request per second at most, shared by every open page.

Pages and their live updates never ask the daemon for the table themselves: they take
the poller's newest table, younger than its period, or wait for the next.  However many
pages are open, the daemon answers at most one ``status`` request per period for them.
The poller's thread asks only while someone has looked in the last `idle_s` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from jobwarden.dashboard.source import Table

PERIOD_S = 1.0
IDLE_S = 10.0


class PollFailed(Exception):
    """Raised to a reader when the last request for the table failed; carries its message."""


class Poller:
    """The shared table, which `latest` gives every page."""

    def __init__(
        self,
        fetch: Callable[[], Table],
        period_s: float = PERIOD_S,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetch = fetch
        self.period_s = period_s
        self.idle_s = idle_s
        self.clock = clock
        self.polls = 0
        """``status`` requests made so far."""
        self.version = 0
        self._table: Table | None = None
        self._error: str | None = None
        self._taken = float("-inf")
        self._wanted = float("-inf")
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the polling thread."""
        self._thread = threading.Thread(target=self._run, name="dashboard-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the polling thread and wake every waiting reader."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def latest(self, timeout: float = 10.0) -> Table:
        """The table, no older than one period; waits for the next poll when it is."""
        with self._changed:
            self._wanted = self.clock()
            if self._table is None or self.clock() - self._taken > self.period_s:
                self._changed.notify_all()
                seen = self.version
                self._changed.wait_for(
                    lambda: self.version != seen or self._stopping, timeout=timeout
                )
            return self._current()

    def _current(self) -> Table:
        if self._error is not None or self._table is None:
            raise PollFailed(self._error or "no answer from wardend yet")
        return self._table

    def _run(self) -> None:
        while True:
            with self._changed:
                now = self.clock()
                idle = now - self._wanted > self.idle_s
                # Sleep until someone wants a table (idle) or the period is over (busy).
                left = max(0.0, self.period_s - (now - self._taken))
                self._changed.wait(timeout=None if idle else left)
                if self._stopping:
                    return
                if self.clock() - self._taken < self.period_s:
                    continue
            self._poll()

    def _poll(self) -> None:
        self.polls += 1
        taken = self.clock()
        try:
            table, error = self.fetch(), None
        except Exception as failure:  # noqa: BLE001 - every failure is shown on the page
            table, error = None, f"{type(failure).__name__}: {failure}"
        with self._changed:
            self._table = table if table is not None else self._table
            self._error = error
            self._taken = taken
            self.version += 1
            self._changed.notify_all()
