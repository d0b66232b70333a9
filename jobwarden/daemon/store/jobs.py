"""Job records: one per accepted job, persisted atomically at every transition.

`JobTable.transition` is the only way a job's state changes: it checks the
transition table, records the reason, persists ``jobs/<id>/state.json`` with
fsync, and logs the transition as a structlog event.

A job folder appears whole or not at all: `create_folder` builds it as a
staging sibling (the request as taken, ``job.json``, ``state.json``, each
fsynced, and the staging folder: `jobwarden.daemon.store.staging`), renames
it into place and fsyncs ``jobs/``; only then may the request leave the
spool.  `JobTable.load` discards staging folders (their request is still in
the spool) and completes any half-made folder an older daemon left from the
request it kept, or returns that request to the spool.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.store.evidence import describe
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.store.programrun import run_value
from jobwarden.daemon.store.staging import write_new_files
from jobwarden.files import (
    PENDING_SUFFIX,
    UnsafePathError,
    fsync_dir,
    kind_of,
    write_text_atomic,
)
from jobwarden.jobfile import Job, format_of, job_from_bytes, job_from_mapping
from jobwarden.states import JobState, check_transition

log = structlog.get_logger("wardend.jobs")

STAGING_PREFIX = "+intake-"
"""A job folder being built; ``+`` is never in a job id, so no job folder is named so."""


@dataclass
class JobRecord:
    """What the daemon knows about one job; everything but ``job`` is persisted."""

    id: str
    job: Job
    state: JobState = JobState.QUEUED
    reason: str = "submitted"
    submitted: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    attempt: int = 0
    restarts: int = 0
    # The restart budget's counters (daemon/supervise/budget.py): restarts in a row without
    # progress, the failures' times within the window, the attempts of that streak.
    restarts_without_progress: int = 0
    failure_times: list[float] = field(default_factory=list)
    no_progress: list[dict[str, Any]] = field(default_factory=list)
    diverged: dict[str, Any] | None = None
    """Where a replay first differed and the job went on (``on_mismatch = "continue"``)."""
    pid: int | None = None
    pid_started: float | None = None
    attempt_started: float | None = None
    step: int = 0
    last_progress: float | None = None
    newest_checkpoint_step: int | None = None
    incidents: list[str] = field(default_factory=list)
    replayed_updates: int = 0
    time_lost_s: float = 0.0
    resume_on_start: bool = False
    sample: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    claim: str | None = None
    """The spool/claimed file name the request was taken from (unique to that intake)."""
    request_name: str | None = None
    """The name the request arrived under in spool/incoming."""
    error: str | None = None
    """Why the daemon refused to go on with the job (an unsafe path), when it did."""
    program_run: dict[str, int] | None = None
    """The ``steps`` and ``checkpoint_every`` the program reported in its ``started`` event."""

    def run_setting(self, name: str) -> int | None:
        """``steps`` or ``checkpoint_every`` of the job's run (`run_value`); None if unknown."""
        return run_value(self.job, self.program_run, name)

    @property
    def checkpoint(self) -> str:
        """The checkpoint name this job writes."""
        return self.job.checkpoint

    def as_record(self) -> dict[str, Any]:
        """The persisted form (the request lives beside it in job.json)."""
        record = asdict(self)
        record.pop("job")
        record["state"] = self.state.value
        record["checkpoint"] = self.checkpoint
        record["steps"] = self.run_setting("steps")
        record["task"] = self.job.task
        return record


LOADED_APART = frozenset({"id", "job", "state", "sample"})
"""Fields not read back from state.json as saved: the id and request are the folder's,
the state is checked, and a sample is of a process that is gone."""
PERSISTED = tuple(f.name for f in fields(JobRecord) if f.name not in LOADED_APART)


