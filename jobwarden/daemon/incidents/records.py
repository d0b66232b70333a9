"""Incidents: a structured record and a runbook, written from the actual trace.

Each failure opens an incident.  Its record is a JSON line
appended to ``ROOT/incidents.jsonl`` and ``jobs/<id>/incidents.jsonl`` each
time it changes (opened, recovery point found, verified or escalated), and
its latest form is kept as ``jobs/<id>/incidents/<incident>.json`` beside the
Markdown runbook ``<incident>.md``.  Every one of these files is mode 0600 and
the ``incidents/`` folder 0700, whatever the umask; the record files are opened
without following a link.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from jobwarden.daemon.incidents.accounts import Accounts
from jobwarden.daemon.store.evidence import describe
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.store.rootcheck import PRIVATE_FILE, RootUnsafeError, open_private
from jobwarden.errors import IncidentKind
from jobwarden.events import iso_twin, step_ranges

if TYPE_CHECKING:
    from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.files import Directory, UnsafePathError

log = structlog.get_logger("wardend.incidents")


@dataclass
class Incident:
    """One failure of one job, from symptom to outcome."""

    id: str
    job: str
    kind: IncidentKind
    opened: float
    attempt: int
    symptom: str
    evidence: dict[str, str] = field(default_factory=dict)
    boundary: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    recovery_point: dict[str, Any] | None = None
    action: dict[str, Any] | None = None
    replayed_steps: list[int] = field(default_factory=list)
    verification: dict[str, Any] | None = None
    outcome: str = "open"
    status: str = "open"
    prevention: list[str] = field(default_factory=list)
    time_lost_s: float | None = None
    cost_s: dict[str, float] = field(default_factory=dict)
    """time_lost_s by cause (`jobwarden.daemon.incidents.goodput.failure_cost`)"""
    closed: float | None = None

    def as_record(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _step_list(steps: list[int]) -> str:
    shown = step_ranges(steps)
    return f"{shown} ({len(steps)} updates)" if len(steps) > 2 else shown


def render_runbook(incident: Incident) -> str:
    """The incident as an operator's runbook, every section from recorded facts."""
    when = datetime.datetime.fromtimestamp(incident.opened, datetime.UTC).isoformat(
        timespec="seconds"
    )
    out = [
        f"# Incident {incident.id}: {incident.kind} of job {incident.job}",
        "",
        f"Opened {when}; status **{incident.status}**.",
        "",
        "## Symptom",
        "",
        incident.symptom,
        "",
        "## Evidence preserved",
        "",
    ]
    out += [f"- {name}: `{path}`" for name, path in incident.evidence.items()]
    stack = incident.details.get("stack_dump")
    if stack:
        out += [
            "",
            "Stack dump of every worker thread, taken at detection:",
            "",
            "```",
            stack.strip(),
            "```",
        ]
    b = incident.boundary
    out += [
        "",
        "## Failure boundary",
        "",
        f"- last logged update: {b.get('last_logged_step', 0)}"
        + (f" (state hash `{b['last_logged_hash']}`)" if b.get("last_logged_hash") else ""),
        "- newest committed checkpoint: "
        + (
            f"step {b['checkpoint_step']} (`{b['checkpoint_file']}`)"
            if b.get("checkpoint_step") is not None
            else "none committed yet"
        ),
    ]
    out += ["", "## Recovery point", ""]
    rp = incident.recovery_point
    if rp is None:
        out.append("No recovery attempt has reported a recovery point.")
    elif rp.get("fresh"):
        out.append(
            "No checkpoint had been committed; the resumed attempt started from step 0 "
            "and replays every logged update."
        )
    else:
        out.append(
            f"Restored step {rp['step']} from `{rp['file']}` (checksum "
            f"`{rp.get('checksum', '-')}`"
            + (
                f", writer generation {rp['writer_generation']})."
                if rp.get("writer_generation") is not None
                else ")."
            )
        )
        out.append("It was valid because it passed every check: " + ", ".join(rp["checks"]) + ".")
        for skipped in rp.get("skipped", []):
            out.append(
                f"- passed over `{skipped['file']}`: {skipped['code']}: "
                f"{skipped['message']}; preserved at `{skipped['quarantined_to']}`"
            )
    out += ["", "## Action", ""]
    act = incident.action
    out.append("No action was taken." if act is None else act["text"])
    out += [
        "",
        "## Work replayed",
        "",
        (
            "No update was done again: the failure came right after the restored checkpoint"
            if not incident.replayed_steps
            else ("Update " if len(incident.replayed_steps) == 1 else "Updates ")
            + _step_list(incident.replayed_steps)
        )
        + (
            f"; time lost {incident.time_lost_s:.2f} s from the failed attempt's last "
            "progress to the first new update past it."
            if incident.time_lost_s
            else "."
        ),
    ]
    if incident.cost_s:
        causes = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in incident.cost_s.items())
        out += ["", f"Where that time went: {causes}."]
    out += ["", "## Verification", ""]
    ver = incident.verification
    if not ver or not ver.get("checks"):
        out.append(ver["text"] if ver else "Not verified yet.")
    else:
        boundary = [c for c in ver["checks"] if c["what"] != "update"]
        updates = [c for c in ver["checks"] if c["what"] == "update"]
        for check in boundary:
            out.append(
                f"Restored state at step {check['step']}: logged `{check['logged']}`, "
                f"restored `{check['found']}`: {'equal' if check['ok'] else 'DIFFERENT'}."
            )
        if updates:
            first, *rest = updates
            out.append(
                f"First replayed update, step {first['step']}: logged `{first['logged']}`,"
                f" replayed `{first['found']}`: {'equal' if first['ok'] else 'DIFFERENT'}."
            )
            if rest:
                bad = [c["step"] for c in rest if not c["ok"]]
                out.append(
                    f"Then updates {_step_list([c['step'] for c in rest])}: "
                    + (f"first difference at step {bad[0]}." if bad else "all equal.")
                )
        out.append("")
        out.append(ver["text"])
    out += ["", "## Outcome", "", incident.outcome, "", "## Prevention", ""]
    out += [f"- {line}" for line in incident.prevention] or ["- Nothing recorded."]
    return "\n".join(out) + "\n"


