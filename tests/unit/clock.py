"""A hand-driven clock for the supervisor's deadlines (`supervise.stall.Clock`).

Modelled on trio's ``MockClock``: time stands still until the test calls
`MockClock.advance`, which runs every timer that falls due, in order, each
at its own instant.  It is what `Services.clock` is in these tests, so a
stall or a startup timeout is reached in microseconds, never by sleeping.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class MockTimer:
    """One scheduled callback."""

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run the callback."""
        self.cancelled = True


class MockClock:
    """Monotonic time and timers that move only when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._queue: list[tuple[float, int, MockTimer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        """Now, in seconds."""
        return self.now

    def call_at(self, when: float, callback: Callable[[], object], /) -> MockTimer:
        """Run ``callback`` once time reaches ``when``."""
        timer = MockTimer(when, callback)
        heapq.heappush(self._queue, (when, next(self._order), timer))
        return timer

    @property
    def pending(self) -> list[float]:
        """When each timer still to run is due, soonest first."""
        return sorted(t.when for _, _, t in self._queue if not t.cancelled)

    def advance(self, seconds: float) -> int:
        """Move time on by ``seconds``, running each timer that falls due at its instant;
        returns how many ran."""
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        target, ran = self.now + seconds, 0
        while self._queue and self._queue[0][0] <= target:
            when, _, timer = heapq.heappop(self._queue)
            self.now = when
            if not timer.cancelled:
                ran += 1
                timer.callback()
        self.now = target
        return ran
