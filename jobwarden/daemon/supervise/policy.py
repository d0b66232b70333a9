"""The daemon's decisions, as pure functions: what follows when an attempt ends.

`decide` maps (the job's record, what the attempt reported, how it exited) to
one `Outcome`; the job's supervisor applies it.  Nothing here does I/O or reads
a clock: every fact, time included, comes in as an argument, so each rule has a
unit test that runs in microseconds.

The rules, in the order they apply:

1. stopped by the daemon because a replayed state differed: `Escalate`;
2. stopped by an operator, or by the daemon's shutdown, before completing:
   `Preempted` (after a shutdown, resumed when the daemon starts again);
3. exit status 0 after a ``completed`` event: `Completed`; for a plain program,
   which emits no events (``emits_events`` false), exit status 0 of an attempt
   the daemon did not stop; exit status 0 of a job that should emit events but
   wrote none (a plain program left at ``sdk = true``): `Escalate`, as no
   restart can mend it;
4. anything else is a failure of some `IncidentKind` (`classify`):
   - kinds a restart cannot mend (an incompatible or exhausted checkpoint
     directory, a duplicate writer, an invalid request...): `Escalate`;
   - an exit status the job lists in ``fatal_exit_codes`` (systemd's
     ``RestartPreventExitStatus=``), of an attempt the daemon did not stop: `Fail`;
   - the restart budget is spent: `Fail`;
   - otherwise `Restart`: at once for the first restart of a streak, then after
     ``restart_backoff_s`` doubled per restart, capped at ``restart_backoff_max_s``.
     A streak is the run of restarts with no healthy attempt between: an attempt
     that ran ``restart_reset_after_s`` or longer starts a new one (`streak_of`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobwarden.daemon.incidents.kinds import KINDS
from jobwarden.daemon.supervise.budget import Budget, CrashLoop, spend
from jobwarden.errors import IncidentKind as IncidentKind  # noqa: PLC0414 - re-exported
from jobwarden.errors import JobwardenError, PreemptedExit

if TYPE_CHECKING:
    from jobwarden.daemon.launch.base import ExitInfo
    from jobwarden.daemon.store.jobs import JobRecord


class StopReason(enum.StrEnum):
    """Why the daemon itself stopped an attempt."""

    OPERATOR = "operator"
    SHUTDOWN = "shutdown"
    STALL = "stall"
    RSS = "rss"
    MISMATCH = "mismatch"


K = IncidentKind
RESTARTING_STOPS = frozenset({StopReason.STALL, StopReason.RSS})
"""The daemon's own stops whose end restarts the job."""
PREEMPTING_STOPS = frozenset({StopReason.OPERATOR, StopReason.SHUTDOWN})
"""The stops whose end preempts the job: a person's, or the daemon's shutdown."""


# Kinds a restart cannot mend: a person decides.  A worker's refusal names its kind
# on its error class (`kinds.KINDS` by code): a restart would meet the same refusal
# (a full disk included: no restart loop).  Corrupt files are not here: the worker
# quarantines them and falls back by itself, and only `NoUsableCheckpoint` is final.
ESCALATING_KINDS = frozenset(
    {
        K.INVALID_REQUEST,
        K.RESUME_POLICY,
        K.UNSAFE_CACHE,
        K.CORRUPT_CHECKPOINT,
        K.DISK_FULL,
        K.DUPLICATE_WRITER,
        K.UNSAFE_PATH,
        K.INCOMPATIBLE_CHECKPOINT,
        K.REPLAY_MISMATCH,
    }
)
ESCALATING_CODES: dict[str, IncidentKind] = {
    code: kind for code, kind in KINDS.items() if kind in ESCALATING_KINDS
}
"""The worker refusals that escalate to a person, and the kind of incident each is."""


