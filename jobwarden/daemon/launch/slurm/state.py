"""What a Slurm job's state means for a jobwarden attempt, as pure functions.

The Slurm launcher polls ``scontrol -o show job ID`` (it works without
slurmdbd) and reads the batch script's own exit record (the exit status of
``srun``, hence of the worker).  This module turns those facts into the
attempt's phase (`Phase`: waiting in the queue, running, ended, requeued by
Slurm) and, once it has ended, into the exit status the daemon's policy reads:

- COMPLETED, FAILED, CANCELLED and TIMEOUT: the worker's own exit status (a
  worker that committed on SIGTERM exits 75, which the policy resumes; one
  killed by a signal is a crash);
- PREEMPTED, NODE_FAIL, and a job Slurm requeued (``scontrol requeue``): a
  preemption, exit 75 (resume from the newest checkpoint);
- OUT_OF_MEMORY: a failure killed by SIGKILL, whose signal field names it,
  so the incident does too.

No I/O, no clock: every fact comes in as an argument.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

from jobwarden.errors import PreemptedExit


class Phase(enum.StrEnum):
    """Where an attempt's Slurm job is."""

    QUEUED = "queued"
    """submitted, not yet running: pending time, not startup time"""
    RUNNING = "running"
    ENDED = "ended"
    REQUEUED = "requeued"
    """Slurm put a job that had run back in its queue: the attempt is over (preempted)"""


QUEUED_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING"})
REQUEUED_STATES = frozenset({"REQUEUED", "REQUEUE_FED"})
PREEMPTION_STATES = frozenset({"PREEMPTED", "NODE_FAIL"})
ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        *PREEMPTION_STATES,
    }
)
SHORT = {
    "PENDING": "PD",
    "CONFIGURING": "CF",
    "RUNNING": "R",
    "COMPLETING": "CG",
    "COMPLETED": "CD",
    "FAILED": "F",
    "CANCELLED": "CA",
    "TIMEOUT": "TO",
    "PREEMPTED": "PR",
    "NODE_FAIL": "NF",
    "OUT_OF_MEMORY": "OOM",
    "SUSPENDED": "S",
    "REQUEUED": "RQ",
    "REQUEUE_HOLD": "RH",
}
"""squeue's compact state codes, as ``wardenctl status`` shows them."""
PREEMPTED_STATUS = PreemptedExit.exit_status


@dataclass(frozen=True)
class SlurmJob:
    """One Slurm job as ``scontrol -o show job`` describes it."""

    job_id: str
    state: str
    reason: str = "None"
    exit_code: int = 0
    exit_signal: int = 0
    restarts: int = 0
    node: str | None = None

    @classmethod
    def from_show(cls, line: str) -> SlurmJob:
        """Parse one line of ``scontrol -o show job ID``; raises ValueError without a JobId."""
        fields = parse_fields(line)
        if "JobId" not in fields:
            raise ValueError(f"no JobId in scontrol's answer: {line[:200]!r}")
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        nodes = fields.get("BatchHost") or fields.get("NodeList")
        return cls(
            job_id=fields["JobId"],
            state=fields.get("JobState", "UNKNOWN").split("+")[0],
            reason=fields.get("Reason", "None"),
            exit_code=int(code or 0),
            exit_signal=int(sig or 0),
            restarts=int(fields.get("Restarts", "0") or 0),
            node=nodes if nodes and nodes != "(null)" else None,
        )

    @property
    def phase(self) -> Phase:
        """Where the attempt is (a job Slurm requeued is over for jobwarden)."""
        if self.state in REQUEUED_STATES or (self.restarts > 0 and self.state in QUEUED_STATES):
            return Phase.REQUEUED
        if self.state in QUEUED_STATES:
            return Phase.QUEUED
        if self.state in ENDED_STATES:
            return Phase.ENDED
        return Phase.RUNNING

    def describe(self) -> str:
        """``PD (Resources)``: squeue's code, and the reason while there is one."""
        short = SHORT.get(self.state, self.state)
        return f"{short} ({self.reason})" if self.reason not in ("None", "") else short


def parse_fields(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of a one-line scontrol answer (a value never holds a space,
    except the last fields, Command and the like, which are not needed)."""
    fields: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


@dataclass(frozen=True)
class SlurmExit:
    """How an ended attempt counts for the policy: a status (negative: that signal) and
    the name of what killed it, where something did."""

    status: int
    signal: str | None
    why: str
    preempted: bool = False
    """Slurm preempted or requeued it: a preemption whatever the program (a plain one too)"""


def exit_of(job: SlurmJob | None, script_status: int | None) -> SlurmExit:
    """The exit of an attempt whose Slurm job is ``job`` (None: Slurm no longer knows it)
    and whose batch script recorded ``script_status`` (None: it wrote no record)."""
    status = from_shell(script_status) if script_status is not None else None
    if job is None:
        if status is None:
            return SlurmExit(-signal.SIGKILL, "SIGKILL", "the Slurm job is gone without a record")
        return SlurmExit(status, signal_name(status), "the Slurm job is gone; its script's record")
    if status is None:
        status = -job.exit_signal if job.exit_signal else from_shell(job.exit_code)
    if job.phase is Phase.REQUEUED or job.state in PREEMPTION_STATES:
        why = "requeued by Slurm" if job.phase is Phase.REQUEUED else f"Slurm {job.state}"
        # Whatever the worker's own exit (a requeue resets ExitCode to 0:0), it was preempted.
        return SlurmExit(PREEMPTED_STATUS, None, f"{why}: a preemption", preempted=True)
    if job.state == "OUT_OF_MEMORY":
        return SlurmExit(
            status if status < 0 else -signal.SIGKILL,
            "OUT_OF_MEMORY (Slurm's memory limit)",
            "Slurm OUT_OF_MEMORY",
        )
    return SlurmExit(status, signal_name(status), f"Slurm {job.state}")


def from_shell(code: int) -> int:
    """A shell's exit status (128 + n for a death by signal n) as a returncode."""
    if code > 128 and (code - 128) in signal.valid_signals():
        return -(code - 128)
    return code


def signal_name(status: int) -> str | None:
    """``SIGKILL`` for status -9; None for an exit."""
    if status >= 0:
        return None
    try:
        return signal.Signals(-status).name
    except ValueError:
        return f"signal {-status}"
