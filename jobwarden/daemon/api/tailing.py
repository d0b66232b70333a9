"""``tail`` and ``maintail``: the end of a job's lines, or of the daemon's log, from the end.

A file is read backwards from its end in blocks (`last_lines`) until enough
lines are found or a byte budget is spent, so the answer costs the lines
asked for, not the file.  A job's tail interleaves, by time, its worker's
event lines (every attempt, newest last) with the daemon's own actions for
it: its records in ``wardend.log`` (transitions, stalls, exits with their
signal, stops) and its incident records (detected, restart scheduled,
verified, escalated).  A cursor in each answer lets ``-f`` read on from
there.  ``stream: "stderr"`` gives an attempt's ``stderr.log`` instead,
which members of the control group cannot read themselves.  The reads run
in a thread; the loop only snapshots the record first.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from jobwarden.daemon.api.arguments import int_arg, job_record
from jobwarden.daemon.background import off_loop
from jobwarden.daemon.supervise.attempt import output_entry, stdout_name
from jobwarden.decoding import loads_json
from jobwarden.jobfolder import attempt_folder
from jobwarden.protocol import MAX_INT, ControlError

if TYPE_CHECKING:
    from jobwarden.daemon.view import View

BLOCK = 64 << 10
SCAN_BYTES = 64 << 20
"""How far back from the end a tail looks at most, per file."""
FORWARD_BYTES = 4 << 20
"""How much a follow-up request reads on from its cursor, per file."""
MAX_LINES = 10_000
DEFAULT_LINES = 20
INCIDENT_FIELDS = ("incident", "kind", "status", "attempt", "event")


def complete_end(stream: IO[bytes], size: int) -> int:
    """The offset just past the last newline of a file of ``size`` bytes (0 if none)."""
    pos = size
    while pos > 0 and size - pos < SCAN_BYTES:
        start = max(0, pos - BLOCK)
        stream.seek(start)
        block = stream.read(pos - start)
        found = block.rfind(b"\n")
        if found >= 0:
            return start + found + 1
        pos = start
    return 0


def reverse_lines(stream: IO[bytes], end: int) -> Iterator[bytes]:
    """The complete lines before ``end``, newest first, within `SCAN_BYTES` of it."""
    pos, head = end, b""
    while pos > 0 and end - pos < SCAN_BYTES:
        start = max(0, pos - BLOCK)
        stream.seek(start)
        lines = (stream.read(pos - start) + head).split(b"\n")
        head = lines.pop(0)  # the start of a line whose beginning is further back
        pos = start
        yield from reversed(lines)
    if pos == 0 and head:
        yield head


def last_lines(
    path: Path, count: int, keep: Callable[[bytes], bool] = bool
) -> tuple[list[bytes], int]:
    """The last ``count`` complete lines of ``path`` that ``keep`` accepts, oldest first, and
    the offset after them (where a follow-up reads on); nothing for a missing file."""
    try:
        stream = path.open("rb")
    except FileNotFoundError:
        return [], 0
    with stream:
        end = complete_end(stream, stream.seek(0, 2))
        found: list[bytes] = []
        for line in reverse_lines(stream, end):
            if len(found) >= count:
                break
            if line.strip() and keep(line):
                found.append(line)
    return found[::-1], end


def lines_from(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The complete lines of ``path`` from ``offset`` on (up to `FORWARD_BYTES`) and the
    offset after them; a file shorter than ``offset`` (replaced) is read from its start."""
    try:
        stream = path.open("rb")
    except FileNotFoundError:
        return [], offset
    with stream:
        if stream.seek(0, 2) < offset:
            offset = 0
        stream.seek(offset)
        data = stream.read(FORWARD_BYTES)
    complete = data[: data.rfind(b"\n") + 1]
    return [line for line in complete.split(b"\n") if line.strip()], offset + len(complete)


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


