"""One attempt's goodput kept as running sums, so that no events file is accounted twice.

A `Tally` takes an attempt's accounting marks one at a time, as the daemon
follows its events or as a thread reads a file it never followed, and keeps
what `goodput.account` needs of them: the start-up marks, sums of the time
between updates, and each update's step and net time (the split between new
and replayed updates waits for the highest step of the attempts before it).
Once the attempt has ended and that step is known, the split is fixed and the
tally is saved as ``goodput.json`` beside the events file, a few kilobytes
whatever the file's length, so a restarted daemon reads no events file again.
The sums equal `goodput.account`'s for marks in time order, each no later
than the end they are accounted to.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.daemon.incidents.goodput import Goodput, Mark, Trace, launch_and_end, marks_of
from jobwarden.events import parse_line
from jobwarden.files import write_text_atomic
from jobwarden.jobfolder import EVENTS_FILE

GOODPUT_FILE = "goodput.json"
SCHEMA = 1
YIELD_EVERY = 500
YIELD_S = 0.001
"""A read pauses this long every so many lines: a thread that only parses would hold the
interpreter's lock for most of each turn of the loop, which waits for it."""
HEAD_MARKS = 1024
"""Marks kept from an attempt's start, for the cost of the failure before it."""


@dataclass
class Tally:
    """One attempt's accounting so far (``live``: fed by the daemon as it follows it)."""

    number: int
    live: bool = False
    launched: float | None = None
    ended: float | None = None
    stopped_by: str | None = None
    started: float | None = None
    restored: float | None = None
    ready: float | None = None
    last: float = 0.0
    last_progress: float | None = None
    held: float = 0.0
    checkpoint_s: float = 0.0
    compile_s: float = 0.0
    """ready until the first update (`goodput`'s compile bucket)"""
    high: int = 0
    count: int = 0
    total_net: float = 0.0
    completed: bool = False
    monotonic: bool = True
    steps: array[int] = field(default_factory=lambda: array("q"))
    nets: array[float] = field(default_factory=lambda: array("d"))
    head: list[Mark] = field(default_factory=list)
    truncated: bool = False
    fixed: tuple[int, int, float] | None = None
    """(reached, replayed updates, their net time) once the split is known"""
    source: tuple[int, int] | None = None
    """the events file's (inode, size) the tally accounts for, once saved or read"""
    absent: bool = False
    """no events file (a plain program's attempt): left out of the job's goodput"""

    def feed(self, mark: Mark) -> None:
        """Account one more mark, as `goodput._attempt` does in its loop."""
        if len(self.head) < HEAD_MARKS:
            self.head.append(mark)
        else:
            self.truncated = True
        if mark.kind == "started" and self.started is None:
            self.started = mark.time
        elif mark.kind == "restored" and self.restored is None:
            self.restored = mark.time
        elif mark.kind == "ready" and self.ready is None:
            self.ready = self.last = mark.time
        if self.ready is None or mark.time < self.ready:
            return
        if mark.kind == "checkpoint":
            self.held += mark.blocked_s
        elif mark.kind == "completed":
            self.completed = True
        elif mark.kind == "progress":
            span = mark.time - self.last
            blocked = min(self.held, max(0.0, span))
            net = max(0.0, span - blocked)
            self.checkpoint_s += blocked
            if not self.count:  # the attempt's first update: its compilation
                self.compile_s, net = net, 0.0
            if self.steps and mark.step < self.steps[-1]:
                self.monotonic = False
            self.steps.append(mark.step)
            self.nets.append(net)
            self.count += 1
            self.total_net += net
            self.last, self.held, self.last_progress = mark.time, 0.0, mark.time
            self.high = max(self.high, mark.step)

    def split(self, reached: int) -> tuple[int, float] | None:
        """Updates at or below ``reached`` and their net time (None: fixed for another)."""
        if self.fixed is not None:
            return self.fixed[1:] if self.fixed[0] == reached else None
        if self.monotonic:
            count = bisect.bisect_right(self.steps, reached)
            return count, sum(self.nets[:count])
        pairs = [net for step, net in zip(self.steps, self.nets, strict=True) if step <= reached]
        return len(pairs), sum(pairs)

    def fix(self, reached: int) -> None:
        """Fix the split for ``reached`` and drop the per-update arrays."""
        found = self.split(reached)
        assert found is not None, "a tally is fixed once"
        self.fixed = (reached, *found)
        self.steps, self.nets = array("q"), array("d")

    def contribute(self, out: Goodput, reached: int, end: float) -> int | None:
        """Add this attempt, observed until ``end``, to ``out``; returns the highest step
        reached, or None (``out`` untouched) when the split was fixed for another."""
        found = self.split(reached)
        if found is None:
            return None
        launched = self.launched or 0.0
        if self.ready is None:
            out.add("stall" if self.stopped_by == "stall" else "startup", end - launched)
            return reached
        replayed, replay_s = found
        restored, started = self.restored, self.started
        restore = restored - started if restored is not None and started is not None else 0.0
        out.add("restore", restore)
        out.add("startup", self.ready - launched - max(0.0, restore))
        out.add("compile", self.compile_s)
        out.add("checkpoint", self.checkpoint_s)
        out.add("replay", replay_s)
        out.productive_s += max(0.0, self.total_net - replay_s)
        out.replayed_updates += replayed
        out.new_updates += self.count - replayed
        tail = max(0.0, end - self.last)
        blocked = min(self.held, tail)
        out.add("checkpoint", blocked)
        if self.completed or self.stopped_by in ("operator", "shutdown"):
            out.add("other", tail - blocked)
        else:
            out.add("stall" if self.stopped_by == "stall" else "replay", tail - blocked)
        return max(reached, self.high)

    def trace(self) -> Trace:
        """A short trace for `goodput.failure_cost`: the first marks, and the last update."""
        marks = list(self.head)
        if self.truncated and self.last_progress is not None:
            marks.append(Mark("progress", self.last_progress, self.high))
        return Trace(self.number, self.launched or 0.0, self.ended, self.stopped_by, tuple(marks))

    def as_record(self) -> dict[str, Any]:
        """The saved form: everything but the per-update arrays (call `fix` first)."""
        plain = ("number", "launched", "ended", "stopped_by", "started", "restored", "ready")
        sums: tuple[str, ...] = ("last", "last_progress", "held", "checkpoint_s", "compile_s")
        sums += ("high", "count", "total_net")
        record: dict[str, Any] = {"schema": SCHEMA}
        record |= {name: getattr(self, name) for name in (*plain, *sums, "completed")}
        record["truncated"] = self.truncated
        record["fixed"], record["source"] = self.fixed, self.source
        record["head"] = [[m.kind, m.time, m.step, m.blocked_s] for m in self.head]
        return record