def from_record(record: dict[str, Any]) -> Incident:
    """An incident again, from the snapshot ``incidents/<id>.json`` kept of it."""
    known = {f.name for f in fields(Incident)}
    incident = Incident(**{k: v for k, v in record.items() if k in known})
    incident.kind = IncidentKind(incident.kind)
    return incident


class IncidentLog:
    """Writes incident records and runbooks for the daemon."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.kinds: Counter[str] = Counter()
        self._files: dict[Path, int] = {}
        self.unwritten: dict[str, Incident] = {}
        self.listeners: list[Callable[[Incident, str], None]] = []
        """Called with ``incident.opened`` or ``incident.concluded`` once it is written."""
        self.traces = Accounts()
        """The daemon's one keeper of attempt tallies (read on its loop by incidents, status
        and metrics), for goodput and each failure's cost."""

    def _append(self, path: Path, line: bytes) -> None:
        # Only the root's record stays open: one descriptor per job would grow with the table.
        fd = self._files.get(path)
        keep = path == self.root.incidents
        if fd is None:
            fd = open_private(path, os.O_WRONLY | os.O_APPEND)
            if keep:
                self._files[path] = fd
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            if not keep:
                os.close(fd)

    def folder(self, incident: Incident) -> Path:
        """The job's incidents folder."""
        return self.root.job(incident.job) / "incidents"

    def write(self, incident: Incident, event: str) -> None:
        """Append the record as ``event`` and refresh the snapshot and runbook.

        An I/O error (a full or failing disk) is logged, never raised: the
        incident is kept in `unwritten` and `retry` writes it once the disk
        takes bytes again, so a job's supervision never stops on its evidence.
        """
        if incident.time_lost_s is not None and not incident.cost_s:
            found = self.traces.failure_cost(self.root.jobs / incident.job, incident.attempt)
            incident.cost_s = found  # empty while an attempt is read: the next write retries
        try:
            self._write(incident, event)
        except OSError as error:
            self.unwritten[incident.id] = incident
            log.error(
                "incident.write_failed",
                job=incident.job,
                incident=incident.id,
                record=event,
                error=describe(error),
            )
        else:
            self.unwritten.pop(incident.id, None)

    def forget(self, job_id: str) -> None:
        """Drop what is still unwritten for a job whose folder has moved (archived)."""
        for key, incident in list(self.unwritten.items()):
            if incident.job == job_id:
                del self.unwritten[key]

    def retry(self) -> None:
        """Write again each incident whose last write failed."""
        for incident in list(self.unwritten.values()):
            self.write(incident, "incident.rewritten")

    def _write(self, incident: Incident, event: str) -> None:
        """Write every file of the record that can be written; then raise the first refusal
        (`UnsafePathError`, a link where a file or folder belongs), else the first OSError."""
        record = incident.as_record()
        now = time.time()
        line = {
            "incident": record.pop("id"),
            **record,
            "event": event,
            "time": now,
            "time_iso": iso_twin(now),
        }
        encoded = (json.dumps(line, default=str) + "\n").encode()
        snapshot = json.dumps(incident.as_record(), indent=2, default=str) + "\n"

        def files() -> None:
            with Directory.open(self.folder(incident), create=True, error=RootUnsafeError) as d:
                d.write_atomic(f"{incident.id}.json", snapshot.encode(), PRIVATE_FILE)
                d.write_atomic(f"{incident.id}.md", render_runbook(incident).encode(), PRIVATE_FILE)

        def logs(path: Path) -> Callable[[], None]:
            return lambda: self._append(path, encoded)

        failures: list[Exception] = []
        job_log = self.root.job(incident.job) / "incidents.jsonl"
        for write in (logs(self.root.incidents), logs(job_log), files):
            try:
                write()
            except (OSError, UnsafePathError) as error:
                failures.append(error)
        if failures:
            raise next((e for e in failures if isinstance(e, UnsafePathError)), failures[0])

    def open(self, record: JobRecord, incident: Incident, event: str) -> None:
        """Register a new incident with its job and count its kind, then write it."""
        record.incidents.append(incident.id)
        self.kinds[incident.kind] += 1
        self.write(incident, event)
        for listener in self.listeners:
            listener(incident, "incident.opened")

    def conclude(self, incident: Incident, status: str, outcome: str, event: str) -> None:
        """Give the incident its final status and outcome, stamp it closed, and write it."""
        incident.status, incident.outcome, incident.closed = status, outcome, time.time()
        self.write(incident, event)
        for listener in self.listeners:
            listener(incident, "incident.concluded")

    def runbook_path(self, incident: Incident) -> Path:
        """Where the incident's runbook is."""
        return self.folder(incident) / f"{incident.id}.md"

    def load(self, job_id: str) -> list[dict[str, Any]]:
        """The latest form of every incident of a job, oldest first (none through a link)."""
        folder = self.root.job(job_id) / "incidents"
        if folder.is_symlink() or not folder.is_dir():
            return []
        records = [json.loads(p.read_text()) for p in folder.glob("*.json")]
        return sorted(records, key=lambda r: r["opened"])

    def carry_over(self, record: JobRecord) -> list[Incident]:
        """At daemon start: count the kinds of the job's kept incidents, register any its
        record missed (a kill between the incident's write and the record's save: numbers
        are never reused), and return those a killed daemon left open."""
        kept = self.load(record.id)
        self.kinds.update(incident["kind"] for incident in kept)
        record.incidents += [i["id"] for i in kept if i["id"] not in record.incidents]
        return [from_record(i) for i in kept if i.get("status") == "open"]

    def interrupt(self, incidents: list[Incident], why: str) -> None:
        """Conclude incidents a killed daemon left open: status ``interrupted``, with ``why``."""
        text = f"The daemon was killed before this incident was settled; {why}."
        for incident in incidents:
            try:
                self.conclude(incident, "interrupted", text, "incident.interrupted")
            except UnsafePathError as error:
                log.error("incident.refused", incident=incident.id, error=error.message)

    def close(self) -> None:
        """Close the open record files and stop the goodput reads under way."""
        self.traces.close()
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()