@dataclass(frozen=True)
class AttemptReport:
    """What the supervisor learned of an attempt from its events and its own actions."""

    number: int
    completed: bool = False
    failure_code: str | None = None
    failure_message: str | None = None
    stopped_by: StopReason | None = None
    mismatch_step: int | None = None
    emits_events: bool = True
    """False for a plain program (no SDK): it never reports ``completed`` or a failure code."""
    restored_step: int | None = None
    """The step its ``restored`` event named; None on a fresh start."""
    external_checkpoints: bool = False
    """Whether the program keeps its own checkpoints (its ``restored`` said ``external``)."""
    committed_step: int | None = None
    """The step of the newest checkpoint it committed (its last ``checkpoint`` event)."""
    last_step: int | None = None
    """The update of its last ``progress`` event; None before its first update."""
    checkpoint_every: int = 1
    events_seen: bool = True
    """Whether stdout carried any jobwarden event (a program left at ``sdk = true`` that
    does not use the SDK carries none)."""
    stray_lines: int = 0
    """Lines of stdout that were no events."""

    @property
    def finished(self) -> bool:
        """Whether the attempt did its work, as far as it can say: a ``completed`` event, or
        for a plain program an end the daemon did not cause (its exit status decides)."""
        return self.completed if self.emits_events else self.stopped_by is None


@dataclass(frozen=True)
class Completed:
    """The job finished its steps."""

    reason: str


@dataclass(frozen=True)
class Preempted:
    """The job was stopped on purpose and waits: for `wardenctl resume`, or the daemon."""

    reason: str
    resume_on_start: bool = False


@dataclass(frozen=True)
class Restart:
    """Start the next attempt after ``delay_s``, recovering from an incident of ``kind``."""

    delay_s: float
    reason: str
    kind: IncidentKind
    streak: int = 1
    """Restarts in a row without a healthy attempt between, this one included."""
    budget: Budget | None = field(default=None, compare=False)
    """The job's counters after this failure, for its record."""


@dataclass(frozen=True)
class Fail:
    """No further attempt: the restart budget is spent."""

    reason: str
    kind: IncidentKind
    budget: Budget | None = field(default=None, compare=False)
    """The job's counters after this failure, for its record."""
    loop: CrashLoop | None = field(default=None, compare=False)
    """The attempts without progress, when that is what spent the budget."""


@dataclass(frozen=True)
class Escalate:
    """No further attempt: a person must decide (no fallback, no relaxed checks)."""

    reason: str
    kind: IncidentKind


Outcome = Completed | Preempted | Restart | Fail | Escalate


class UnappliableOutcome(JobwardenError):
    """Raised when an outcome arrives without the attempt it needs (a failure with no
    attempt, say): a defect in the caller, never a job's fault."""

    code = "daemon.unappliable_outcome"

    def __init__(self, job: str, outcome: Outcome) -> None:
        message = f"job {job}: cannot apply {outcome!r} here"
        super().__init__(message, job=job, outcome=repr(outcome))


def classify(report: AttemptReport, status: int, preempted: bool = False) -> IncidentKind:
    """The kind of failure of an attempt that ended without completing (``preempted``: the
    cluster said so, as Slurm does of a preemption or a requeue)."""
    if report.stopped_by is StopReason.MISMATCH:
        return K.REPLAY_MISMATCH
    if report.stopped_by is StopReason.STALL:
        return K.STALL
    if report.stopped_by is StopReason.RSS:
        return K.RSS_LIMIT
    if report.failure_code in ESCALATING_CODES:
        return ESCALATING_CODES[report.failure_code]
    if preempted or (status == PreemptedExit.exit_status and report.emits_events):
        return K.PREEMPTION
    return K.CRASH


def supersedes(new: StopReason, old: StopReason) -> bool:
    """Whether a stop for ``new`` takes the place of one under way for ``old``: an operator's
    stop or a shutdown outranks a stop that would restart the job (a stall, the memory
    limit), so the job is preempted as asked rather than restarted."""
    return new in PREEMPTING_STOPS and old in RESTARTING_STOPS


