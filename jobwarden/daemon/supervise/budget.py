"""The restart budget, judged by progress: long jobs live, crash loops stop.

Pure functions of what an attempt reported and of the job's counters, so that
`policy.decide` stays pure.  Three counters, kept in the job's record (and so
across a daemon restart):

- **restarts without progress**, in a row.  An attempt *made progress* when it
  committed a checkpoint newer than the one it restored (`made_progress`); a
  plain program, which commits nothing the daemon sees, when it ran
  ``restart_reset_after_s`` or longer; a program that keeps its own checkpoints
  (``checkpoints = "external"``: the daemon sees its ``restored`` but not its
  saves) when its updates passed a multiple of ``checkpoint_every`` beyond the
  step it restored, where it saves.  ``max_restarts`` bounds this count; an
  attempt that made progress sets it back to 0, so a job that commits between
  faults is never failed by their number.  ``max_restarts = 0`` still means
  that the job is never restarted.
- **failures within the window**: the wall-clock times of the failures of the
  last ``restart_limit_window_s``; a failure that would make them more than
  ``restart_limit`` fails the job whatever its progress (systemd's
  ``StartLimitBurst=`` within ``StartLimitIntervalSec=``).
- **the attempts of the current streak without progress**, each with the step it
  restored, the update it died at and its error, so that a job failed for want
  of progress is told apart: every attempt dying at the same update with the
  same error is a deterministic failure no restart heals; different points are
  an unstable environment (`CrashLoop`).

Preemptions (a ``preemption`` kind: an SDK worker's exit 75 after a SIGTERM it was
sent, from Slurm or at a time limit after its commit; anything Slurm preempted or
requeued, a plain program's attempt too) never count: they spend neither
counter, and one that made progress still sets the count without progress back
to 0.  The daemon's own stops of an operator or a shutdown never reach here
(`policy.decide` preempts them first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from jobwarden.errors import IncidentKind

if TYPE_CHECKING:
    from jobwarden.daemon.launch.base import ExitInfo
    from jobwarden.daemon.store.jobs import JobRecord


class AttemptReport(Protocol):
    """What this module reads of an attempt's report (`policy.AttemptReport`)."""

    @property
    def number(self) -> int: ...
    @property
    def emits_events(self) -> bool: ...
    @property
    def restored_step(self) -> int | None: ...
    @property
    def external_checkpoints(self) -> bool: ...
    @property
    def committed_step(self) -> int | None: ...
    @property
    def last_step(self) -> int | None: ...
    @property
    def checkpoint_every(self) -> int: ...
    @property
    def failure_code(self) -> str | None: ...
    @property
    def failure_message(self) -> str | None: ...
    @property
    def stopped_by(self) -> str | None: ...


@dataclass(frozen=True)
class Budget:
    """The job's counters after one failure (or preemption), to be kept in its record."""

    without_progress: int
    """Restarts in a row without progress, the one this failure asks for included."""
    failures: tuple[float, ...]
    """Wall-clock times of the failures within the window, this one included."""
    attempts: tuple[dict[str, Any], ...]
    """The attempts of the streak without progress (`attempt_entry`), this one last."""
    progress: bool
    """Whether the attempt that ended made progress."""


def made_progress(report: AttemptReport, ran_s: float, reset_after_s: float) -> bool:
    """Whether the attempt moved the job forward (the rules of this module's docstring)."""
    if not report.emits_events:
        return ran_s >= reset_after_s
    restored = report.restored_step if report.restored_step is not None else -1
    if report.external_checkpoints:
        every = max(1, report.checkpoint_every)
        reached = report.last_step
        return reached is not None and reached // every > max(restored, 0) // every
    return report.committed_step is not None and report.committed_step > restored


def error_of(report: AttemptReport, exit: ExitInfo) -> str:
    """How the attempt failed, in words that compare equal for the same failure."""
    if report.failure_code is not None:
        return f"{report.failure_code}: {report.failure_message or ''}".strip()
    if report.stopped_by is not None:
        return f"stopped by the daemon: {report.stopped_by}"
    if exit.signal is not None:
        return f"killed by {exit.signal}"
    return f"exit status {exit.status}"


