"""The ``status`` answer: the table column by column, totals, or one job in detail.

The table goes out as columns, one list per field the status table prints
(``TABLE_FIELDS``): a fifth of the bytes of one object per job, which a
client decodes in well under a millisecond with a thousand jobs known.
``rows`` asks for the full form instead, one object per job with every field
of `summary`, for scripts that want them all.  ``totals`` is always there:
jobs per state, those that need attention, and the requests the spool has
rejected.  ``status JOB`` looks the job up by id, so it costs the same
whatever the size of the table.

Rows and columns are built by field name.  The columns are kept until the
table changes (`JobTable.version`), a settled job's row until its record is
saved; each answer is then encoded once, whole, by orjson.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from jobwarden import __version__
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.supervise.stall import phases_status
from jobwarden.jobfolder import ATTEMPTS, attempt_folder, members_of
from jobwarden.protocol import ControlError, Encoded
from jobwarden.states import NEEDS_ATTENTION

if TYPE_CHECKING:
    from jobwarden.daemon.view import View

ATTENTION = frozenset(state.value for state in NEEDS_ATTENTION)
TABLE_FIELDS = (
    "id",
    "state",
    "attempt",
    "step",
    "steps",
    "newest_checkpoint_step",
    "pid",
    "rss_mb",
    "uptime_s",
    "last_progress_age_s",
)
"""The columns of the plain ``status`` answer, in this order (the age, which changes with
every request, last)."""
AGE = "last_progress_age_s"
"""The one field of a kept row made afresh at every request."""


def summary(daemon: View, record: JobRecord, now: float) -> dict[str, Any]:
    """One job's full status row."""
    live = daemon.is_live(record.id)
    sample = record.sample if live else {}
    return {
        "id": record.id,
        "state": record.state.value,
        "reason": record.reason,
        "attempt": record.attempt,
        "restarts": record.restarts,
        "restarts_without_progress": record.restarts_without_progress,
        "failures_in_window": failures_in_window(record, now),
        "diverged_at_step": record.diverged["step"] if record.diverged else None,
        "step": step_of(record),
        "steps": record.run_setting("steps"),
        "checkpoint_every": record.run_setting("checkpoint_every"),
        "task": record.job.task,
        "checkpoint": record.checkpoint,
        "last_progress_age_s": progress_age(record, now),
        "newest_checkpoint_step": record.newest_checkpoint_step,
        "pid": record.pid,
        "rss_mb": sample.get("rss_mb"),
        "cpu_percent": sample.get("cpu_percent"),
        "process_status": sample.get("status"),
        "threads": sample.get("threads"),
        "uptime_s": round(now - record.attempt_started, 3)
        if live and record.attempt_started
        else None,
        "incidents": list(record.incidents),
        "replayed_updates": record.replayed_updates,
        "time_lost_s": round(record.time_lost_s, 3),
    }


def table_row(daemon: View, record: JobRecord, now: float) -> dict[str, Any]:
    """One job's values for ``TABLE_FIELDS``, by name and in that order."""
    live = daemon.is_live(record.id)
    return {
        "id": record.id,
        "state": record.state.value,
        "attempt": record.attempt,
        "step": step_of(record),
        "steps": record.run_setting("steps"),
        "newest_checkpoint_step": record.newest_checkpoint_step,
        "pid": record.pid,
        "rss_mb": record.sample.get("rss_mb") if live else None,
        "uptime_s": round(now - record.attempt_started, 3)
        if live and record.attempt_started
        else None,
        "last_progress_age_s": progress_age(record, now),
    }


def step_of(record: JobRecord) -> int | None:
    """The job's step; None for a plain program, which reports none."""
    return record.step if record.job.emits_events else None


def failures_in_window(record: JobRecord, now: float) -> int:
    """The job's failures within its ``restart_limit_window_s`` back from ``now``."""
    window = record.job.supervision.restart_limit_window_s
    return sum(1 for t in record.failure_times if now - t < window)


