"""How each `Outcome` is written down: the incidents it opens or concludes, and the transition.

The policy decides; the supervisor calls these to record the decision, then
frees the job's slot or schedules its restart.  Each function leaves the job
in the state its outcome names.
"""

from __future__ import annotations

import asyncio
import errno
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from jobwarden.daemon.background import off_loop
from jobwarden.daemon.incidents.records import Incident
from jobwarden.daemon.launch.base import ExitInfo
from jobwarden.daemon.store import evidence
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.supervise import diagnosis, plain, policy, verification
from jobwarden.daemon.supervise.attempt import Attempt
from jobwarden.daemon.supervise.heartbeat import Heartbeat
from jobwarden.daemon.supervise.policy import StopReason
from jobwarden.daemon.supervise.verification import ReplayVerifier
from jobwarden.errors import IncidentKind, JobwardenError
from jobwarden.files import UnsafePathError
from jobwarden.jobfolder import EVENTS_FILE
from jobwarden.proof.replay import ReplayPlan, Verdict
from jobwarden.states import TRANSITIONS, JobState

if TYPE_CHECKING:
    from jobwarden.daemon.supervise.services import Services

log = structlog.get_logger("wardend.outcomes")

S = JobState


def complete(
    s: Services, record: JobRecord, outcome: policy.Completed, attempt: Attempt | None
) -> None:
    """The job finished; a recovery it made on the way says so in its incident."""
    verifier = attempt.verifier if attempt is not None else None
    if verifier is not None and verifier.verdict in (Verdict.VERIFIED, Verdict.UNVERIFIED):
        verifier.incident.outcome += (
            f" The job then completed at step {record.step}."
            if record.job.emits_events
            else " The program then exited 0: the job completed."
        )
        s.incidents.write(verifier.incident, "incident.job_completed")
    step = {"step": record.step} if record.job.emits_events else {}  # a plain one has none
    s.table.transition(record, S.COMPLETED, outcome.reason, **step)


def start_plain(
    s: Services, record: JobRecord, attempt: Attempt, on_beat: Callable[[], None]
) -> None:
    """A plain program: watch its heartbeat, if it has one, and conclude the recovery it
    makes as unverified now (it logs no state, so there is nothing to wait for)."""
    cwd = attempt.running.spec.cwd or attempt.folder
    beat = attempt.heartbeat = Heartbeat.of(record.job, cwd, s.clock, on_beat)
    if beat.watching:
        attempt.stall.start(record.job.supervision.startup_timeout_s)
        beat.start()
    elif record.state is S.STARTING:
        s.table.transition(
            record, S.RUNNING, f"attempt {attempt.number} started (no heartbeat to watch)"
        )
    if attempt.verifier is not None:
        recovered_unverified(s, record, attempt, attempt.verifier)


def replay(s: Services, record: JobRecord, attempt: Attempt, check: Callable[[], Verdict]) -> None:
    """Run one step of the replay proof and act on a verdict it reaches."""
    verifier = attempt.verifier
    if verifier is None:
        return
    before, lost_before = verifier.verdict, verifier.time_lost_s
    verdict = check()
    if verifier.time_lost_s is not None and lost_before is None:
        record.time_lost_s += verifier.time_lost_s
        s.table.save(record)
        s.incidents.write(verifier.incident, "incident.goodput")
    if verdict is before:
        return
    if verdict is Verdict.MISMATCH and record.job.supervision.on_mismatch == "continue":
        went_on(s, record, attempt, verifier)
        return
    if verdict is Verdict.MISMATCH:
        # Stop at once: SIGKILL, so the different experiment commits nothing more.
        if attempt.stopping(StopReason.MISMATCH):
            attempt.running.kill()
        log.error("replay.mismatch", job=record.id, step=verifier.mismatch_step)
        return
    record.replayed_updates += verifier.plan.replayed_updates
    outcome = diagnosis.recovered_text(attempt.number, verifier.plan.restored_step)
    if record.diverged is not None:  # verified against a log that had already diverged
        verifier.incident.details["unverifiable_past_step"] = record.diverged["step"]
        outcome += verification.past_divergence_text(record.diverged)
    s.incidents.conclude(verifier.incident, verdict.value, outcome, f"incident.{verdict.value}")
    if record.state is S.RECOVERING:
        s.table.transition(record, S.RUNNING, f"recovery {verdict}", verdict=verdict.value)


