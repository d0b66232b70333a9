"""A live attempt of a job, as its supervisor sees it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.daemon.incidents import Incident
from jobwarden.daemon.jobs import JobRecord
from jobwarden.daemon.launcher import LaunchSpec, RunningAttempt
from jobwarden.daemon.layout import Root
from jobwarden.daemon.policy import AttemptReport, StopReason
from jobwarden.daemon.recovery import Verdict
from jobwarden.daemon.stall import StallWatch
from jobwarden.daemon.verification import ReplayVerifier
from jobwarden.events import Event
from jobwarden.files import write_text_atomic
from jobwarden.worker.command import worker_argv

CPU_MARK_EVERY_S = 0.5


def prepare(
    root: Root, record: JobRecord, cache: Path, signing_key: Path | None, env: dict[str, str]
) -> LaunchSpec:
    """Write the attempt's folder and job file (faults only in the first attempt), and the
    launch spec running the worker on them."""
    attempts = root.job(record.id) / "attempts"
    attempts.mkdir(mode=0o700, exist_ok=True)
    folder = attempts / str(record.attempt)
    folder.mkdir(mode=0o700, exist_ok=True)
    job = record.job if record.attempt == 1 else record.job.without_faults()
    job_file = folder / "job.json"
    write_text_atomic(job_file, json.dumps(job.to_record(), indent=2) + "\n")
    argv = worker_argv(job_file, root.checkpoints / record.checkpoint, cache, signing_key)
    return LaunchSpec(record.id, record.attempt, folder, argv, dict(env))


@dataclass
class Attempt:
    """One live attempt of a job, with what its supervisor has learned from its events."""

    record: JobRecord
    number: int
    running: RunningAttempt
    stall: StallWatch
    verifier: ReplayVerifier | None = None
    failure: Event | None = None
    completed: bool = False
    stop_reason: StopReason | None = None
    last_event: dict[str, Any] | None = None
    last_progress: dict[str, Any] | None = None
    checkpoint: tuple[int, str] | None = None
    cpu_mark: tuple[float, float] | None = None
    stall_evidence: dict[str, Any] | None = None

    @property
    def folder(self) -> Path:
        """The attempt's evidence folder (events.jsonl, stderr.log, exit.json, job.json)."""
        return self.running.spec.folder

    @property
    def incident(self) -> Incident | None:
        """The incident this attempt recovers from, until its replay is settled."""
        verifier = self.verifier
        return verifier.incident if verifier and verifier.verdict is Verdict.PENDING else None

    def observe(self, event: Event, stall_timeout_s: float) -> None:
        """Learn from one event: forward motion re-arms the stall watch."""
        self.last_event = {k: v for k, v in event.fields.items() if k != "components"}
        kind = event.kind
        if kind in ("ready", "progress", "checkpoint"):
            self.stall.alive(stall_timeout_s)
        if kind == "progress":
            self.last_progress = self.last_event
            self._mark_cpu()
        elif kind == "checkpoint":
            self.checkpoint = (event["step"], event["file"])
        elif kind == "completed":
            self.completed = True
        elif kind == "failed":
            self.failure = event

    def _mark_cpu(self) -> None:
        """Note the CPU time used so far, at most every half second, for stall evidence."""
        now = time.monotonic()
        if self.cpu_mark is None or now - self.cpu_mark[0] > CPU_MARK_EVERY_S:
            cpu = self.running.sample().get("cpu_s")
            if cpu is not None:
                self.cpu_mark = (now, cpu)

    def stopping(self, reason: StopReason) -> bool:
        """Record that the daemon stops this attempt; False if it already is stopping."""
        if self.stop_reason is not None or self.running.exit_info is not None:
            return False
        self.stop_reason = reason
        return True

    def report(self) -> AttemptReport:
        """What the policy is told about this attempt."""
        failure = self.failure
        return AttemptReport(
            number=self.number,
            completed=self.completed,
            failure_code=failure["code"] if failure is not None else None,
            failure_message=failure["message"] if failure is not None else None,
            stopped_by=self.stop_reason,
            mismatch_step=self.verifier.mismatch_step if self.verifier is not None else None,
        )