def progress_age(record: JobRecord, now: float) -> float | None:
    """Seconds since the job's last progress, to the millisecond; None before any."""
    return round(now - record.last_progress, 3) if record.last_progress else None


def members_now(daemon: View, record: JobRecord) -> list[dict[str, Any]] | None:
    """A multi-process job's members: those running, else how those of its newest attempt
    ended (``members.json``); None for a single process."""
    if daemon.is_live(record.id):
        found: list[dict[str, Any]] | None = record.sample.get("members")
        return found
    if not record.attempt:
        return None
    ended = members_of(attempt_folder(daemon.root.job(record.id), record.attempt))
    return ended.get("members") if ended else None


def phases_of(daemon: View, record: JobRecord) -> dict[str, Any]:
    """The phase the live attempt is in and each phase's durations and watch; with no
    attempt running, what the ended attempts showed."""
    supervisor = daemon.supervisors.get(record.id)
    attempt = supervisor.attempt if supervisor is not None else None
    watch = attempt.stall if attempt is not None else None
    return phases_status(watch, daemon.root.job(record.id) / ATTEMPTS, record.attempt)


def finite(values: Iterable[Any]) -> bool:
    """Whether every float among ``values`` is finite, as the protocol's strict JSON requires."""
    return all(math.isfinite(v) for v in values if isinstance(v, float))


class Kept(NamedTuple):
    """A settled job's row as it was when its record was last saved."""

    updated: float
    fields: dict[str, Any]


class StatusRows:
    """The table values and full rows of the jobs no supervisor holds, each kept until its
    record is saved, and the table's columns, kept until the table changes.

    Such a record changes only through `JobTable.save`, which stamps
    ``updated``; only the age of its last progress is computed at each request
    (its uptime is null: nothing runs).  Rows of jobs a supervisor holds change
    with every event and sample, and are made afresh.  Entries of jobs no
    longer known (archived) are let go once they outnumber the table.
    """

    def __init__(self) -> None:
        self.full: dict[str, Kept] = {}
        self.kept: dict[str, Kept] = {}
        self.table_key: tuple[int, frozenset[str]] | None = None
        self.table_columns: dict[str, list[Any]] = {}
        self.progress: list[float | None] = []
        self.held: list[tuple[int, JobRecord]] = []

    def columns(self, daemon: View, now: float) -> dict[str, list[Any]]:
        """The table's columns by field name, in `TABLE_FIELDS` order.

        Between two changes of the table (`JobTable.version`) and of the jobs
        supervisors hold, the columns are copied from the last answer's; only
        the ages of the last progress, and the rows of the held jobs, are made
        afresh.  With a thousand jobs known that is a tenth of the work of
        building every row.
        """
        key = (daemon.table.version, frozenset(daemon.supervisors))
        if key != self.table_key:
            records = list(daemon.table)
            values = [self.values(daemon, record, now) for record in records]
            self.table_columns = {name: [row[name] for row in values] for name in TABLE_FIELDS}
            self.progress = [record.last_progress or None for record in records]
            self.held = [(i, r) for i, r in enumerate(records) if r.id in daemon.supervisors]
            self.table_key = key
        ages = [None if t is None else round(now - t, 3) for t in self.progress]
        columns = {
            name: ages if name == AGE else list(self.table_columns[name]) for name in TABLE_FIELDS
        }
        for index, record in self.held:
            for name, value in table_row(daemon, record, now).items():
                columns[name][index] = value
        return columns

    def values(self, daemon: View, record: JobRecord, now: float) -> dict[str, Any]:
        """One job's values for ``TABLE_FIELDS``, by name."""
        if record.id in daemon.supervisors:
            return table_row(daemon, record, now)
        found = self.kept.get(record.id)
        if found is None or found.updated != record.updated:
            found = Kept(record.updated, table_row(daemon, record, now))
            self.kept[record.id] = found
        return {**found.fields, AGE: progress_age(record, now)}

    def forget_unknown(self, daemon: View) -> None:
        """Drop the entries of jobs the table no longer holds, once they are many."""
        known = daemon.table.records
        for cache in (self.full, self.kept):
            if len(cache) > 2 * len(known) + 100:
                for job_id in [j for j in cache if j not in known]:
                    del cache[job_id]

    def row(self, daemon: View, record: JobRecord, now: float) -> dict[str, Any]:
        """One full status row, by field name (`summary`'s)."""
        if record.id in daemon.supervisors:
            return summary(daemon, record, now)
        found = self.full.get(record.id)
        if found is None or found.updated != record.updated:
            fields = summary(daemon, record, now)
            del fields["uptime_s"], fields[AGE]  # last, as in every answer so far
            found = Kept(record.updated, {**fields, "uptime_s": None, AGE: None})
            self.full[record.id] = found
        row = found.fields.copy()
        if record.last_progress:
            row[AGE] = round(now - record.last_progress, 3)
        return row