class JobTable:
    """Every job of the root, keyed by id; owned by the daemon's loop."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.records: dict[str, JobRecord] = {}
        self.unsaved: set[str] = set()
        self.version = 0
        """Counts the changes of the table: a record saved, added or dropped (`StatusRows`)."""
        self.listeners: list[Callable[[JobRecord, JobState | None, str], None]] = []
        """Called after each transition (and on adoption, from None) with the source and reason."""

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(self.records.values())

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.records

    def get(self, job_id: str) -> JobRecord | None:
        """The record of ``job_id``, if known."""
        return self.records.get(job_id)

    def drop(self, job_id: str) -> JobRecord | None:
        """Forget a job whose folder has left ``jobs/`` (archived): its id is free again."""
        self.unsaved.discard(job_id)
        self.version += 1
        return self.records.pop(job_id, None)

    def add(self, job: Job) -> JobRecord:
        """Register a newly accepted job in state queued and persist it (its folder exists)."""
        record = new_record(job)
        self.records[job.id] = record
        self.save(record)
        log.info("job.queued", job=job.id, task=job.task, checkpoint=job.checkpoint)
        return record

    def adopt(self, record: JobRecord) -> JobRecord:
        """Register a job whose folder `create_folder` has just made durable (its record as
        saved, held in memory: nothing is read back)."""
        self.records[record.id] = record
        self.version += 1
        log.info("job.queued", job=record.id, task=record.job.task, checkpoint=record.checkpoint)
        for listener in self.listeners:
            listener(record, None, record.reason)
        return record

    def save(self, record: JobRecord) -> None:
        """Persist ``record`` atomically.

        An I/O error (a full, failing or read-only disk) is logged, never raised:
        the record stays right in memory, is kept in `unsaved`, and `retry`
        persists it once the disk takes bytes again.  A transition therefore
        always completes, and the job's supervision goes on.
        """
        record.updated = time.time()
        self.version += 1
        try:
            write_text_atomic(self.root.job(record.id) / "state.json", state_text(record))
        except OSError as error:
            if record.id not in self.unsaved:
                log.error("job.save_failed", job=record.id, error=describe(error))
            self.unsaved.add(record.id)
        else:
            if self.unsaved:
                self.unsaved.discard(record.id)

    def retry(self) -> None:
        """Persist again each record whose last save failed."""
        for job_id in sorted(self.unsaved):
            record = self.records.get(job_id)
            if record is None:
                self.unsaved.discard(job_id)
                continue
            self.save(record)
            if job_id not in self.unsaved:
                log.info("job.saved_after_failure", job=job_id)

    def transition(self, record: JobRecord, target: JobState, reason: str, **fields: Any) -> None:
        """Move ``record`` to ``target``: check the table, persist, log.

        Raises `IllegalTransition` for an edge the table does not have.
        """
        source = record.state
        check_transition(record.id, source, target)
        record.state, record.reason = target, reason
        record.history.append(
            {
                "from": source.value,
                "to": target.value,
                "reason": reason,
                "time": time.time(),
                **fields,
            }
        )
        self.save(record)
        log.info(
            "job.transition",
            job=record.id,
            **{"from": source.value, "to": target.value},
            reason=reason,
            attempt=record.attempt,
            **fields,
        )
        for listener in self.listeners:
            listener(record, source, reason)

    def load(self) -> list[JobRecord]:
        """Read every persisted job (at daemon start); returns them in submission order.

        Staging folders are discarded and half-made folders completed or given
        back to the spool (`complete_folder`); a folder that cannot be read is
        logged and left as it is, and the daemon starts all the same.
        """
        loaded = []
        for folder in sorted(self.root.jobs.iterdir()) if self.root.jobs.is_dir() else []:
            try:
                if folder.name.startswith(STAGING_PREFIX):
                    shutil.rmtree(folder)
                    log.warning("job.staging_discarded", folder=str(folder))
                    continue
                record = complete_folder(self.root, folder)
            except Exception as error:  # one bad folder must not keep the daemon from starting
                log.error("job.unreadable", folder=str(folder), error=repr(error), exc_info=error)
                continue
            if record is not None:
                self.records[record.id] = record
                self.version += 1
                loaded.append(record)
        return sorted(loaded, key=lambda r: r.submitted)


def new_record(job: Job, reason: str = "submitted", **intake: Any) -> JobRecord:
    """A new job's record: queued, with its first history entry."""
    record = JobRecord(id=job.id, job=job, reason=reason, **intake)
    record.history.append({"to": record.state.value, "reason": reason, "time": record.submitted})
    return record


def state_text(record: JobRecord) -> str:
    """The text of ``state.json``."""
    return json.dumps(record.as_record(), indent=2, default=str) + "\n"


def read_folder(folder: Path) -> JobRecord:
    """The record persisted in a complete job folder."""
    saved = json.loads((folder / "state.json").read_text())
    job = job_from_mapping(json.loads((folder / "job.json").read_text()), str(folder / "job.json"))
    record = JobRecord(id=job.id, job=job)
    for name in PERSISTED:
        if name in saved:
            setattr(record, name, saved[name])
    record.state = JobState(saved["state"])
    return record


