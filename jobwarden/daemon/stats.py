"""The daemon's counters since it started, shared by the loop, the supervisors and metrics.

Every metrics counter counts from the daemon's start, as a Prometheus counter of
a process does.  Most are counted here as they happen (`Stats`); the others are
read from totals that outlive the daemon (restarts, replayed updates and time
lost in job records, incidents in their files, goodput in the events), and
`SinceStart` turns those into what they grew by since the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Key = tuple[str, ...]
"""A series of one source: its name and label values, e.g. ``("badput", "replay")``."""
ALL_JOBS = ""
"""The job of a source whose totals are kept for the whole daemon (incidents by kind)."""


class SinceStart:
    """Counters since the daemon's start, made of whole-life totals read each rendering.

    A source's totals are read per job: the first reading of a job the daemon
    found at its start is its baseline (counted by an earlier daemon); a job
    submitted since starts from zero.  A total that falls (an operator's resume
    starts a job's restarts again) adds nothing, so a counter never falls, and
    a removed job's counts stay in the sums.
    """

    def __init__(self) -> None:
        self._before: set[tuple[str, str]] = set()
        self._last: dict[tuple[str, str], dict[Key, float]] = {}
        self._counted: dict[tuple[str, str], dict[Key, float]] = {}
        self._retired: dict[tuple[str, Key], float] = {}

    def begin(self, source: str, jobs: Iterable[str]) -> None:
        """At the daemon's start: what ``jobs`` hold of ``source`` was counted before it."""
        self._before.update((source, job) for job in jobs)

    def read(self, source: str, job: str, totals: Mapping[Key, float]) -> dict[Key, float]:
        """Take one job's whole-life ``totals`` of ``source``; its growth since the start."""
        group = (source, job)
        counted = self._counted.setdefault(group, {})
        last = dict(totals) if group in self._before else self._last.get(group, {})
        self._before.discard(group)
        for key, total in totals.items():
            counted[key] = counted.get(key, 0.0) + max(0.0, total - last.get(key, 0.0))
        self._last[group] = dict(totals)
        return counted

    def keep(self, jobs: set[str]) -> None:
        """Forget the jobs not in ``jobs`` (removed): their counts stay in `summed`."""
        for group in [g for g in self._counted if g[1] not in jobs and g[1] != ALL_JOBS]:
            for key, count in self._counted.pop(group).items():
                self._retired[group[0], key] = self._retired.get((group[0], key), 0.0) + count
            self._last.pop(group, None)
        self._before = {g for g in self._before if g[1] in jobs or g[1] == ALL_JOBS}

    def summed(self, source: str) -> dict[Key, float]:
        """The growth of ``source`` since the start by series, over every job read so far."""
        sums = {key: n for (of, key), n in self._retired.items() if of == source}
        for (of, _), counted in self._counted.items():
            if of == source:
                for key, count in counted.items():
                    sums[key] = sums.get(key, 0.0) + count
        return sums


@dataclass
class Stats:
    """Counts since the daemon started, kept in memory and lost with it."""

    intake_accepted: int = 0
    intake_rejected: int = 0
    malformed_event_lines: int = 0
    stalls_detected: int = 0
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    checkpoint_seconds: float = 0.0
    since_start: SinceStart = field(default_factory=SinceStart)
    """The counters read from totals that outlive the daemon."""
