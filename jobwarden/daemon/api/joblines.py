"""A job's lines in one time order: its worker's stdout and the daemon's own actions for it.

A job's tail interleaves, by time, its worker's stdout lines (every attempt,
newest last) with the daemon's own actions for it: its records in
``wardend.log`` (transitions, stalls, exits with their signal, stops) and its
incident records (detected, restart scheduled, verified, escalated).  One
clock orders them all, the daemon's: a stdout line is placed at the time the
daemon read it (``read``, from the stamps kept beside the file,
`jobwarden.daemon.store.stamps`), a record at the time it was logged.  So the
transition a ``ready`` line causes comes after that line and before the next.
An answer holds only what happened before the request (`Snapshot.horizon`):
each source is cut at that moment, once ``wardend.log`` has been written up
to it, and the cursor points at the first line left out, so that a later
answer never holds a line that happened before one already given.  A
`Choice` keeps the worker's lines, the daemon's or both, of some event kinds;
a tail's count is of the lines it keeps.  Everything here runs in a thread.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.daemon.api.reading import Line, last_lines, lines_from
from jobwarden.daemon.store.stamps import has_stamps, read_stamps
from jobwarden.daemon.supervise.attempt import output_entry
from jobwarden.decoding import loads_json
from jobwarden.jobfolder import attempt_folder

LOG_WAIT_S = 1.0
"""How long a tail waits for ``wardend.log`` to catch up with the request, at most."""
MAX_LINES = 10_000
INCIDENT_FIELDS = ("incident", "kind", "status", "attempt", "event")

Item = dict[str, Any]
Entry = tuple[Item, int]
"""A line as the answer gives it, and the offset its line starts at in its file."""


def parse_event(raw: bytes, emits_events: bool) -> dict[str, Any]:
    """One stdout line: an event, a malformed line kept as evidence, or a plain program's."""
    if not emits_events:
        return output_entry(raw)
    try:
        event = loads_json(raw)
    except ValueError as error:
        return {"event": "malformed", "line": raw.decode(errors="replace"), "reason": str(error)}
    if not isinstance(event, dict):
        return {"event": "malformed", "line": raw.decode(errors="replace")}
    return event


def epoch(stamp: Any) -> float | None:
    """Seconds since the epoch of an ISO 8601 timestamp, or None."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def log_record(raw: bytes) -> dict[str, Any]:
    """One line of ``wardend.log`` as a record (a line that is not one is kept as text)."""
    try:
        record = loads_json(raw)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return {"event": "malformed", "line": raw.decode(errors="replace")}
    record.setdefault("time", epoch(record.get("timestamp")))
    return record


def when(item: Item) -> float | None:
    """The time a line is placed at: when the daemon read it, else its own time."""
    moment = item.get("read", item.get("time"))
    return moment if isinstance(moment, int | float) and not isinstance(moment, bool) else None


@dataclass(frozen=True)
class Choice:
    """Which lines a tail gives: its sources, and the event kinds (shell patterns)."""

    worker: bool = True
    daemon: bool = True
    kinds: tuple[str, ...] = ()

    def wants(self, item: Item) -> bool:
        """Whether ``item`` is of a kind asked for (every line is, when none were)."""
        kind = str(item.get("event", ""))
        return not self.kinds or any(fnmatch.fnmatchcase(kind, k) for k in self.kinds)


@dataclass(frozen=True)
class Snapshot:
    """What a tail needs of a job, taken on the loop."""

    id: str
    folder: Path
    log: Path
    attempts: int
    submitted: float
    emits_events: bool
    stdout: str
    live: bool = False
    """Whether its newest attempt may still be writing (its stamps a moment behind)."""
    horizon: float = math.inf
    """The moment of the request: an answer holds what happened until then."""
    written: threading.Event | None = None
    """Set once ``wardend.log`` holds every record logged before the request."""

    def attempt_file(self, attempt: int, name: str) -> Path:
        """A file of one attempt's folder."""
        return attempt_folder(self.folder, attempt) / name

    def is_mine(self, raw: bytes) -> bool:
        """Whether a daemon log line is about this job (cheap test first, then exact)."""
        if f'"job": {json.dumps(self.id)}'.encode() not in raw:
            return False
        record = log_record(raw)
        return (
            record.get("job") == self.id
            and not str(record.get("event", "")).startswith("incident.")  # the incident's own
            and (record["time"] or 0) >= self.submitted - 1
        )

    def wait_for_log(self) -> None:
        """Let ``wardend.log`` catch up with the request (for at most `LOG_WAIT_S`)."""
        if self.written is not None:
            self.written.wait(LOG_WAIT_S)

    def worker_entries(self, number: int, lines: list[Line]) -> list[Entry]:
        """Stdout lines of one attempt as answer lines, each with the time it was read."""
        path = self.attempt_file(number, self.stdout)
        stamps = read_stamps(path, [after for _, after in lines])
        unstamped = math.inf if self.live and number == self.attempts else None
        if unstamped is not None and not has_stamps(path):
            unstamped = None  # a file from before stamps were kept: its lines' own times
        entries = []
        for raw, after in lines:
            item = {"attempt": number, **parse_event(raw, self.emits_events)}
            read = stamps.get(after, unstamped)  # a line not yet stamped waits for its stamp
            if read is not None:
                item["read"] = read
            entries.append((item, after - len(raw) - 1))
        return entries