def worker_tail(job: Snapshot, count: int, attempt: int | None) -> tuple[list[dict[str, Any]], int]:
    """The last ``count`` stdout lines (of one attempt, or across all) and the end offset."""
    items: list[dict[str, Any]] = []
    offset = 0
    numbers = [attempt] if attempt else list(range(job.attempts, 0, -1))
    for number in numbers:
        lines, end = last_lines(job.attempt_file(number, job.stdout), count - len(items))
        if number == numbers[0]:
            offset = end
        items = [{"attempt": number, **parse_event(r, job.emits_events)} for r in lines] + items
        if len(items) >= count:
            break
    return items, offset


def daemon_records(lines: list[bytes], job: Snapshot, attempt: int | None) -> list[dict[str, Any]]:
    """Daemon log lines as records of the daemon's own actions."""
    found = []
    for raw in lines:
        record = log_record(raw)
        if attempt is None or record.get("attempt") == attempt:
            found.append({**record, "origin": "wardend"})
    return found


def incident_records(lines: list[bytes], attempt: int | None) -> list[dict[str, Any]]:
    """A job's incident record lines, cut to what a tail line shows."""
    found = []
    for raw in lines:
        record = log_record(raw)
        if attempt is not None and record.get("attempt") != attempt:
            continue
        shown = {k: record[k] for k in INCIDENT_FIELDS if k in record}
        text = record.get("outcome") if record.get("closed") else record.get("symptom")
        found.append({**shown, "time": record["time"], "text": text, "origin": "wardend"})
    return found


