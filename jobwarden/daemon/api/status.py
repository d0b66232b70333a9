"""The ``status`` answer: the table column by column, totals, or one job in detail.

The table goes out as columns, one list per field the status table prints
(``TABLE_FIELDS``): a fifth of the bytes of one object per job, which a
client decodes in well under a millisecond with a thousand jobs known.
``rows`` asks for the full form instead, one object per job with every field
of `summary`, for scripts that want them all.  ``totals`` is always there:
jobs per state, those that need attention, and the requests the spool has
rejected.  ``status JOB`` looks the job up by id, so it costs the same
whatever the size of the table.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson

from jobwarden import __version__
from jobwarden.daemon.incidents import goodput
from jobwarden.daemon.store.jobs import JobRecord
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
        "step": record.step,
        "steps": record.job.run.steps,
        "task": record.job.task,
        "checkpoint": record.checkpoint,
        "last_progress_age_s": round(now - record.last_progress, 3)
        if record.last_progress
        else None,
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


def table_row(daemon: View, record: JobRecord, now: float) -> tuple[Any, ...]:
    """One job's values for ``TABLE_FIELDS``."""
    live = daemon.is_live(record.id)
    return (
        record.id,
        record.state.value,
        record.attempt,
        record.step,
        record.job.run.steps,
        record.newest_checkpoint_step,
        record.pid,
        record.sample.get("rss_mb") if live else None,
        round(now - record.attempt_started, 3) if live and record.attempt_started else None,
        round(now - record.last_progress, 3) if record.last_progress else None,
    )


class StatusRows:
    """The table values and encoded full rows of the jobs no supervisor holds, each kept
    until its record is saved.

    Such a record changes only through `JobTable.save`, which stamps
    ``updated``; only the age of its last progress is computed at each request
    (its uptime is null: nothing runs).  Rows of jobs a supervisor holds change
    with every event and sample, and are made afresh.  Entries of jobs no
    longer known (archived) are let go once they outnumber the table.
    """

    def __init__(self) -> None:
        self.cached: dict[str, tuple[float, str]] = {}
        self.kept: dict[str, tuple[float, tuple[Any, ...]]] = {}
        self.table_key: tuple[int, frozenset[str]] | None = None
        self.table_columns: list[list[Any]] = []
        self.progress: list[float | None] = []
        self.held: list[tuple[int, JobRecord]] = []

    def columns(self, daemon: View, now: float) -> list[list[Any]]:
        """The table's columns, in `TABLE_FIELDS` order.

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
            self.table_columns = [list(c) for c in zip(*values, strict=True)] or [
                [] for _ in TABLE_FIELDS
            ]
            self.progress = [record.last_progress or None for record in records]
            self.held = [(i, r) for i, r in enumerate(records) if r.id in daemon.supervisors]
            self.table_key = key
        columns = [list(column) for column in self.table_columns[:-1]]
        columns.append([None if t is None else round(now - t, 3) for t in self.progress])
        for index, record in self.held:
            for column, value in zip(columns, table_row(daemon, record, now), strict=True):
                column[index] = value
        return columns

    def values(self, daemon: View, record: JobRecord, now: float) -> tuple[Any, ...]:
        """One job's values for ``TABLE_FIELDS``."""
        if record.id in daemon.supervisors:
            return table_row(daemon, record, now)
        found = self.kept.get(record.id)
        if found is None or found[0] != record.updated:
            found = record.updated, table_row(daemon, record, now)[:-1]
            self.kept[record.id] = found
        age = round(now - record.last_progress, 3) if record.last_progress else None
        return (*found[1], age)

    def forget_unknown(self, daemon: View) -> None:
        """Drop the entries of jobs the table no longer holds, once they are many."""
        known = daemon.table.records
        for cache in (self.cached, self.kept):
            if len(cache) > 2 * len(known) + 100:
                for job_id in [j for j in cache if j not in known]:
                    del cache[job_id]

    def row(self, daemon: View, record: JobRecord, now: float) -> str:
        """One full status row as JSON text."""
        if record.id in daemon.supervisors:
            return json.dumps(summary(daemon, record, now), allow_nan=False)
        found = self.cached.get(record.id)
        if found is None or found[0] != record.updated:
            fields = summary(daemon, record, now)
            del fields["last_progress_age_s"], fields["uptime_s"]
            text = json.dumps(fields, allow_nan=False)[:-1] + ', "uptime_s": null'
            found = record.updated, text + ', "last_progress_age_s": '
            self.cached[record.id] = found
        if not record.last_progress:
            return found[1] + "null}"
        return f"{found[1]}{now - record.last_progress:.3f}}}"


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
            "goodput": goodput.TRACES.goodput(
                daemon.root.jobs / record.id, record.history, now
            ).as_record(),
            "members": record.sample.get("members") if daemon.is_live(record.id) else None,
            "history": record.history,
            "request": record.job.to_record(),
        }
    full = args.get("rows", False)
    if not isinstance(full, bool):
        raise ControlError("control.bad_request", f"rows must be a boolean, not {full!r:.40}")
    info = {"pid": os.getpid(), "version": __version__, "uptime_s": round(now - daemon.started, 3)}
    if full:
        rows = rows or StatusRows()
        rows.forget_unknown(daemon)
        table = ", ".join([rows.row(daemon, r, now) for r in daemon.table])
        counted = totals(daemon, [r.state.value for r in daemon.table])
        tail = json.dumps({"totals": counted, "daemon": daemon_info(info, counted)})[1:]
        return Encoded(f'{{"jobs": [{table}], {tail}'.encode())
    rows = rows or StatusRows()
    rows.forget_unknown(daemon)
    columns = rows.columns(daemon, now)
    counted = totals(daemon, columns[1])
    answer = {
        "columns": dict(zip(TABLE_FIELDS, columns, strict=True)),
        "totals": counted,
        "daemon": daemon_info(info, counted),
    }
    if any(isinstance(v, float) and not math.isfinite(v) for v in columns[7]):
        return answer  # a non-finite rss: the protocol's strict encoder refuses it, named
    # orjson: a tenth of json's time for the largest answer the daemon gives (ids, states,
    # integers and finite floats; the one float column that is not computed here is checked
    # above, since orjson would write NaN as null where the protocol refuses it).
    return Encoded(orjson.dumps(answer))


def daemon_info(info: dict[str, Any], counted: dict[str, Any]) -> dict[str, Any]:
    """The daemon's pid, version and uptime, with the count of jobs needing attention."""
    return {**info, "needs_attention": counted["needs_attention"]}