def went_on(s: Services, record: JobRecord, attempt: Attempt, verifier: ReplayVerifier) -> None:
    """A replay differed and the job asked to go on (``on_mismatch = "continue"``): the
    incident is concluded ``mismatch`` with its evidence, the divergence kept in the record
    (every later recovery is unverifiable past it), and the attempt runs on."""
    step = verifier.mismatch_step
    if record.diverged is None:
        record.diverged = {"step": step, "incident": verifier.incident.id}
    verifier.incident.details["mismatch"] = verifier.plan.mismatch
    s.incidents.conclude(
        verifier.incident,
        Verdict.MISMATCH.value,
        verification.mismatch_continued_text(attempt.number, step),
        "incident.mismatch",
    )
    log.warning("replay.mismatch_continued", job=record.id, step=step)
    reason = f"recovery mismatch at step {step}, continued (on_mismatch = continue)"
    if record.state is S.RECOVERING:
        s.table.transition(record, S.RUNNING, reason, verdict=Verdict.MISMATCH.value)
    else:
        s.table.save(record)


async def wait_orphans(s: Services, record: JobRecord) -> int | None:
    """After the daemon's restart, return once no worker it started for the job lives: the
    pid it saved and any process `Launcher.find_orphans` finds by the job's folder (one
    whose pid was never saved: the daemon died in between).  Returns the first such pid."""
    found = await off_loop(s.launcher.find_orphans, s.root.job(record.id))
    if record.pid is not None:
        found.insert(0, (record.pid, record.pid_started))
    for pid, started in found:
        log.info("orphan.waiting", job=record.id, pid=pid, pid_saved=pid == record.pid)
        await s.launcher.wait_orphan(pid, started)
    return found[0][0] if found else None


def restarted(
    s: Services, record: JobRecord, previous: int | None, left_open: list[Incident]
) -> ReplayVerifier:
    """The daemon restarted while the job was active: the incidents an earlier daemon left
    open are concluded, a ``daemon_restart`` incident opened, and the job is recovering."""
    folder = s.root.attempt(record.id, record.attempt)
    plan = ReplayPlan.from_events(record.attempt, folder / EVENTS_FILE)
    number = len(record.incidents) + 1
    incident = diagnosis.restart_incident(record, plan, folder, previous, number)
    s.incidents.interrupt(left_open, f"incident {incident.id} carries the recovery on")
    s.incidents.open(record, incident, "incident.detected")
    record.resume_on_start = False
    s.table.transition(record, S.RECOVERING, "daemon restarted", incident=incident.id)
    return ReplayVerifier(plan, incident)


def unsafe_path(s: Services, record: JobRecord, error: UnsafePathError) -> None:
    """A path the daemon writes for the job is a link or not its own: the job is escalated
    with an ``unsafe_path`` incident naming it.  When that incident cannot be written either
    (the incident log is the path), state.json's ``error`` and the daemon's log say so."""
    record.error = f"unsafe_path: {error.message}"
    now = time.time()
    incident = Incident(
        id=f"{record.id}-{len(record.incidents) + 1}",
        job=record.id,
        kind=IncidentKind.UNSAFE_PATH,
        opened=now,
        attempt=record.attempt,
        symptom=f"A path the daemon writes for job {record.id} is unsafe: {error.message}.",
        evidence={"path": error.path},
        details={k: str(v) for k, v in error.evidence.items()},
        outcome="Escalated: nothing was written through the path, and no attempt follows "
        "until a person removes what is there and resumes the job.",
        status="escalated",
        prevention=["Only the daemon's user may write under its root; find who planted it."],
        closed=now,
    )
    try:
        s.incidents.open(record, incident, "incident.escalated")
    except UnsafePathError as unwritten:
        record.error += f" (incident {incident.id} not recorded: {unwritten.message})"
    log.error("job.unsafe_path", job=record.id, path=error.path, error=record.error)
    if S.ESCALATED in TRANSITIONS[record.state]:
        s.table.transition(record, S.ESCALATED, record.error, incident=incident.id)
    else:  # already settled (completed, say): the refusal is kept in its record
        s.table.save(record)