def backoff_s(streak: int, base_s: float, max_s: float) -> float:
    """The wait before a restart that follows ``streak`` restarts in a row: none for the
    first, then ``base_s`` doubled per restart, never more than ``max_s``."""
    if streak <= 0:
        return 0.0
    return float(min(max_s, base_s * 2 ** (streak - 1)))


def streak_of(previous: int, ran_s: float, reset_after_s: float) -> int:
    """The restarts in a row before this one: ``previous``, or none when the attempt that
    ended ran ``reset_after_s`` or longer (a healthy run resets the backoff)."""
    return 0 if ran_s >= reset_after_s else previous


def decide(
    record: JobRecord, report: AttemptReport, exit: ExitInfo, streak: int = 0, now: float = 0.0
) -> Outcome:
    """What follows the end of ``report``'s attempt of ``record``'s job (the rules above);
    ``streak`` is the restarts in a row so far (`Restart.streak` of the last restart), ``now``
    the wall-clock time of the end (for ``restart_limit_window_s``)."""
    stopped_by, step = report.stopped_by, record.step
    if stopped_by is StopReason.MISMATCH:
        return Escalate(f"replay mismatch at step {report.mismatch_step}", K.REPLAY_MISMATCH)
    if stopped_by is StopReason.OPERATOR and not report.completed:
        return Preempted(f"stopped by operator at step {step}")
    if stopped_by is StopReason.SHUTDOWN and not report.completed:
        return Preempted(
            f"daemon shutdown preempted attempt {report.number} at step {step}",
            resume_on_start=True,
        )
    if exit.status == 0 and report.finished:
        return Completed(f"attempt {report.number} completed")
    if exit.status == 0 and report.emits_events and not report.events_seen:
        return Escalate(
            f"exit status 0 and no jobwarden event on stdout ({report.stray_lines} lines that "
            "are no events): the program does not use jobwarden.sdk; set sdk = false",
            K.INVALID_REQUEST,
        )
    kind = classify(report, exit.status, exit.preempted)
    if kind in ESCALATING_KINDS:
        return Escalate(f"{kind}: {report.failure_message or ''}", kind)
    supervision = record.job.supervision
    if stopped_by is None and exit.status in supervision.fatal_exit_codes:
        return Fail(f"{kind}; exit status {exit.status} is in fatal_exit_codes", kind)
    budget = spend(record, report, exit, kind, now)
    if supervision.max_restarts == 0 and kind is not K.PREEMPTION:
        return Fail(f"{kind}; max_restarts = 0: no restart", kind, budget)
    if budget.without_progress > supervision.max_restarts:
        loop = CrashLoop(budget.attempts, budget.without_progress)
        reason = f"{kind}; {loop.verdict()} (max_restarts {supervision.max_restarts})"
        return Fail(reason, kind, budget, loop)
    if len(budget.failures) > supervision.restart_limit:
        window = supervision.restart_limit_window_s
        reason = (
            f"{kind}; {len(budget.failures)} failures within {window:g} s, over restart_limit "
            f"{supervision.restart_limit}"
        )
        return Fail(reason, kind, budget)
    before = streak_of(streak, exit.duration_s, supervision.restart_reset_after_s)
    delay = backoff_s(before, supervision.restart_backoff_s, supervision.restart_backoff_max_s)
    when = f"in {delay:.2f} s" if delay > 0 else "at once"
    return Restart(
        delay,
        f"{kind} of attempt {report.number}; restart {record.restarts + 1} {when}",
        kind,
        before + 1,
        budget,
    )


def admit(record: JobRecord, owner: JobRecord | None) -> Escalate | None:
    """Refuse to start a job whose checkpoint a live job (``owner``) writes."""
    if owner is None:
        return None
    return Escalate(
        f"duplicate writer prevented: checkpoint '{record.checkpoint}' "
        f"is owned by live job {owner.id}",
        K.DUPLICATE_WRITER,
    )


def over_memory_limit(rss_mb: float | None, limit_mb: float | None) -> bool:
    """Whether a worker's sampled rss calls for stopping it (never without a limit)."""
    return rss_mb is not None and limit_mb is not None and rss_mb > limit_mb