def create_folder(
    root: Root, job: Job, request: bytes, suffix: str, *, claim: str, request_name: str
) -> JobRecord:
    """Make ``jobs/<id>/`` durable in one step, holding the request as taken (our own copy);
    returns the record it saved.

    Raises OSError (the staging folder is left for the next attempt or start
    to discard) or FileExistsError if the job folder appeared meanwhile.
    """
    staging = root.jobs / f"{STAGING_PREFIX}{job.id}"
    if os.path.lexists(staging):
        found = os.lstat(staging).st_mode
        if not stat.S_ISDIR(found):  # planted: rmtree would refuse it at every rescan
            raise UnsafePathError(
                str(staging),
                f"is a {kind_of(found)}, not a staging folder of this daemon; left in place",
                found=kind_of(found),
            )
        shutil.rmtree(staging)
    staging.mkdir()
    record = new_record(job, claim=claim, request_name=request_name)
    files = {
        f"request{suffix}": request,
        "job.json": (json.dumps(job.to_record(), indent=2) + "\n").encode(),
        "state.json": state_text(record).encode(),
    }
    write_new_files(staging, files)  # each file and the staging folder fsynced
    target = root.job(job.id)
    if os.path.lexists(target):
        raise FileExistsError(f"job folder {target} appeared while {staging} was built")
    os.rename(staging, target)
    fsync_dir(root.jobs)
    return record


NOT_THERE = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
"""What a folder that is not this daemon's job folder raises when it is read."""


def holds_request(folder: Path, claimed: Path) -> bool:
    """Whether a job folder was made from this claimed file (a crash, or a failure to open a
    file, before its unlink).

    Raises any other OSError (EMFILE, EIO...): the answer is not known then, and a wrong
    "no" would reject the request as a duplicate of its own job.
    """
    try:
        saved = json.loads((folder / "state.json").read_text())
        if isinstance(saved, dict) and saved.get("claim") == claimed.name:
            return True
    except (*NOT_THERE, ValueError):
        pass
    # An older daemon kept the request by hard link: the same inode.
    mine = os.lstat(claimed)
    try:
        entries = list(folder.iterdir())
    except NOT_THERE:
        return False
    for request in (path for path in entries if path.name.startswith("request.")):
        theirs = os.lstat(request)
        if (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino):
            return True
    return False


def complete_folder(root: Root, folder: Path) -> JobRecord | None:
    """The record of a job folder, completing a half-made one first.

    A folder an older daemon left without ``job.json`` or ``state.json`` is
    completed from the request it kept; a folder without its request (the
    request is still in spool/claimed) is removed if it holds nothing else; a
    kept request that no longer validates is returned to spool/incoming, where
    it will be rejected with its error file.  Returns None when no job remains.
    """
    state_file, job_file = folder / "state.json", folder / "job.json"
    if state_file.is_file() and job_file.is_file():
        return read_folder(folder)
    request = request_path(folder)
    if request is None:
        leftovers = list(folder.iterdir())
        if all(path.name.endswith(PENDING_SUFFIX) for path in leftovers):
            for path in leftovers:
                path.unlink()
            folder.rmdir()
            log.warning("job.incomplete_removed", folder=str(folder), removed=len(leftovers))
        else:
            log.error("job.incomplete", folder=str(folder), found=sorted(p.name for p in leftovers))
        return None
    try:
        job = job_from_bytes(request.read_bytes(), str(request), format_of(request))
    except Exception as error:  # the request is given back to the spool with its problem
        log.error("job.request_unusable", folder=str(folder), error=repr(error), exc_info=error)
        job = None
    if job is None or job.id != folder.name:
        _return_to_spool(root, folder, request)
        return None
    if not job_file.is_file():
        write_text_atomic(job_file, json.dumps(job.to_record(), indent=2) + "\n")
    if not state_file.is_file():
        reason = "submitted (intake completed at daemon start)"
        write_text_atomic(state_file, state_text(new_record(job, reason)))
    log.warning("job.intake_completed", job=job.id, folder=str(folder))
    return read_folder(folder)


def _return_to_spool(root: Root, folder: Path, request: Path) -> None:
    target = root.incoming / f"returned-{time.time_ns()}-{folder.name}{request.suffix}"
    os.rename(request, target)
    for path in list(folder.iterdir()):
        if path.name == "job.json" or path.name.endswith(PENDING_SUFFIX):
            path.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()
    log.warning("job.request_returned", folder=str(folder), to=str(target))


def request_path(folder: Path) -> Path | None:
    """The original request file kept in a job folder."""
    found = sorted(folder.glob("request.*"))
    return found[0] if found else None
