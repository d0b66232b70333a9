"""The daemon's goodput of every job, kept without reading an events file on its loop.

A live attempt's `Tally` is fed by the supervisor with each event it follows
(`Accounts.observe`); an ended attempt's is saved as ``goodput.json`` beside
its events (`tally.save`) and loaded from there after a restart.  An attempt
with neither (its daemon was killed, or its file changed since) is read by a
thread (`tally.read`); until that ends, the job's goodput names the attempt
as still being read and counts nothing, so a status request or a metrics
rendering never waits for a file of any length.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.background import Background, off_loop
from jobwarden.daemon.incidents import tally as tallies
from jobwarden.daemon.incidents.goodput import Goodput, failure_cost, launch_and_end, marks_of
from jobwarden.daemon.incidents.tally import Tally
from jobwarden.events import Event
from jobwarden.jobfolder import ATTEMPTS

log = structlog.get_logger("wardend.goodput")

MAX_KEPT = 4096
"""Ended attempts' tallies kept in memory before the oldest are dropped (they reload)."""
SETTLED = frozenset({"completed", "failed", "escalated", "cancelled"})


def account(submitted: float, found: Sequence[Tally], end: float) -> Goodput | None:
    """`goodput.account` over tallies; None when one was fixed for another reached step."""
    out = Goodput(wall_s=max(0.0, end - submitted))
    previous_end, reached = submitted, 0
    for index, one in enumerate(found):
        out.add("queue" if index == 0 else "backoff", (one.launched or 0.0) - previous_end)
        stop = one.ended if one.ended is not None else end
        high = one.contribute(out, reached, min(stop, end))
        if high is None:
            return None
        reached, previous_end = high, stop
    if found and found[-1].ended is not None:
        out.add("other", end - previous_end)
    elif not found:
        out.add("queue", end - submitted)
    counted = out.productive_s + sum(out.badput_s.values())
    out.badput_s["other"] += max(0.0, out.wall_s - counted)
    return out


class Accounts:
    """Every attempt's tally, by attempt folder, and the reads still under way."""

    def __init__(self) -> None:
        self.tallies: dict[Path, Tally] = {}
        self.reading: dict[Path, asyncio.Task[None]] = {}
        self.background = Background("wardend.goodput")
        self.stop = threading.Event()
        self.reads = 0
        """events files read whole since the daemon started (none for one it followed)"""

    def observe(self, job_folder: Path, number: int, event: Event) -> None:
        """Account one event of a live attempt (its first starts the attempt's tally)."""
        folder = job_folder / ATTEMPTS / str(number)
        found = self.tallies.get(folder)
        if found is None or not found.live:
            found = self.tallies[folder] = Tally(number, live=True)
        for mark in marks_of([event]):
            found.feed(mark)

    def goodput(
        self, job_folder: Path, history: Sequence[Mapping[str, Any]], now: float
    ) -> Goodput:
        """The job's goodput so far, or which of its attempts are still being read."""
        found, reading = self._attempts(job_folder)
        submitted = float(history[0]["time"]) if history else None
        if submitted is None:
            submitted = (found[0].launched or now) if found else now
        end = now
        if history and history[-1].get("to") in SETTLED:
            end = float(history[-1]["time"])
        if reading:
            return Goodput(wall_s=max(0.0, end - submitted), reading=tuple(reading))
        out = account(submitted, found, end)
        if out is None:  # a summary fixed for attempts since changed: read them again
            for one in found:
                if not one.live:
                    self._read(job_folder / ATTEMPTS / str(one.number), one.number, again=True)
            return self.goodput(job_folder, history, now)
        return out

    def failure_cost(self, job_folder: Path, failed: int) -> dict[str, float]:
        """`goodput.failure_cost` of attempt ``failed`` (empty while an attempt is read)."""
        found, reading = self._attempts(job_folder)
        return {} if reading else failure_cost([one.trace() for one in found], failed)

    def _attempts(self, job_folder: Path) -> tuple[list[Tally], list[int]]:
        """The job's attempts' tallies known now, in order, and the numbers being read."""
        attempts = job_folder / ATTEMPTS
        try:
            numbers = sorted(int(p.name) for p in attempts.iterdir() if p.name.isdigit())
        except OSError:
            return [], []
        found: list[Tally] = []
        reading: list[int] = []
        for number in numbers:
            one = self._tally(attempts / str(number), number)
            if one is None:
                reading.append(number)
            elif not reading and not one.absent:
                found.append(one)
        if not reading:
            self._settle(attempts, found)
        return found, reading

    def _tally(self, folder: Path, number: int) -> Tally | None:
        """The attempt's tally (its end looked up until it has one); None while it is read."""
        found = self.tallies.get(folder)
        if found is not None and found.absent and tallies.events_source(folder) is not None:
            del self.tallies[folder]  # its events file has appeared since
            found = None
        if found is None and folder not in self.reading:
            found = tallies.load(folder)
            if found is None and tallies.events_source(folder) is None:
                found = Tally(number, absent=True)
            if found is not None:
                self._keep(folder, found)
        if found is None:
            self._read(folder, number)
            return None
        if found.ended is None:
            found.launched, found.ended, found.stopped_by = launch_and_end(folder, found.head)
            found.live = found.live and found.ended is None
        return found

    def _settle(self, attempts: Path, found: list[Tally]) -> None:
        """Fix and save each ended attempt's split (a failed save is logged, and kept)."""
        unfixed = [one for one in found if one.ended is not None and one.fixed is None]
        tallies.settle(found)
        for one in unfixed:
            folder = attempts / str(one.number)
            one.source = tallies.events_source(folder)
            try:
                tallies.save(folder, one)
            except OSError as error:
                log.error("goodput.save_failed", folder=str(folder), error=repr(error))

    def _keep(self, folder: Path, found: Tally) -> None:
        if len(self.tallies) >= MAX_KEPT:
            for key in [k for k, v in self.tallies.items() if not v.live][: MAX_KEPT // 2]:
                del self.tallies[key]
        self.tallies[folder] = found

    def _read(self, folder: Path, number: int, again: bool = False) -> None:
        """Start reading the attempt's events file on a thread (at once, with no loop);
        ``again``: its tally in memory, or saved, is set aside until the read ends."""
        if again:
            self.tallies.pop(folder, None)
        if folder in self.reading:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._keep(folder, tallies.read(folder, number, self.stop))
            return
        task = self.background.spawn(self._reading(folder, number))
        self.reading[folder] = task
        task.add_done_callback(functools.partial(self._read_done, folder))

    def _read_done(self, folder: Path, task: asyncio.Task[None]) -> None:
        """The read has ended, or was cancelled (perhaps before it began)."""
        if self.reading.get(folder) is task:
            del self.reading[folder]

    async def _reading(self, folder: Path, number: int) -> None:
        began = time.monotonic()
        found = await off_loop(tallies.read, folder, number, self.stop)
        self.reads += 1
        log.info("goodput.read", folder=str(folder), seconds=round(time.monotonic() - began, 3))
        existing = self.tallies.get(folder)
        if not self.stop.is_set() and (existing is None or not existing.live):
            self._keep(folder, found)

    def close(self) -> None:
        """Stop the reads under way (their threads end at their next line)."""
        self.stop.set()
        self.background.cancel()