def attempt_entry(report: AttemptReport, exit: ExitInfo, kind: IncidentKind) -> dict[str, Any]:
    """One attempt of a streak without progress, as kept in the record and told in the
    verdict: what it restored, where it died, how."""
    return {
        "attempt": report.number,
        "restored_step": report.restored_step,
        "died_at_update": report.last_step,
        "phase": "updates" if report.last_step is not None else "before its first update",
        "kind": kind.value,
        "error": error_of(report, exit),
    }


def spend(
    record: JobRecord, report: AttemptReport, exit: ExitInfo, kind: IncidentKind, now: float
) -> Budget:
    """The counters after this attempt's end of ``kind`` at wall-clock ``now``."""
    supervision = record.job.supervision
    window = supervision.restart_limit_window_s
    recent = tuple(t for t in record.failure_times if now - t < window)
    progress = made_progress(report, exit.duration_s, supervision.restart_reset_after_s)
    if kind is IncidentKind.PREEMPTION:
        if progress:
            return Budget(0, recent, (), progress)
        attempts = tuple(record.no_progress)
        return Budget(record.restarts_without_progress, recent, attempts, progress)
    entry = attempt_entry(report, exit, kind)
    if progress:
        return Budget(0, (*recent, now), (), progress)
    attempts = (*record.no_progress, entry)[-(supervision.max_restarts + 1) :]
    return Budget(record.restarts_without_progress + 1, (*recent, now), attempts, progress)


@dataclass(frozen=True)
class CrashLoop:
    """A job failed for want of progress: its attempts, and whether they failed alike."""

    attempts: tuple[dict[str, Any], ...]
    count: int = 0
    """Attempts in a row without progress (the record may keep fewer of them)."""

    @property
    def deterministic(self) -> bool:
        """Every attempt died at the same update with the same error (more than one)."""
        seen = {(a["died_at_update"], a["error"]) for a in self.attempts}
        return len(self.attempts) > 1 and len(seen) == 1

    @property
    def died_at(self) -> str:
        """Where the first attempt died, in words."""
        return where_died(self.attempts[0]["died_at_update"] if self.attempts else None)

    def verdict(self) -> str:
        """One line: how many attempts, where, and what kind of failure it is."""
        n = max(self.count, len(self.attempts))
        if self.deterministic:
            error = self.attempts[0]["error"]
            return (
                f"no progress in {n} attempts: each died {self.died_at} with {error!r:.200}, "
                "a deterministic failure"
            )
        return f"no progress in {n} attempts, each at a different point: an unstable environment"

    def runbook(self) -> str:
        """What a person does about it."""
        listed = "; ".join(told(a) for a in self.attempts)
        if self.deterministic:
            advice = (
                f"Every attempt died {self.died_at} with the same error: no restart will heal "
                "it. Fix the program or the data it reads at that step (reproduce it with "
                "the job's last checkpoint), then `wardenctl resume`."
            )
        else:
            advice = (
                "The attempts died at different points: look at the machine (memory, disk, "
                "other processes, the node's health) before resuming with `wardenctl resume`."
            )
        return f"{advice} Attempts: {listed}."


def told(entry: dict[str, Any]) -> str:
    """One attempt of a streak without progress, in words."""
    step, where = entry["restored_step"], where_died(entry["died_at_update"])
    restored = "nothing" if step is None else f"step {step}"
    return f"attempt {entry['attempt']} restored {restored}, died {where} ({entry['error']:.120})"


def where_died(update: int | None) -> str:
    """Where an attempt died: at its last update, or before any."""
    return "before its first update" if update is None else f"at update {update}"


def restart_count(record: JobRecord) -> str:
    """Which restart this is, and how many in a row made no progress, against the budget."""
    sup = record.job.supervision
    return (
        f"restart {record.restarts}; {record.restarts_without_progress} in a row without "
        f"progress, of at most {sup.max_restarts}"
    )