def recovered_unverified(
    s: Services, record: JobRecord, attempt: Attempt, verifier: ReplayVerifier
) -> None:
    """A plain program's recovery attempt has started: its incident is concluded unverified
    at once (no state was logged, so there is nothing to wait for) and the job runs on."""
    verifier.unverifiable()
    incident = verifier.incident
    incident.action = plain.recovery_action(attempt, incident)
    s.incidents.conclude(
        incident, "unverified", plain.unverified_text(attempt), "incident.unverified"
    )
    if record.state is S.RECOVERING:
        s.table.transition(
            record, S.RUNNING, "recovery unverified (a plain program)", verdict="unverified"
        )


def preempt(
    s: Services, record: JobRecord, outcome: policy.Preempted, info: ExitInfo | None
) -> None:
    """The job waits, for resume or the next daemon start."""
    record.resume_on_start = outcome.resume_on_start
    exit_status = {"exit_status": info.status} if info is not None else {}
    s.table.transition(record, S.PREEMPTED, outcome.reason, **exit_status)


def cut_short(s: Services, record: JobRecord, incident: Incident) -> None:
    """The job came to rest (a stop, a cancel, a shutdown, a refusal) while the recovery of
    ``incident`` was under way: it is concluded ``interrupted``, naming the job's state, as
    no later attempt carries its proof on."""
    text = (
        f"Interrupted: the job came to rest before its recovery was proven; it is "
        f"{record.state.value} ({record.reason}). No later attempt carries this proof on."
    )
    try:
        s.incidents.conclude(incident, "interrupted", text, "incident.interrupted")
    except UnsafePathError as error:  # the job rests escalated for it already (`unsafe_path`)
        log.error("incident.refused", job=record.id, incident=incident.id, error=error.message)
        return
    log.info("incident.interrupted", job=record.id, incident=incident.id, state=record.state)


def escalate_mismatch(
    s: Services, record: JobRecord, outcome: policy.Escalate, incident: Incident
) -> None:
    """A replayed state differed: the recovery's own incident is escalated."""
    s.incidents.conclude(incident, "escalated", verification.MISMATCH_OUTCOME, "incident.escalated")
    s.table.transition(record, S.ESCALATED, outcome.reason, incident=incident.id)


def exit_text(attempt: Attempt, info: ExitInfo, refusal: UnsafePathError | None) -> str:
    """The text of an ended attempt's exit.json."""
    record = {**info.as_record(), "stopped_by": attempt.stop_reason, "ended": time.time()}
    if attempt.superseded is not None:  # a stall's stop, say, that an operator's overtook
        record["superseded"] = attempt.superseded
    if refusal is not None:
        record["stopped_by"] = f"unsafe path {refusal.path}"
    return json.dumps(record, indent=2) + "\n"


async def keep_exit(folder: Path, files: dict[str, str]) -> None:
    """Keep an ended attempt's evidence ``files`` (name: text) in its ``folder``, each
    atomically and all at once, off the loop: their fsyncs overlap, and the loop answers
    meanwhile.  A failure to write is logged (`evidence.keep`, or here); raises the first
    `UnsafePathError` once every write is done."""
    kept = [off_loop(evidence.keep, folder / name, text) for name, text in files.items()]
    for found in await asyncio.gather(*kept, return_exceptions=True):
        if isinstance(found, UnsafePathError):
            raise found
        if isinstance(found, BaseException):
            log.error("evidence.keep_failed", folder=str(folder), error=repr(found))