def from_record(record: dict[str, Any]) -> Tally:
    """A saved tally (raises KeyError, TypeError or ValueError on a malformed one)."""
    if record.get("schema") != SCHEMA:
        raise ValueError(f"goodput summary schema {record.get('schema')!r}, expected {SCHEMA}")
    names: tuple[str, ...] = (
        "number",
        "launched",
        "ended",
        "stopped_by",
        "started",
        "restored",
        "ready",
        "last",
        "last_progress",
        "held",
        "checkpoint_s",
        "high",
        "count",
        "total_net",
    )
    tally = Tally(**{name: record[name] for name in names})
    tally.compile_s = float(record.get("compile_s", 0.0))  # a summary saved before it was kept
    tally.completed, tally.truncated = bool(record["completed"]), bool(record["truncated"])
    reached, replayed, replay_s = record["fixed"]
    tally.fixed = (int(reached), int(replayed), float(replay_s))
    inode, size = record["source"]
    tally.source = (int(inode), int(size))
    tally.head = [Mark(str(k), float(t), int(s), float(b)) for k, t, s, b in record["head"]]
    return tally


def events_source(folder: Path) -> tuple[int, int] | None:
    """The attempt's events file's (inode, size), None when it cannot be read."""
    try:
        stat = (folder / EVENTS_FILE).stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size


def load(folder: Path) -> Tally | None:
    """The attempt's saved tally, if it accounts for its events file as it is now."""
    try:
        tally = from_record(json.loads((folder / GOODPUT_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return tally if tally.source == events_source(folder) else None


def save(folder: Path, tally: Tally) -> None:
    """Write the fixed tally beside its events file (atomically, never half a file)."""
    write_text_atomic(folder / GOODPUT_FILE, json.dumps(tally.as_record()) + "\n")


def read(folder: Path, number: int, stop: threading.Event) -> Tally:
    """Account an events file line by line (blocking: run it off the loop) until ``stop``
    is set; a line still being written is left out, as are lines appended after the file
    was measured, and the attempt's launch and end come from its folder."""
    tally, source = Tally(number), events_source(folder)
    tally.source, tally.absent = source, source is None
    size = source[1] if source is not None else 0
    try:
        with (folder / EVENTS_FILE).open("rb") as stream:
            done = 0
            for lines, raw in enumerate(stream):
                done += len(raw)
                if done > size or not raw.endswith(b"\n") or stop.is_set():
                    break
                for mark in marks_of([parse_line(raw.decode("utf-8", errors="replace"))]):
                    tally.feed(mark)
                if lines % YIELD_EVERY == 0:
                    time.sleep(YIELD_S)  # the interpreter lock, and a core, to the loop
    except OSError:
        pass
    tally.launched, tally.ended, tally.stopped_by = launch_and_end(folder, tally.head)
    return tally


def settle(tallies: Sequence[Tally]) -> None:
    """Give each tally its reached step's split once the attempt has ended (in order)."""
    reached = 0
    for tally in tallies:
        if tally.ended is not None and tally.fixed is None:
            tally.fix(reached)
        reached = max(reached, tally.high)
