"""Proving a recovery as it happens, from the resumed attempt's own events.

The `ReplayPlan` holds what the failed attempt logged; `ReplayVerifier` follows
the resumed attempt (restored, ready, progress) and records the proof in the
incident: the recovery point, the boundary check, every replayed update, and
then either the verified outcome or an escalation.
"""

from __future__ import annotations

from jobwarden.daemon.attempt import Attempt
from jobwarden.daemon.incidents import IncidentLog
from jobwarden.daemon.jobs import JobTable
from jobwarden.events import Event
from jobwarden.states import JobState

S = JobState


class ReplayVerifier:
    """Verifies recovering attempts for the daemon's loop."""

    def __init__(self, table: JobTable, incidents: IncidentLog) -> None:
        self.table = table
        self.incidents = incidents

    def progress(self, attempt: Attempt, event: Event) -> None:
        """One resumed update: compare it with the log, finish when the log is exhausted."""
        plan = attempt.plan
        if plan is not None:
            if not plan.observe(event["step"], event.get("state_hash"), "update"):
                self.escalate(attempt)
                return
            if plan.done(event["step"]):
                self.finish(attempt)
        if attempt.pending_time_lost is not None:
            self.time_lost(attempt, event)

    def restored(self, attempt: Attempt, event: Event) -> None:
        """The recovery point: which file, which checks it passed, what was passed over."""
        attempt.record.newest_checkpoint_step = event["step"]
        if attempt.plan is None or attempt.incident is None:
            return
        attempt.plan.restored_step = event["step"]
        incident = attempt.incident
        incident.recovery_point = {
            "step": event["step"],
            "file": event["file"],
            "checks": event["checks"],
            "checksum": event.get("checksum"),
            "state_hash": event["state_hash"],
            "writer_generation": event.get("writer_generation"),
            "skipped": event["skipped"],
        }
        for skipped in event["skipped"]:
            incident.evidence[f"quarantined {skipped['file']}"] = skipped["quarantined_to"]
        self.incidents.write(incident, "incident.recovery_point")

    def ready(self, attempt: Attempt, event: Event) -> None:
        """The resumed state against the failed attempt's logged state at that step."""
        plan, incident = attempt.plan, attempt.incident
        assert plan is not None
        if plan.restored_step is None:
            plan.restored_step = event["step"]
            if incident is not None and event["step"] == 0:
                incident.recovery_point = {"fresh": True, "step": 0}
        if incident is not None:
            incident.replayed_steps = plan.to_verify()
            delay = incident.details.get("backoff_s", 0.0)
            incident.action = {
                "attempt": attempt.number,
                "pid": attempt.process.pid,
                "writer_generation": event.get("generation"),
                "text": (
                    f"Started attempt {attempt.number} (pid {attempt.process.pid}, writer "
                    f"generation {event.get('generation')}) as the single writer of "
                    f"checkpoint '{attempt.record.checkpoint}', with faults off, resuming "
                    f"from step {plan.restored_step} after a {delay:.2f} s backoff (restart "
                    f"{attempt.record.restarts} of at most "
                    f"{attempt.record.job.supervision.max_restarts})."
                ),
            }
        if not plan.observe(event["step"], event["state_hash"], "restored state"):
            self.escalate(attempt)
            return
        if plan.done(event["step"]):
            self.finish(attempt)

    def finish(self, attempt: Attempt) -> None:
        """Every logged update reproduced: the incident is verified, the job runs on."""
        plan, incident, record = attempt.plan, attempt.incident, attempt.record
        assert plan is not None
        attempt.plan = None
        record.replayed_updates += plan.replayed_updates
        verdict = plan.verdict()
        if incident is not None:
            replayed = [c["step"] for c in plan.checks if c["what"] == "update"]
            text = (
                f"verified: all {len(plan.checks)} logged state(s) reproduced exactly "
                f"(restored state and updates {', '.join(map(str, replayed)) or 'none'})."
                if verdict == "verified"
                else "unverified: the failed attempt logged no state at or after the recovery "
                "point, so there was nothing to compare; the restored checkpoint passed "
                "every validation check."
            )
            incident.verification = {"verdict": verdict, "checks": plan.checks, "text": text}
            attempt.resolved.append(incident)
            attempt.pending_time_lost = incident if plan.last_progress_time is not None else None
            self.incidents.conclude(
                incident,
                verdict,
                f"Recovered: attempt {attempt.number} continues the same "
                f"experiment from step {plan.restored_step}; the job runs on.",
                f"incident.{verdict}",
            )
        if record.state is S.RECOVERING:
            self.table.transition(record, S.RUNNING, f"recovery {verdict}", verdict=verdict)
        attempt.incident = None

    def time_lost(self, attempt: Attempt, event: Event) -> None:
        """The first new update past the failure: record the time the failure cost."""
        incident = attempt.pending_time_lost
        assert incident is not None
        last_logged = incident.boundary.get("last_logged_step", 0)
        if event["step"] <= last_logged:
            return
        attempt.pending_time_lost = None
        lost_since = incident.details.get("last_progress_time") or incident.opened
        incident.time_lost_s = max(0.0, event["time"] - lost_since)
        attempt.record.time_lost_s += incident.time_lost_s
        self.table.save(attempt.record)
        self.incidents.write(incident, "incident.goodput")

    def escalate(self, attempt: Attempt) -> None:
        """A replayed state differs from the log: kill the worker, keep everything, escalate."""
        plan, record = attempt.plan, attempt.record
        assert plan is not None
        assert plan.mismatch is not None
        bad = plan.mismatch
        incident = attempt.incident
        assert incident is not None  # a recovering attempt always carries its incident
        incident.verification = {
            "verdict": "mismatch",
            "checks": plan.checks,
            "text": (
                f"MISMATCH at step {bad['step']} ({bad['what']}): the failed attempt logged "
                f"`{bad['logged']}`, the resumed attempt produced `{bad['found']}`. The "
                "resumed run is a different experiment."
            ),
        }
        incident.prevention.append(
            "Find why the replay differs before resuming: a changed "
            "runtime, nondeterministic kernels, or state the checkpoint "
            "does not hold."
        )
        self.incidents.conclude(
            incident,
            "escalated",
            "Escalated: the worker was stopped at once (SIGKILL, so it commits "
            "nothing more), every file is kept, and no restart follows. A person "
            "must compare the saved key, momentum, step and the data, config and "
            "source hashes (wardenctl inspect) before deciding.",
            "incident.escalated",
        )
        attempt.plan = None
        attempt.process.stop_reason = "mismatch"
        attempt.process.kill_group()
        self.table.transition(
            record, S.ESCALATED, f"replay mismatch at step {bad['step']}", incident=incident.id
        )
