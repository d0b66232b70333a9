"""Stall detection: a startup timeout until ``ready``, then a stall timeout between progress.

Deadlines are timers on the daemon's loop clock (monotonic), re-armed on
every progress or checkpoint event, so detection is as late as the timer
fires, a few milliseconds past the timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class StallWatch:
    """The deadline of one attempt; calls ``on_stall(phase, gap_s)`` when it passes."""

    loop: asyncio.AbstractEventLoop
    on_stall: Callable[[str, float], None]
    last_event: float = 0.0
    phase: str = "startup"
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def _arm(self, timeout_s: float) -> None:
        self.cancel()
        self.last_event = self.loop.time()
        self._timer = self.loop.call_at(self.last_event + timeout_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.on_stall(self.phase, self.loop.time() - self.last_event)

    def start(self, startup_timeout_s: float) -> None:
        """Arm the startup deadline (spawn until ``ready``)."""
        self.phase = "startup"
        self._arm(startup_timeout_s)

    def alive(self, stall_timeout_s: float) -> None:
        """Forward motion (ready, progress, checkpoint): re-arm the stall deadline."""
        self.phase = "stall"
        self._arm(stall_timeout_s)

    def gap(self) -> float:
        """Seconds since the last forward motion."""
        return self.loop.time() - self.last_event

    def cancel(self) -> None:
        """Disarm (the attempt ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
