"""How each `Outcome` is written down: the incidents it opens or concludes, and the transition.

The policy decides; the supervisor calls these to record the decision, then
frees the job's slot or schedules its restart.  Each function leaves the job
in the state its outcome names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from jobwarden.daemon import diagnosis, plain, policy
from jobwarden.daemon.attempt import Attempt
from jobwarden.daemon.incidents import Incident
from jobwarden.daemon.jobs import JobRecord
from jobwarden.daemon.launcher import ExitInfo
from jobwarden.daemon.recovery import Verdict
from jobwarden.daemon.verification import ReplayVerifier
from jobwarden.states import JobState

if TYPE_CHECKING:
    from jobwarden.daemon.supervisor import Services

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
    s.table.transition(record, S.COMPLETED, outcome.reason, step=record.step)


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


def escalate_mismatch(
    s: Services, record: JobRecord, outcome: policy.Escalate, incident: Incident
) -> None:
    """A replayed state differed: the recovery's own incident is escalated."""
    s.incidents.conclude(incident, "escalated", diagnosis.MISMATCH_OUTCOME, "incident.escalated")
    s.table.transition(record, S.ESCALATED, outcome.reason, incident=incident.id)


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
    if isinstance(outcome, policy.Restart):
        record.restarts += 1
        incident.details["backoff_s"] = outcome.delay_s
        s.incidents.write(incident, "incident.opened")
        s.table.transition(record, S.RECOVERING, outcome.reason, incident=incident.id)
        return incident
    escalate = isinstance(outcome, policy.Escalate)
    status, state = ("escalated", S.ESCALATED) if escalate else ("failed", S.FAILED)
    text = diagnosis.escalated_text(attempt, kind) if escalate else diagnosis.failed_text(record)
    s.incidents.conclude(incident, status, text, f"incident.{status}")
    s.table.transition(record, state, outcome.reason, incident=incident.id)
    return incident


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
