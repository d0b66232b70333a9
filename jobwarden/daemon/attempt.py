"""A live attempt of a job, as the daemon's loop sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobwarden.daemon.incidents import Incident
from jobwarden.daemon.jobs import JobRecord
from jobwarden.daemon.process import WorkerProcess
from jobwarden.daemon.recovery import ReplayPlan
from jobwarden.daemon.stall import StallWatch
from jobwarden.events import Event


@dataclass
class Attempt:
    """One live attempt of a job, with what the loop has learned from its events."""

    record: JobRecord
    number: int
    process: WorkerProcess
    stall: StallWatch
    plan: ReplayPlan | None = None
    incident: Incident | None = None
    failure: Event | None = None
    completed: bool = False
    last_event: dict[str, Any] | None = None
    last_progress: dict[str, Any] | None = None
    checkpoint: tuple[int, str] | None = None
    cpu_mark: tuple[float, float] | None = None
    stall_evidence: dict[str, Any] | None = None
    pending_time_lost: Incident | None = None
    resolved: list[Incident] = field(default_factory=list)