def merge(*streams: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lines of several sources in time order; a line without a time keeps its place after
    the line before it in its own source."""
    keyed = []
    for rank, items in enumerate(streams):
        last = 0.0
        for index, item in enumerate(items):
            when = item.get("time")
            last = when if isinstance(when, int | float) else last
            keyed.append((last, rank, index, item))
    return [item for *_, item in sorted(keyed, key=lambda k: k[:3])]


def job_tail(job: Snapshot, count: int, attempt: int | None, with_daemon: bool) -> dict[str, Any]:
    """The end of a job's lines, and the cursor to follow from."""
    worker, offset = worker_tail(job, count, attempt)
    ours: list[dict[str, Any]] = []
    log_end = incidents_end = 0
    if with_daemon:
        lines, log_end = last_lines(job.log, count, job.is_mine)
        found, incidents_end = last_lines(job.folder / "incidents.jsonl", count)
        ours = daemon_records(lines, job, attempt) + incident_records(found, attempt)
    cursor = {
        "attempt": attempt or max(1, job.attempts),
        "offset": offset,
        "log": log_end,
        "incidents": incidents_end,
    }
    return {"lines": merge(worker, ours)[-count:], "cursor": cursor}


def job_follow(
    job: Snapshot, cursor: dict[str, int], attempt: int | None, with_daemon: bool
) -> dict[str, Any]:
    """What a job wrote after ``cursor``, moving on to later attempts unless one is chosen."""
    number, offset = cursor["attempt"], cursor["offset"]
    worker: list[dict[str, Any]] = []
    while True:
        lines, offset = lines_from(job.attempt_file(number, job.stdout), offset)
        worker += [{"attempt": number, **parse_event(r, job.emits_events)} for r in lines]
        if attempt is not None or number >= job.attempts or len(worker) >= MAX_LINES:
            break
        number, offset = number + 1, 0
    ours: list[dict[str, Any]] = []
    log_at, incidents_at = cursor["log"], cursor["incidents"]
    if with_daemon:
        lines, log_at = lines_from(job.log, log_at)
        ours = daemon_records([r for r in lines if job.is_mine(r)], job, attempt)
        lines, incidents_at = lines_from(job.folder / "incidents.jsonl", incidents_at)
        ours += incident_records(lines, attempt)
    cursor = {"attempt": number, "offset": offset, "log": log_at, "incidents": incidents_at}
    return {"lines": merge(worker, ours), "cursor": cursor}


def stderr_tail(job: Snapshot, count: int, attempt: int | None) -> dict[str, Any]:
    """The last lines of an attempt's stderr.log (the newest attempt unless one is chosen)."""
    number = attempt or max(1, job.attempts)
    lines, end = last_lines(job.attempt_file(number, "stderr.log"), count, lambda _: True)
    return {
        "lines": [{"attempt": number, "line": r.decode(errors="replace")} for r in lines],
        "cursor": {"attempt": number, "offset": end, "log": 0, "incidents": 0},
    }


def stderr_follow(job: Snapshot, cursor: dict[str, int], attempt: int | None) -> dict[str, Any]:
    """stderr.log lines after ``cursor``, moving on to later attempts unless one is chosen."""
    number, offset = cursor["attempt"], cursor["offset"]
    found = []
    while True:
        lines, offset = lines_from(job.attempt_file(number, "stderr.log"), offset)
        found += [{"attempt": number, "line": r.decode(errors="replace")} for r in lines]
        if attempt is not None or number >= job.attempts:
            break
        number, offset = number + 1, 0
    return {"lines": found, "cursor": {**cursor, "attempt": number, "offset": offset}}


def main_tail(log: Path, count: int, cursor: int | None) -> dict[str, Any]:
    """The end of the daemon's log as records, or what follows ``cursor``."""
    if cursor is None:
        lines, end = last_lines(log, count)
    else:
        lines, end = lines_from(log, cursor)
    return {"records": [log_record(raw) for raw in lines], "cursor": end}


def cursor_arg(args: dict[str, Any]) -> dict[str, int] | None:
    """A follow-up's cursor; raises control.bad_request for a malformed one."""
    cursor = args.get("cursor")
    if cursor is None:
        return None
    if not isinstance(cursor, dict):
        raise ControlError("control.bad_request", "cursor must be an object from a tail answer")
    fields = ("attempt", "offset", "log", "incidents")
    return {name: int_arg(cursor, name, 1 if name == "attempt" else 0, 0) for name in fields}


async def tail(daemon: View, args: dict[str, Any]) -> Any:
    """tail job [lines attempt stream daemon cursor]: the end of a job's lines, or more."""
    record = job_record(daemon, args)
    count = int_arg(args, "lines", DEFAULT_LINES, 1, MAX_LINES)
    attempt = int_arg(args, "attempt", 0, 0) or None
    stream, with_daemon = args.get("stream", "events"), args.get("daemon", True)
    if stream not in ("events", "stderr") or not isinstance(with_daemon, bool):
        raise ControlError("control.bad_request", 'stream is "events" or "stderr"; daemon a bool')
    if attempt is not None and attempt > record.attempt:
        raise ControlError(
            "control.no_such_attempt", f"job {record.id} has {record.attempt} attempt(s)"
        )
    cursor = cursor_arg(args)
    job = Snapshot(
        record.id,
        daemon.root.job(record.id),
        daemon.root.log,
        record.attempt,
        record.submitted,
        record.job.emits_events,
        stdout_name(record.job),
    )
    if stream == "stderr" and cursor is None:
        answer = await off_loop(stderr_tail, job, count, attempt)
    elif stream == "stderr" and cursor is not None:
        answer = await off_loop(stderr_follow, job, cursor, attempt)
    elif cursor is None:
        answer = await off_loop(job_tail, job, count, attempt, with_daemon)
    else:
        answer = await off_loop(job_follow, job, cursor, attempt, with_daemon)
    return {**answer, "state": record.state.value, "attempts": record.attempt}


async def maintail(daemon: View, args: dict[str, Any]) -> Any:
    """maintail [lines cursor]: the end of the daemon's own log, or what follows the cursor."""
    count = int_arg(args, "lines", DEFAULT_LINES, 1, MAX_LINES)
    cursor = None if args.get("cursor") is None else int_arg(args, "cursor", 0, 0, MAX_INT)
    return await off_loop(main_tail, daemon.root.log, count, cursor)


def handlers(daemon: View) -> dict[str, Any]:
    """The requests this module answers."""
    return {
        "tail": lambda args: tail(daemon, args),
        "maintail": lambda args: maintail(daemon, args),
    }
