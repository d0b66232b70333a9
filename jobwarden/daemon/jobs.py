"""Job records: one per accepted job, persisted atomically at every transition.

`JobTable.transition` is the only way a job's state changes: it checks the
transition table, records the reason, persists ``jobs/<id>/state.json`` with
fsync, and logs the transition as a structlog event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.layout import Root
from jobwarden.files import write_text_atomic
from jobwarden.jobfile import Job, job_from_mapping
from jobwarden.states import JobState, check_transition

log = structlog.get_logger("wardend.jobs")


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
        record["steps"] = self.job.run.steps
        record["task"] = self.job.task
        return record


class JobTable:
    """Every job of the root, keyed by id; owned by the daemon's loop."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.records: dict[str, JobRecord] = {}

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(self.records.values())

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.records

    def get(self, job_id: str) -> JobRecord | None:
        """The record of ``job_id``, if known."""
        return self.records.get(job_id)

    def add(self, job: Job) -> JobRecord:
        """Register a newly accepted job in state queued and persist it."""
        record = JobRecord(id=job.id, job=job)
        record.history.append(
            {"to": record.state.value, "reason": record.reason, "time": record.submitted}
        )
        self.records[job.id] = record
        self.save(record)
        log.info("job.queued", job=job.id, task=job.task, checkpoint=job.checkpoint)
        return record

    def save(self, record: JobRecord) -> None:
        """Persist ``record`` atomically."""
        record.updated = time.time()
        write_text_atomic(
            self.root.job(record.id) / "state.json",
            json.dumps(record.as_record(), indent=2, default=str) + "\n",
        )

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
            source=source.value,
            target=target.value,
            reason=reason,
            attempt=record.attempt,
            **fields,
        )

    def load(self) -> list[JobRecord]:
        """Read every persisted job (at daemon start); returns them in submission order."""
        loaded = []
        for folder in sorted(self.root.jobs.iterdir()) if self.root.jobs.is_dir() else []:
            state_file, job_file = folder / "state.json", folder / "job.json"
            if not state_file.is_file() or not job_file.is_file():
                continue
            saved = json.loads(state_file.read_text())
            job = job_from_mapping(json.loads(job_file.read_text()), str(job_file))
            record = JobRecord(id=job.id, job=job)
            for name in (
                "reason",
                "submitted",
                "updated",
                "attempt",
                "restarts",
                "pid",
                "pid_started",
                "attempt_started",
                "step",
                "last_progress",
                "newest_checkpoint_step",
                "incidents",
                "replayed_updates",
                "time_lost_s",
                "resume_on_start",
                "history",
            ):
                if name in saved:
                    setattr(record, name, saved[name])
            record.state = JobState(saved["state"])
            self.records[job.id] = record
            loaded.append(record)
        return sorted(loaded, key=lambda r: r.submitted)


def request_path(folder: Path) -> Path | None:
    """The original request file kept in a job folder."""
    found = sorted(folder.glob("request.*"))
    return found[0] if found else None
