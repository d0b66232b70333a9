"""StallWatch on a hand-driven clock: deadlines without sleeping."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from jobwarden.daemon.stall import StallPhase, StallWatch


class FakeClock:
    """A monotonic clock and timer queue that moves only when told (like trio's MockClock)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._queue: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        """Now."""
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> FakeTimer:
        """Queue ``callback`` for ``when``."""
        timer = FakeTimer(callback)
        heapq.heappush(self._queue, (when, next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time on, running every timer that falls due, in order."""
        target = self.now + seconds
        while self._queue and self._queue[0][0] <= target:
            when, _, timer = heapq.heappop(self._queue)
            self.now = when
            if not timer.cancelled:
                timer.callback()
        self.now = target


class FakeTimer:
    """A queued callback."""

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run."""
        self.cancelled = True


def watch() -> tuple[FakeClock, StallWatch, list[tuple[StallPhase, float]]]:
    """A watch on a fake clock, recording every stall it reports."""
    clock = FakeClock()
    fired: list[tuple[StallPhase, float]] = []
    return clock, StallWatch(clock, lambda phase, gap: fired.append((phase, gap))), fired


class TestStallWatch:
    def test_startup_deadline_fires_with_its_phase_and_gap(self) -> None:
        """No ready within the startup timeout: a startup stall, gap = the timeout."""
        clock, stall, fired = watch()
        stall.start(60)
        clock.advance(59.9)
        assert fired == []
        clock.advance(0.2)
        assert fired == [(StallPhase.STARTUP, 60.0)]

    def test_progress_rearms_the_deadline(self) -> None:
        """Each progress event pushes the deadline back by the stall timeout."""
        clock, stall, fired = watch()
        stall.start(60)
        for _ in range(10):
            clock.advance(4)
            stall.alive(5)
        assert fired == []
        clock.advance(5)
        assert fired == [(StallPhase.STALL, 5.0)]

    def test_ready_switches_to_the_stall_timeout(self) -> None:
        """After ready the (shorter) stall timeout applies, not the startup one."""
        clock, stall, fired = watch()
        stall.start(60)
        clock.advance(1)
        stall.alive(2)
        clock.advance(2)
        assert fired == [(StallPhase.STALL, 2.0)]

    def test_fires_once(self) -> None:
        """A passed deadline reports once; it is not re-armed by itself."""
        clock, stall, fired = watch()
        stall.alive(1)
        clock.advance(10)
        assert len(fired) == 1
        assert not stall.armed

    def test_cancel_disarms(self) -> None:
        """An ended attempt never stalls."""
        clock, stall, fired = watch()
        stall.alive(1)
        stall.cancel()
        clock.advance(10)
        assert fired == []

    def test_gap_counts_from_the_last_forward_motion(self) -> None:
        """gap() is the time since the last re-arm."""
        clock, stall, _ = watch()
        stall.alive(100)
        clock.advance(3.25)
        assert stall.gap() == 3.25