def cut(entries: list[Entry], horizon: float, end: int) -> tuple[list[Item], int]:
    """One source's lines up to the first placed after ``horizon``, and the offset a
    follow-up reads on from (that line's start, else ``end``)."""
    for index, (item, start) in enumerate(entries):
        moment = when(item)
        if moment is not None and moment > horizon:
            return [line for line, _ in entries[:index]], start
    return [line for line, _ in entries], end


def worker_tail(
    job: Snapshot, count: int, attempt: int | None, choice: Choice
) -> tuple[list[Item], int]:
    """The last ``count`` stdout lines chosen (of one attempt, or across all), and the
    offset a follow-up reads on from."""
    items: list[Item] = []
    offset = 0
    numbers = [attempt] if attempt else list(range(job.attempts, 0, -1))
    for number in numbers:
        path = job.attempt_file(number, job.stdout)
        lines, end = last_lines(
            path, count - len(items), lambda r: choice.wants(parse_event(r, job.emits_events))
        )
        entries = job.worker_entries(number, lines)
        found = [item for item, _ in entries]
        if number == numbers[0]:
            found, offset = cut(entries, job.horizon, end)
        items = found + items
        if len(items) >= count:
            break
    return items, offset


def daemon_entries(lines: list[Line]) -> list[Entry]:
    """Daemon log lines as records of the daemon's own actions."""
    return [
        ({**log_record(raw), "origin": "wardend"}, after - len(raw) - 1) for raw, after in lines
    ]


def incident_entries(lines: list[Line]) -> list[Entry]:
    """A job's incident record lines, cut to what a tail line shows."""
    found = []
    for raw, after in lines:
        record = log_record(raw)
        shown = {k: record[k] for k in INCIDENT_FIELDS if k in record}
        item = {**shown, "time": record["time"], "symptom": record.get("symptom")}
        if record.get("closed"):
            item["outcome"] = record.get("outcome")
        item["origin"] = "wardend"
        found.append((item, after - len(raw) - 1))
    return found


def merge(*streams: list[Item]) -> list[Item]:
    """Lines of several sources in time order; a line without a time keeps its place after
    the line before it in its own source."""
    keyed = []
    for rank, items in enumerate(streams):
        last = 0.0
        for index, item in enumerate(items):
            moment = when(item)
            last = moment if moment is not None else last
            keyed.append((last, rank, index, item))
    return [item for *_, item in sorted(keyed, key=lambda k: k[:3])]


def daemon_keep(job: Snapshot, attempt: int | None, choice: Choice) -> Callable[[bytes], bool]:
    """Which daemon log lines a tail of ``job`` gives."""

    def keep(raw: bytes) -> bool:
        if not job.is_mine(raw):
            return False
        record = log_record(raw)
        return (attempt is None or record.get("attempt") == attempt) and choice.wants(record)

    return keep


def incident_keep(attempt: int | None, choice: Choice) -> Callable[[bytes], bool]:
    """Which incident record lines a tail gives."""

    def keep(raw: bytes) -> bool:
        record = log_record(raw)
        return (attempt is None or record.get("attempt") == attempt) and choice.wants(record)

    return keep


def job_tail(job: Snapshot, count: int, attempt: int | None, choice: Choice) -> dict[str, Any]:
    """The end of a job's lines, and the cursor to follow from."""
    job.wait_for_log()
    worker: list[Item] = []
    ours: list[Item] = []
    offset = log_end = incidents_end = 0
    if choice.worker:
        worker, offset = worker_tail(job, count, attempt, choice)
    if choice.daemon:
        lines, end = last_lines(job.log, count, daemon_keep(job, attempt, choice))
        records, log_end = cut(daemon_entries(lines), job.horizon, end)
        incidents = job.folder / "incidents.jsonl"
        lines, end = last_lines(incidents, count, incident_keep(attempt, choice))
        found, incidents_end = cut(incident_entries(lines), job.horizon, end)
        ours = merge(records, found)
    cursor = {
        "attempt": attempt or max(1, job.attempts),
        "offset": offset,
        "log": log_end,
        "incidents": incidents_end,
    }
    return {"lines": merge(worker, ours)[-count:], "cursor": cursor}


def job_follow(
    job: Snapshot, cursor: dict[str, int], attempt: int | None, choice: Choice
) -> dict[str, Any]:
    """What a job wrote after ``cursor``, moving on to later attempts unless one is chosen."""
    job.wait_for_log()
    number, offset = cursor["attempt"], cursor["offset"]
    worker: list[Item] = []
    while choice.worker:
        lines, end = lines_from(job.attempt_file(number, job.stdout), offset)
        entries = [e for e in job.worker_entries(number, lines) if choice.wants(e[0])]
        found, offset = cut(entries, job.horizon, end)
        worker += found
        if offset < end or attempt is not None or number >= job.attempts:
            break
        if len(worker) >= MAX_LINES:
            break
        number, offset = number + 1, 0
    ours: list[Item] = []
    log_at, incidents_at = cursor["log"], cursor["incidents"]
    if choice.daemon:
        keep = daemon_keep(job, attempt, choice)
        lines, end = lines_from(job.log, log_at)
        records, log_at = cut(daemon_entries([r for r in lines if keep(r[0])]), job.horizon, end)
        keep = incident_keep(attempt, choice)
        lines, end = lines_from(job.folder / "incidents.jsonl", incidents_at)
        found, incidents_at = cut(
            incident_entries([r for r in lines if keep(r[0])]), job.horizon, end
        )
        ours = merge(records, found)
    cursor = {"attempt": number, "offset": offset, "log": log_at, "incidents": incidents_at}
    return {"lines": merge(worker, ours), "cursor": cursor}