def failure(
    s: Services,
    record: JobRecord,
    outcome: policy.Escalate | policy.Fail | policy.Restart,
    attempt: Attempt,
    info: ExitInfo,
) -> Incident:
    """A failed attempt: its incident, the end of a recovery it was making, and the state
    (recovering, escalated or failed); returns the new incident."""
    kind = outcome.kind
    incident = diagnosis.failure_incident(
        attempt,
        kind,
        diagnosis.symptom(attempt, info, kind),
        len(record.incidents) + 1,
        s.root.checkpoints / record.checkpoint,
    )
    s.incidents.open(record, incident, "incident.detected")
    log.warning("incident.detected", job=record.id, incident=incident.id, kind=kind.value)
    recovering = attempt.incident
    if recovering is not None:
        s.incidents.conclude(
            recovering,
            "failed",
            diagnosis.recovery_failed_text(attempt.number, incident.id),
            "incident.recovery_failed",
        )
    if not isinstance(outcome, policy.Escalate) and outcome.budget is not None:
        spent = outcome.budget
        record.restarts_without_progress = spent.without_progress
        record.failure_times = list(spent.failures)
        record.no_progress = list(spent.attempts)
    if isinstance(outcome, policy.Fail) and outcome.loop is not None:
        incident.details["crash_loop"] = {
            "deterministic": outcome.loop.deterministic,
            "attempts": list(outcome.loop.attempts),
        }
    if isinstance(outcome, policy.Restart):
        record.restarts += 1
        incident.details["backoff_s"] = outcome.delay_s
        s.incidents.write(incident, "incident.opened")
        s.table.transition(record, S.RECOVERING, outcome.reason, incident=incident.id)
        return incident
    if isinstance(outcome, policy.Escalate):
        status, state = "escalated", S.ESCALATED
        text = diagnosis.escalated_text(attempt, kind)
    else:
        status, state = "failed", S.FAILED
        text = diagnosis.failed_text(record, outcome)
    s.incidents.conclude(incident, status, text, f"incident.{status}")
    s.table.transition(record, state, outcome.reason, incident=incident.id)
    return incident


LAUNCH_PREVENTION = {
    errno.E2BIG: "Keep each command argument and each NAME=value of env under 128 KiB, and all "
    "of them with the daemon's environment under a quarter of its stack limit (ulimit -s); "
    "pass large data in a file.",
    errno.ENOENT: "Check that command[0] is on the worker environment's PATH (or give its "
    "absolute path) and that the workdir exists.",
    errno.EACCES: "Check that command[0] is a file the daemon's user may execute.",
    errno.ENOEXEC: "Check that command[0] is a program (a script needs its #! line).",
}
"""What to mend for the errno a launch failed with; any other: what the error names."""


def launch_failed(
    s: Services, record: JobRecord, number: int, error: Exception, recovery: Incident | None
) -> None:
    """Attempt ``number`` could not be started (the launcher refused it, or execve failed): a
    ``launch_failed`` incident, concluded failed at once, as no launch failure is retried (the
    same request would meet it again); a recovery it was to make fails with it."""
    code = error.errno if isinstance(error, OSError) else None
    details: dict[str, Any] = {"error": str(error), "launcher": s.launcher.name}
    if code is not None:
        details["errno"] = errno.errorcode.get(code, str(code))
    if isinstance(error, JobwardenError):
        details.update({k: str(v) for k, v in error.evidence.items()})
    incident = Incident(
        id=f"{record.id}-{len(record.incidents) + 1}",
        job=record.id,
        kind=IncidentKind.LAUNCH_FAILED,
        opened=time.time(),
        attempt=number,
        symptom=f"Attempt {number} of {record.job.label()} could not be launched "
        f"({s.launcher.name} launcher): {error}.",
        evidence={"attempt folder": str(s.root.attempt(record.id, number))},
        details=details,
        prevention=[
            LAUNCH_PREVENTION.get(code or 0, "Mend what the error names."),
            "Then resume the job (wardenctl resume): a launch failure is never retried.",
        ],
    )
    s.incidents.open(record, incident, "incident.detected")
    log.error("incident.launch_failed", job=record.id, incident=incident.id, error=str(error))
    if recovery is not None and recovery.status == "open":
        s.incidents.conclude(
            recovery,
            "failed",
            diagnosis.recovery_failed_text(number, incident.id),
            "incident.recovery_failed",
        )
    text = "Failed: no worker was started, and a launch failure is never retried."
    s.incidents.conclude(incident, "failed", text, "incident.failed")
    reason = f"attempt {number} could not be launched: {error}"
    s.table.transition(record, S.FAILED, reason, incident=incident.id)


def refuse_duplicate(
    s: Services, record: JobRecord, refusal: policy.Escalate, owner: JobRecord
) -> None:
    """No worker was started: a live job owns the checkpoint."""
    incident = diagnosis.duplicate_writer_incident(record, owner, len(record.incidents) + 1, s.root)
    s.incidents.open(record, incident, "incident.duplicate_writer_prevented")
    log.warning(
        "incident.duplicate_writer_prevented",
        job=record.id,
        owner=owner.id,
        checkpoint=record.checkpoint,
    )
    s.table.transition(record, S.ESCALATED, refusal.reason, incident=incident.id)
