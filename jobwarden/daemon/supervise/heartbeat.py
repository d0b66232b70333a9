"""Heartbeats of a plain program: forward motion for a program that emits no events.

A program that does not use `jobwarden.sdk` says it is alive through its job's
``[heartbeat]``: a stdout line matching ``pattern`` (`re.search` over the first
`MATCH_CHARS` characters of the line), or a change of ``file``'s mtime, polled
on the daemon's monotonic clock every `poll_interval`.  Each is one beat, which
the supervisor hands to the attempt's `StallWatch`: the first beat ends the
startup deadline, then ``stall_timeout_s`` runs from one beat to the next.
Without a heartbeat nothing is watched, and such a program is only restarted
when it exits.  A watch never raises: it runs on the daemon's loop.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from jobwarden.daemon.supervise.stall import AUTO_FLOOR_S, Clock, Timer
from jobwarden.jobfile import Job
from jobwarden.program import HeartbeatSection
from jobwarden.sections import SupervisionSection

MATCH_CHARS = 4096
"""How much of each stdout line a pattern is matched against (bounds its cost)."""
SHOWN_CHARS = 200
"""How much of a line an incident quotes."""
MAX_POLL_S = 1.0
MIN_POLL_S = 0.02


def poll_interval(supervision: SupervisionSection) -> float:
    """How often a heartbeat file is looked at: a quarter of the shorter timeout, at most 1 s."""
    stall = supervision.stall_timeout_s
    shortest = min(supervision.startup_timeout_s, AUTO_FLOOR_S if stall is None else stall)
    return min(MAX_POLL_S, max(MIN_POLL_S, shortest / 4))


Signature = tuple[int, int, int]


class Heartbeat:
    """One attempt's heartbeat watch: calls ``on_beat()`` on every beat it sees."""

    def __init__(
        self,
        section: HeartbeatSection | None,
        cwd: Path,
        clock: Clock,
        on_beat: Callable[[], None],
        poll_s: float = MAX_POLL_S,
    ) -> None:
        self.section = section
        self.clock = clock
        self.on_beat = on_beat
        self.poll_s = poll_s
        self.pattern = re.compile(section.pattern) if section and section.pattern else None
        self.file = cwd / section.file if section and section.file else None
        self.beats = 0
        self.lines = 0
        self.last_line: str | None = None
        self.last_beat: str | None = None
        """What the last beat was (the line, or the file's change), for incidents."""
        self.last_beat_time: float | None = None
        """Wall-clock time of the last beat (a record, never a duration)."""
        self._seen = self._signature()
        self._timer: Timer | None = None

    @classmethod
    def of(cls, job: Job, cwd: Path, clock: Clock, on_beat: Callable[[], None]) -> Heartbeat:
        """The watch of one attempt of ``job`` run in ``cwd`` (polling per `poll_interval`)."""
        section = job.program.heartbeat if job.program is not None else None
        return cls(section, cwd, clock, on_beat, poll_interval(job.supervision))

    @property
    def watching(self) -> bool:
        """Whether the program has a heartbeat at all."""
        return self.section is not None

    def start(self) -> None:
        """Begin polling the heartbeat file, if there is one; a file that already exists
        counts only once it changes."""
        if self.file is not None:
            self._arm()

    def line(self, text: str) -> None:
        """One line of the program's stdout: a beat if it matches the pattern."""
        self.lines += 1
        shown = text[:SHOWN_CHARS]
        self.last_line = shown
        if self.pattern is not None and self.pattern.search(text[:MATCH_CHARS]):
            self._beat(f"line {self.lines}: {shown!r}")

    def cancel(self) -> None:
        """Stop polling (the attempt ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _signature(self) -> Signature | None:
        if self.file is None:
            return None
        try:
            info = self.file.stat()
        except (OSError, ValueError):
            return None
        return info.st_mtime_ns, info.st_ino, info.st_dev

    def _arm(self) -> None:
        self._timer = self.clock.call_at(self.clock.time() + self.poll_s, self._poll)

    def _poll(self) -> None:
        self._timer = None
        seen, before = self._signature(), self._seen
        self._seen = seen
        self._arm()
        if seen is not None and seen != before:
            self._beat(f"{self.file} modified")

    def _beat(self, what: str) -> None:
        self.beats += 1
        self.last_beat, self.last_beat_time = what, time.time()
        self.on_beat()
