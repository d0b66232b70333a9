"""StallWatch on a hand-driven clock: deadlines without sleeping (a heartbeat's, re-armed
by `StallWatch.alive`; the phases of a program that emits events: tests/unit/test_phases.py)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from jobwarden.daemon.supervise.phases import StallPhase
from jobwarden.daemon.supervise.stall import (
    AUTO_FACTOR,
    AUTO_FLOOR_S,
    StallWatch,
    auto_timeout,
)


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
        assert fired == [(StallPhase.STEP, 5.0)]

    def test_ready_switches_to_the_stall_timeout(self) -> None:
        """After ready the (shorter) stall timeout applies, not the startup one."""
        clock, stall, fired = watch()
        stall.start(60)
        clock.advance(1)
        stall.alive(2)
        clock.advance(2)
        assert fired == [(StallPhase.STEP, 2.0)]

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


class TestAutomaticTimeout:
    """stall_timeout_s unset: max(60 s, 10x the slowest gap seen between forward motions)."""

    def test_the_floor_holds_for_fast_updates(self) -> None:
        """Updates of 0.1 s: the deadline is the 60 s floor, not 1 s."""
        clock, stall, fired = watch()
        stall.start(60)
        for _ in range(20):
            clock.advance(0.1)
            stall.alive(None)
        assert stall.timeout_s == AUTO_FLOOR_S
        clock.advance(59.9)
        assert fired == []
        clock.advance(0.2)
        assert [phase for phase, _ in fired] == [StallPhase.STEP]

    def test_slow_updates_are_not_a_stall(self) -> None:
        """A model with 6 s updates (the case a fixed 5 s default declared stalled on every
        step) and a 9 s commit runs on; the deadline grows to 10x the slowest gap."""
        clock, stall, fired = watch()
        stall.start(60)
        clock.advance(2)
        stall.alive(None)  # ready
        for gap in [6, 6, 9, 6, 6]:
            clock.advance(gap)
            stall.alive(None)
        assert fired == []
        assert stall.slowest_gap_s == 9
        assert stall.timeout_s == AUTO_FACTOR * 9
        clock.advance(89.9)
        assert fired == []
        clock.advance(0.2)
        assert len(fired) == 1

    def test_the_startup_phase_is_not_an_update(self) -> None:
        """The wait for ready (imports, compilation) is not counted as an update's gap."""
        clock, stall, _ = watch()
        stall.start(600)
        clock.advance(300)
        stall.alive(None)
        assert stall.slowest_gap_s == 0
        assert stall.timeout_s == AUTO_FLOOR_S

    def test_at_least_lengthens_a_short_deadline(self) -> None:
        """The last event gives the process its exit time, even under a short timeout."""
        _, stall, _ = watch()
        stall.alive(1, at_least_s=60)
        assert stall.timeout_s == 60
        assert auto_timeout(0.5) == AUTO_FLOOR_S
