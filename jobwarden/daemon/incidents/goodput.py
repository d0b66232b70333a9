"""Goodput: the share of a job's wall time spent on new updates, and where the rest went.

Computed from what the daemon already keeps: each attempt's ``events.jsonl``
and ``exit.json`` and the job's state history.  The badput buckets follow
Google's ml-goodput-measurement:

- ``queue``: submitted until the first attempt was launched;
- ``backoff``: an attempt's end until the next one was launched (restart
  delay, spawn decision);
- ``startup``: launch until ``ready`` (interpreter, JAX, data, compilation),
  less ``restore``;
- ``restore``: ``started`` until ``restored``, for an attempt that resumed;
- ``compile``: ``ready`` until the attempt's first update (its compilation: the
  ``compile`` phase of the stall watch); that update is counted, its time is not;
- ``replay``: updates redone after a failure (their step was reached by an
  earlier attempt), and a failed attempt's time after its last update (work
  the failure threw away);
- ``checkpoint``: the time training was held by commits (``blocked_s``);
- ``stall``: a stalled attempt's time from its last forward motion to its end;
- ``other``: the rest (shutdown after the last update, the daemon's own turns).

Productive time is each interval between two updates whose step is new,
less the commit blocking inside it.  `account` is pure; `JobTraces` reads
and caches every mark of the files, blocking (the reference of the tests):
the daemon keeps running sums instead (`incidents.accounts`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.events import Event, parse_lines
from jobwarden.jobfolder import ATTEMPTS, EVENTS_FILE, JOB_FILE

BUCKETS = (
    "queue",
    "backoff",
    "startup",
    "restore",
    "compile",
    "replay",
    "checkpoint",
    "stall",
    "other",
)
KEPT = frozenset({"started", "restored", "ready", "progress", "checkpoint", "completed"})


@dataclass(frozen=True)
class Mark:
    """One event that matters to the accounting: its kind, wall time, step and commit hold."""

    kind: str
    time: float
    step: int = 0
    blocked_s: float = 0.0


@dataclass(frozen=True)
class Trace:
    """One attempt: when it was launched and ended (None: still running), how, and its marks."""

    number: int
    launched: float
    ended: float | None = None
    stopped_by: str | None = None
    marks: tuple[Mark, ...] = ()


@dataclass
class Goodput:
    """A job's (or one span's) wall time split into productive time and badput buckets."""

    wall_s: float = 0.0
    productive_s: float = 0.0
    badput_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    new_updates: int = 0
    replayed_updates: int = 0
    reading: tuple[int, ...] = ()
    """attempts whose events file is still being read: nothing else is counted until then"""

    @property
    def goodput(self) -> float | None:
        """Productive share of the wall time (None before any time passed, or while read)."""
        if self.reading:
            return None
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    def add(self, bucket: str, seconds: float) -> None:
        """Count ``seconds`` (never negative) against ``bucket``."""
        self.badput_s[bucket] += max(0.0, seconds)

    def as_record(self) -> dict[str, Any]:
        """JSON-ready, rounded to the millisecond."""
        share = self.goodput
        return {
            "goodput": None if share is None else round(share, 4),
            "wall_s": round(self.wall_s, 3),
            "productive_s": round(self.productive_s, 3),
            "badput_s": {name: round(value, 3) for name, value in self.badput_s.items()},
            "new_updates": self.new_updates,
            "replayed_updates": self.replayed_updates,
            "reading": list(self.reading),
        }


def _attempt(trace: Trace, end: float, reached: int, out: Goodput) -> int:
    """Account one attempt from its launch to ``end``; returns the highest step reached."""
    marks = trace.marks
    started = next((m.time for m in marks if m.kind == "started"), None)
    restored = next((m.time for m in marks if m.kind == "restored"), None)
    ready = next((m.time for m in marks if m.kind == "ready"), None)
    if ready is None:  # never trained: all start-up (or a stall of the start-up)
        out.add("stall" if trace.stopped_by == "stall" else "startup", end - trace.launched)
        return reached
    restore = (restored - started) if restored is not None and started is not None else 0.0
    out.add("restore", restore)
    out.add("startup", ready - trace.launched - max(0.0, restore))
    last, held, high, completed, first = ready, 0.0, reached, False, True
    for mark in marks:
        if mark.time < ready or mark.time > end:
            continue
        if mark.kind == "checkpoint":
            held += mark.blocked_s
        elif mark.kind == "completed":
            completed = True
        elif mark.kind == "progress":
            span, blocked = mark.time - last, min(held, max(0.0, mark.time - last))
            out.add("checkpoint", blocked)
            net = max(0.0, span - blocked)
            if first:  # the attempt's first update: its compilation
                out.add("compile", net)
                net, first = 0.0, False
            if mark.step <= reached:
                out.add("replay", net)
                out.replayed_updates += 1
            else:
                out.productive_s += net
                out.new_updates += 1
            last, held, high = mark.time, 0.0, max(high, mark.step)
    tail = max(0.0, end - last)
    blocked = min(held, tail)
    out.add("checkpoint", blocked)
    if completed or trace.stopped_by in ("operator", "shutdown"):
        out.add("other", tail - blocked)
    else:
        out.add("stall" if trace.stopped_by == "stall" else "replay", tail - blocked)
    return high


def account(submitted: float, traces: Sequence[Trace], end: float, reached: int = 0) -> Goodput:
    """The goodput of a job submitted at ``submitted``, observed until ``end``.

    ``traces`` are its attempts in order; ``reached`` the highest step done
    before the first of them (for a span that starts mid-job).
    """
    out = Goodput(wall_s=max(0.0, end - submitted))
    previous_end = submitted
    for index, trace in enumerate(traces):
        out.add("queue" if index == 0 else "backoff", trace.launched - previous_end)
        stop = trace.ended if trace.ended is not None else end
        reached = _attempt(trace, min(stop, end), reached, out)
        previous_end = stop
    if traces and traces[-1].ended is not None:
        out.add("other", end - previous_end)
    elif not traces:
        out.add("queue", end - submitted)
    counted = out.productive_s + sum(out.badput_s.values())
    out.badput_s["other"] += max(0.0, out.wall_s - counted)
    return out


def failure_cost(traces: Sequence[Trace], failed: int) -> dict[str, float]:
    """What the failure of attempt ``failed`` cost, by bucket: from its last update to the
    first new update of a later attempt (``lost`` is its time after its last update)."""
    before = [t for t in traces if t.number < failed]
    failing = next((t for t in traces if t.number == failed), None)
    if failing is None or failing.ended is None:
        return {}
    reached = _reached(before)
    steps = [m for m in failing.marks if m.kind == "progress"]
    since = steps[-1].time if steps else failing.launched
    cost: dict[str, float] = {"lost": failing.ended - since}
    high = max([reached, *[m.step for m in steps]])
    previous_end = failing.ended
    for trace in (t for t in traces if t.number > failed):
        span = Goodput()
        span.add("backoff", trace.launched - previous_end)
        ends = [m for m in trace.marks if m.kind == "progress" and m.step > high]
        stop = ends[0].time if ends else trace.ended if trace.ended is not None else None
        if stop is None:
            break
        head = Trace(trace.number, trace.launched, stop, trace.stopped_by, trace.marks)
        _attempt(head, stop, high, span)
        for name, value in span.badput_s.items():
            if value:
                cost[name] = cost.get(name, 0.0) + value
        if ends:
            break
        previous_end = stop
    return {name: round(value, 3) for name, value in cost.items()}


def _reached(traces: Iterable[Trace]) -> int:
    return max([0, *[m.step for t in traces for m in t.marks if m.kind == "progress"]])


def marks_of(events: Iterable[Any]) -> tuple[Mark, ...]:
    """The accounting marks of parsed events (malformed lines are skipped)."""
    found = []
    for event in events:
        if not isinstance(event, Event) or event.kind not in KEPT:
            continue
        fields = event.fields
        step = fields.get("step", 0)
        blocked = fields.get("blocked_s", fields.get("seconds", 0.0))
        found.append(
            Mark(
                event.kind,
                float(fields.get("time", 0.0)),
                step if isinstance(step, int) else 0,
                float(blocked) if isinstance(blocked, (int, float)) else 0.0,
            )
        )
    return tuple(found)


MAX_CACHED = 4096
"""Attempt traces kept by `JobTraces` before it starts afresh."""


class JobTraces:
    """Reads a job's attempt folders into traces; a growing events file is read from where
    the last read stopped, and an attempt whose files did not change is not read again."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple[int, int, bool], int, Trace]] = {}

    def goodput(
        self, job_folder: Path, history: Sequence[Mapping[str, Any]], now: float
    ) -> Goodput:
        """The job's goodput so far (`job_goodput` of its folder's traces)."""
        return job_goodput(self.traces(job_folder), history, now)

    def traces(self, job_folder: Path) -> list[Trace]:
        """The job's attempts in order (an unreadable attempt folder is skipped)."""
        attempts = job_folder / ATTEMPTS
        try:
            numbers = sorted(int(p.name) for p in attempts.iterdir() if p.name.isdigit())
        except OSError:
            return []
        found = []
        for number in numbers:
            trace = self._trace(attempts / str(number), number)
            if trace is not None:
                found.append(trace)
        return found

    def _trace(self, folder: Path, number: int) -> Trace | None:
        events, exit_file = folder / EVENTS_FILE, folder / "exit.json"
        try:
            stat = events.stat()
            key = (stat.st_ino, stat.st_size, exit_file.exists())
            cached = self._cache.get(folder)
            if cached is not None and cached[0] == key:
                return cached[2]
            same_file = cached is not None and cached[0][0] == stat.st_ino
            offset, marks = (cached[1], cached[2].marks) if same_file and cached else (0, ())
            with events.open("rb") as stream:
                stream.seek(offset)
                data = stream.read(max(0, stat.st_size - offset))
        except OSError:
            return None
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
        lines = complete.decode("utf-8", errors="replace").splitlines()
        marks = (*marks, *marks_of(parse_lines(lines)))
        launched, ended, stopped = launch_and_end(folder, marks)
        trace = Trace(number, launched, ended, stopped, marks)
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[folder] = (key, offset + len(complete), trace)
        return trace


def launch_and_end(folder: Path, marks: Sequence[Mark]) -> tuple[float, float | None, str | None]:
    """From ``exit.json`` (ended, duration) when the attempt ended, else the folder's job file."""
    try:
        record: Mapping[str, Any] = json.loads((folder / "exit.json").read_text())
        ended, duration = float(record["ended"]), float(record["duration_s"])
        stopped = record.get("stopped_by")
        return ended - duration, ended, stopped if isinstance(stopped, str) else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        launched = (folder / JOB_FILE).stat().st_mtime
    except OSError:
        launched = marks[0].time if marks else 0.0
    return launched, None, None


def job_goodput(
    traces: Sequence[Trace], history: Sequence[Mapping[str, Any]], now: float
) -> Goodput:
    """A job's goodput from its traces and state history, observed until ``now`` (or its end)."""
    submitted = float(history[0]["time"]) if history else (traces[0].launched if traces else now)
    settled = {"completed", "failed", "escalated", "cancelled"}
    end = now
    if history and history[-1].get("to") in settled:
        end = float(history[-1]["time"])
    return account(submitted, traces, end)
