"""Stall detection: a startup timeout until ``ready``, then a stall timeout between progress.

Deadlines are timers on a monotonic clock (the daemon's loop), re-armed on
every ready, progress or checkpoint event, so detection is as late as the
timer fires, a few milliseconds past the timeout.  The clock is anything with
the loop's ``time()`` and ``call_at()``, so tests drive it by hand.

A stall timeout of ``None`` is the default, ``auto``: the deadline is
``max(AUTO_FLOOR_S, AUTO_FACTOR x the slowest gap seen so far)`` between two
forward-motion events of this attempt, so a model whose updates (or commits)
take 6 s gets a minute of grace at least, and one whose commits take 20 s gets
200 s, while a hang is still caught.  The first gap after ``ready`` includes
the compilation of the step; it counts, which only makes the deadline longer.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol


class StallPhase(enum.StrEnum):
    """What the watch is waiting for."""

    STARTUP = "startup"
    """spawn until the ``ready`` event"""
    STALL = "stall"
    """one progress (or checkpoint) event to the next"""


class Timer(Protocol):
    """A scheduled callback that can be cancelled (`asyncio.TimerHandle`)."""

    def cancel(self) -> None:
        """Do not run the callback."""


class Clock(Protocol):
    """Monotonic time and timers: the asyncio loop, or a test's hand-driven clock."""

    def time(self) -> float:
        """Now, in seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> Timer:
        """Run ``callback`` at ``when``."""
        ...


AUTO_FLOOR_S = 60.0
"""The shortest automatic stall timeout."""
AUTO_FACTOR = 10.0
"""The automatic stall timeout, in multiples of the slowest gap seen."""


def auto_timeout(slowest_gap_s: float) -> float:
    """The automatic stall timeout after a slowest gap of ``slowest_gap_s``."""
    return max(AUTO_FLOOR_S, AUTO_FACTOR * slowest_gap_s)


class StallWatch:
    """The deadline of one attempt; calls ``on_stall(phase, gap_s)`` once it passes."""

    def __init__(self, clock: Clock, on_stall: Callable[[StallPhase, float], None]) -> None:
        self.clock = clock
        self.on_stall = on_stall
        self.phase = StallPhase.STARTUP
        self.last_event = clock.time()
        self.slowest_gap_s = 0.0
        """the longest time between two forward-motion events after ``ready``"""
        self.timeout_s = 0.0
        """the deadline now armed, in seconds after the last event"""
        self._timer: Timer | None = None

    def _arm(self, phase: StallPhase, timeout_s: float) -> None:
        self.cancel()
        self.phase = phase
        self.last_event = self.clock.time()
        self.timeout_s = timeout_s
        self._timer = self.clock.call_at(self.last_event + timeout_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.on_stall(self.phase, self.gap())

    def start(self, startup_timeout_s: float) -> None:
        """Arm the startup deadline (spawn until ``ready``)."""
        self._arm(StallPhase.STARTUP, startup_timeout_s)

    def alive(self, stall_timeout_s: float | None, at_least_s: float = 0.0) -> None:
        """Forward motion (ready, progress, checkpoint): re-arm the stall deadline, of
        ``stall_timeout_s``, or automatic when it is None; never shorter than
        ``at_least_s``."""
        if self.phase is StallPhase.STALL:
            self.slowest_gap_s = max(self.slowest_gap_s, self.gap())
        if stall_timeout_s is None:
            stall_timeout_s = auto_timeout(self.slowest_gap_s)
        self._arm(StallPhase.STALL, max(stall_timeout_s, at_least_s))

    def gap(self) -> float:
        """Seconds since the last forward motion."""
        return self.clock.time() - self.last_event

    @property
    def armed(self) -> bool:
        """Whether a deadline is pending."""
        return self._timer is not None

    def cancel(self) -> None:
        """Disarm (the attempt ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
