"""Malformed event lines, told to the daemon's log at a bounded rate.

A program that prints to stdout what is not an event (a command job left at
``sdk = true``, a stray ``print``) may write thousands of lines a second.  Each
line is kept verbatim in the attempt's events file and counted; the daemon's
own log hears of the first `FIRST_LINES` one by one, then of the rest in one
``event.malformed_summary`` record at most every `SUMMARY_EVERY_S` and when the
attempt ends.  So no job can grow ``wardend.log`` by more than a few records a
minute, nor hold the loop writing them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from jobwarden.events import Malformed

log = structlog.get_logger("wardend.supervisor")

FIRST_LINES = 20
"""Malformed lines of one attempt logged one by one, before they are summarised."""
SUMMARY_EVERY_S = 10.0
"""At most one summary record per attempt in this long."""


@dataclass
class MalformedLines:
    """One attempt's malformed lines: counted, the first logged, the rest summarised."""

    job: str
    attempt: int
    clock: Callable[[], float] = time.monotonic
    seen: int = 0
    unlogged: int = 0
    last_reason: str = ""
    last_line: int = 0
    summarised_at: float | None = None

    def note(self, line: Malformed) -> None:
        """One malformed line: logged while few, else counted for the next summary."""
        self.seen += 1
        if self.seen <= FIRST_LINES:
            log.warning(
                "event.malformed",
                job=self.job,
                attempt=self.attempt,
                line=line.lineno,
                reason=line.reason,
                **({"further": "summarised"} if self.seen == FIRST_LINES else {}),
            )
            return
        self.unlogged += 1
        self.last_reason, self.last_line = line.reason, line.lineno
        now = self.clock()
        if self.summarised_at is None or now - self.summarised_at >= SUMMARY_EVERY_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Log the lines not yet told of in one record (at the attempt's end, and on a timer)."""
        if not self.unlogged:
            return
        log.warning(
            "event.malformed_summary",
            job=self.job,
            attempt=self.attempt,
            lines=self.unlogged,
            total=self.seen,
            last_line=self.last_line,
            last_reason=self.last_reason,
        )
        self.unlogged = 0
        self.summarised_at = self.clock() if now is None else now