def totals(daemon: View, states: list[str]) -> dict[str, Any]:
    """Jobs in all and per state, those needing attention, and the rejected requests."""
    per_state = Counter(states)
    return {
        "jobs": len(states),
        "states": dict(sorted(per_state.items())),
        "needs_attention": sum(n for state, n in per_state.items() if state in ATTENTION),
        "rejected": daemon.spool.rejected,
    }


def status(daemon: View, args: dict[str, Any], rows: StatusRows | None = None) -> Any:
    """status [job] [rows]: the table as columns (or full rows), or one job in detail."""
    now = time.time()
    if args.get("job") is not None:
        job_id = args["job"]
        record = daemon.table.get(job_id) if isinstance(job_id, str) else None
        if record is None:
            raise ControlError("control.no_such_job", f"no job {job_id!r:.80}")
        return {
            **summary(daemon, record, now),
            "goodput": daemon.incidents.traces.goodput(
                daemon.root.jobs / record.id, record.history, now
            ).as_record(),
            "members": members_now(daemon, record),
            "spare": record.sample.get("spare") if daemon.is_live(record.id) else None,
            "phases": phases_of(daemon, record),
            "history": record.history,
            "request": record.job.to_record(),
        }
    full = args.get("rows", False)
    if not isinstance(full, bool):
        raise ControlError("control.bad_request", f"rows must be a boolean, not {full!r:.40}")
    info = {"pid": os.getpid(), "version": __version__, "uptime_s": round(now - daemon.started, 3)}
    rows = rows or StatusRows()
    rows.forget_unknown(daemon)
    if full:
        jobs = [rows.row(daemon, record, now) for record in daemon.table]
        counted = totals(daemon, [job["state"] for job in jobs])
        answer = {"jobs": jobs, "totals": counted, "daemon": daemon_info(info, counted)}
        held = [job for job in jobs if job["id"] in daemon.supervisors]
        return encoded(answer, finite(value for job in held for value in job.values()))
    columns = rows.columns(daemon, now)
    counted = totals(daemon, columns["state"])
    answer = {"columns": columns, "totals": counted, "daemon": daemon_info(info, counted)}
    return encoded(answer, finite(columns["rss_mb"]))


def encoded(answer: dict[str, Any], strict_json: bool) -> Encoded | dict[str, Any]:
    """The answer encoded at once by orjson, a tenth of json's time for the largest answers
    the daemon gives; as it is when a float in it is not finite, for the protocol's strict
    encoder to refuse by name (orjson would write NaN as null).

    Only a held job's sample (rss, cpu) can hold such a float: every other float in the
    table is an age or a duration computed here, so the callers check the samples alone.
    """
    return Encoded(orjson.dumps(answer)) if strict_json else answer


def daemon_info(info: dict[str, Any], counted: dict[str, Any]) -> dict[str, Any]:
    """The daemon's pid, version and uptime, with the count of jobs needing attention."""
    return {**info, "needs_attention": counted["needs_attention"]}
