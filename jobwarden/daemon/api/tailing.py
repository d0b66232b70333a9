"""``tail`` and ``maintail``: the end of a job's lines, or of the daemon's log, from the end.

A job's tail interleaves its worker's stdout lines with the daemon's own
actions for it, in the order they happened (`jobwarden.daemon.api.joblines`);
a cursor in each answer lets ``-f`` read on from there.  ``worker`` and
``daemon`` choose the sources and ``kinds`` the event kinds (shell patterns);
``lines`` counts the lines kept.  ``stream: "stderr"`` gives
an attempt's ``stderr.log`` instead, which members of the control group
cannot read themselves.  The reads run in a thread; the loop only snapshots
the record first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwarden.daemon.api.arguments import int_arg, job_record
from jobwarden.daemon.api.joblines import (
    MAX_LINES,
    Choice,
    Snapshot,
    job_follow,
    job_tail,
    log_record,
)
from jobwarden.daemon.api.reading import last_lines, lines_from
from jobwarden.daemon.background import off_loop
from jobwarden.daemon.store import logs
from jobwarden.daemon.supervise.attempt import stdout_name
from jobwarden.protocol import MAX_INT, ControlError
from jobwarden.states import JobState

if TYPE_CHECKING:
    from jobwarden.daemon.view import View

DEFAULT_LINES = 20
MAX_KINDS = 32
LIVE = frozenset({JobState.STARTING, JobState.RUNNING, JobState.STALLED, JobState.RECOVERING})
"""States in which the newest attempt may still be writing its stdout."""


def stderr_tail(job: Snapshot, count: int, attempt: int | None) -> dict[str, Any]:
    """The last lines of an attempt's stderr.log (the newest attempt unless one is chosen)."""
    number = attempt or max(1, job.attempts)
    lines, end = last_lines(job.attempt_file(number, "stderr.log"), count, lambda _: True)
    return {
        "lines": [{"attempt": number, "line": r.decode(errors="replace")} for r, _ in lines],
        "cursor": {"attempt": number, "offset": end, "log": 0, "incidents": 0},
    }


def stderr_follow(job: Snapshot, cursor: dict[str, int], attempt: int | None) -> dict[str, Any]:
    """stderr.log lines after ``cursor``, moving on to later attempts unless one is chosen."""
    number, offset = cursor["attempt"], cursor["offset"]
    found = []
    while True:
        lines, offset = lines_from(job.attempt_file(number, "stderr.log"), offset)
        found += [{"attempt": number, "line": r.decode(errors="replace")} for r, _ in lines]
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
    return {"records": [log_record(raw) for raw, _ in lines], "cursor": end}


def cursor_arg(args: dict[str, Any]) -> dict[str, int] | None:
    """A follow-up's cursor; raises control.bad_request for a malformed one."""
    cursor = args.get("cursor")
    if cursor is None:
        return None
    if not isinstance(cursor, dict):
        raise ControlError("control.bad_request", "cursor must be an object from a tail answer")
    fields = ("attempt", "offset", "log", "incidents")
    return {name: int_arg(cursor, name, 1 if name == "attempt" else 0, 0) for name in fields}


def choice_arg(args: dict[str, Any]) -> Choice:
    """The lines asked for; raises control.bad_request for a malformed choice."""
    worker, daemon, kinds = (
        args.get("worker", True),
        args.get("daemon", True),
        args.get("kinds", []),
    )
    if not isinstance(worker, bool) or not isinstance(daemon, bool) or not (worker or daemon):
        raise ControlError("control.bad_request", "worker and daemon are bools, not both false")
    if (
        not isinstance(kinds, list)
        or len(kinds) > MAX_KINDS
        or not all(isinstance(k, str) and 0 < len(k) <= 200 for k in kinds)
    ):
        raise ControlError(
            "control.bad_request", f"kinds is a list of at most {MAX_KINDS} event names"
        )
    return Choice(worker, daemon, tuple(kinds))


async def tail(daemon: View, args: dict[str, Any]) -> Any:
    """tail job [lines attempt stream worker daemon kinds cursor]: the end of a job's lines,
    or more."""
    record = job_record(daemon, args)
    count = int_arg(args, "lines", DEFAULT_LINES, 1, MAX_LINES)
    attempt = int_arg(args, "attempt", 0, 0) or None
    stream = args.get("stream", "events")
    if stream not in ("events", "stderr"):
        raise ControlError("control.bad_request", 'stream is "events" or "stderr"')
    choice = choice_arg(args)
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
        live=record.state in LIVE,
        horizon=time.time(),
        written=logs.written() if stream == "events" and choice.daemon else None,
    )
    if stream == "stderr" and cursor is None:
        answer = await off_loop(stderr_tail, job, count, attempt)
    elif stream == "stderr" and cursor is not None:
        answer = await off_loop(stderr_follow, job, cursor, attempt)
    elif cursor is None:
        answer = await off_loop(job_tail, job, count, attempt, choice)
    else:
        answer = await off_loop(job_follow, job, cursor, attempt, choice)
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
