"""The job state machine: states and the transitions allowed between them (stdlib only)."""

from __future__ import annotations

import enum

from jobwarden.errors import JobwardenError


class JobState(enum.Enum):
    """Where a job is in its life."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    STALLED = "stalled"
    FAILED = "failed"
    PREEMPTED = "preempted"
    RECOVERING = "recovering"
    COMPLETED = "completed"
    ESCALATED = "escalated"
    CANCELLED = "cancelled"


S = JobState

_ENDINGS = {S.FAILED, S.PREEMPTED, S.ESCALATED, S.CANCELLED}

# Where each state may go.  RECOVERING -> RECOVERING is a recovery attempt that failed
# before its replay was verified, followed by the next recovery.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.STARTING, S.ESCALATED, S.CANCELLED}),
    S.STARTING: frozenset({S.RUNNING, S.STALLED, S.RECOVERING, S.COMPLETED, *_ENDINGS}),
    S.RUNNING: frozenset({S.STALLED, S.RECOVERING, S.COMPLETED, *_ENDINGS}),
    S.STALLED: frozenset({S.RECOVERING, S.COMPLETED, *_ENDINGS}),
    S.RECOVERING: frozenset({S.RUNNING, S.STALLED, S.RECOVERING, S.COMPLETED, *_ENDINGS}),
    S.PREEMPTED: frozenset({S.QUEUED, S.RECOVERING, S.CANCELLED}),
    S.FAILED: frozenset({S.QUEUED, S.CANCELLED}),
    S.ESCALATED: frozenset({S.QUEUED, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.CANCELLED: frozenset(),
}

ACTIVE = frozenset({S.STARTING, S.RUNNING, S.STALLED, S.RECOVERING})
TERMINAL = frozenset({S.COMPLETED, S.CANCELLED})
NEEDS_ATTENTION = frozenset({S.FAILED, S.ESCALATED})
# Where a job rests: the daemon will do nothing more for it on its own.
SETTLED = TERMINAL | NEEDS_ATTENTION
RESUMABLE = frozenset({S.PREEMPTED, *NEEDS_ATTENTION})
"""What an operator may queue again (``resume``, ``restart`` of a resting job)."""


class IllegalTransition(JobwardenError):
    """Raised when a job is asked to move along an edge the table does not have."""

    code = "job.illegal_transition"
    exit_status = 71

    def __init__(self, job: str, source: JobState, target: JobState) -> None:
        super().__init__(
            f"job {job}: illegal transition {source.value} -> {target.value}",
            job=job,
            source=source.value,
            target=target.value,
        )
        self.job, self.source, self.target = job, source, target


def check_transition(job: str, source: JobState, target: JobState) -> None:
    """Raise `IllegalTransition` unless ``source -> target`` is in the table."""
    if target not in TRANSITIONS[source]:
        raise IllegalTransition(job, source, target)
