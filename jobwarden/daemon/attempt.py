"""A live attempt of a job, as its supervisor sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.daemon.incidents import Incident
from jobwarden.daemon.jobs import JobRecord
from jobwarden.daemon.launcher import RunningAttempt
from jobwarden.daemon.policy import AttemptReport, StopReason
from jobwarden.daemon.stall import StallWatch
from jobwarden.daemon.verification import ReplayVerifier
from jobwarden.events import Event


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
    resolved: list[Incident] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        """The attempt's evidence folder (events.jsonl, stderr.log, exit.json, job.json)."""
        return self.running.spec.folder

    @property
    def incident(self) -> Incident | None:
        """The incident this attempt recovers from, until its replay is settled."""
        return self.verifier.incident if self.verifier is not None else None

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
