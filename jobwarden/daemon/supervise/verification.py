"""Proving a recovery as it happens, from the resumed attempt's own events.

The `ReplayPlan` holds what the failed attempt logged; a `ReplayVerifier`
follows one resumed attempt (restored, ready, progress), writes the proof into
the recovery's incident (the recovery point, the boundary check, every
replayed update) and returns a `Verdict`.  It does no I/O and never acts on the
attempt: its job's supervisor persists the incident and decides what a
verdict means.
"""

from __future__ import annotations

from typing import Any

from jobwarden.daemon.incidents.records import Incident
from jobwarden.events import Event, step_ranges
from jobwarden.proof.replay import ReplayPlan, Verdict

V = Verdict
NO_SDK = "unverified: the program uses no SDK and logged no state"
"""The verification of every recovery of a plain program."""
INEXACT = (
    "unverified: the job gave up bit-exact replay ([run] exact = false: XLA's CPU backend "
    "on its own threads may round a sum differently from one run to the next), so its "
    "replayed states are not compared; the restored checkpoint passed every validation check"
)
"""The verification of every recovery of a job that runs with ``[run] exact = false``."""


class ReplayVerifier:
    """Compares one recovering attempt with the failed attempt's log."""

    def __init__(self, plan: ReplayPlan, incident: Incident) -> None:
        self.plan = plan
        self.incident = incident
        self.verdict = V.PENDING
        self.time_lost_s: float | None = None

    def restored(self, event: Event) -> None:
        """The recovery point: which file, which checks it passed, what was passed over."""
        self.plan.restored_step = event["step"]
        incident = self.incident
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

    def ready(self, event: Event, *, exact: bool = True) -> Verdict:
        """The resumed state against the failed attempt's logged state at that step; for a
        job that gave up exactness (``exact=False``), unverified at once (`INEXACT`)."""
        plan = self.plan
        if plan.restored_step is None:
            plan.restored_step = event["step"]
            if event["step"] == 0:
                self.incident.recovery_point = {"fresh": True, "step": 0}
        self.incident.replayed_steps = plan.to_verify()
        if not exact:
            return self.unverifiable(INEXACT)
        return self._observe(event["step"], event["state_hash"], "restored state")

    def progress(self, event: Event) -> Verdict:
        """One resumed update: compare it with the log; settle when the log is exhausted."""
        if self.verdict in (V.VERIFIED, V.UNVERIFIED):
            self._time_lost(event)
        if self.verdict is not V.PENDING:
            return self.verdict
        return self._observe(event["step"], event.get("state_hash"), "update")

    def unverifiable(self, text: str = NO_SDK) -> Verdict:
        """A recovery nothing is compared for (a plain program's: nothing was logged), and
        why."""
        self.verdict = V.UNVERIFIED
        self.incident.verification = {"verdict": V.UNVERIFIED.value, "checks": [], "text": text}
        return self.verdict

    def settle(self) -> Verdict:
        """Conclude with what has been compared so far (the attempt completed first)."""
        if self.verdict is V.PENDING:
            self._conclude(self.plan.verdict())
        return self.verdict

    def _observe(self, step: int, state_hash: str | None, what: str) -> Verdict:
        if not self.plan.observe(step, state_hash, what):
            self._conclude(V.MISMATCH)
        elif self.plan.done(step):
            self._conclude(self.plan.verdict())
        return self.verdict

    def _conclude(self, verdict: Verdict) -> None:
        plan, incident = self.plan, self.incident
        self.verdict = verdict
        if verdict is V.MISMATCH and plan.mismatch is not None:
            bad = plan.mismatch
            text = (
                f"MISMATCH at step {bad['step']} ({bad['what']}): the failed attempt logged "
                f"`{bad['logged']}`, the resumed attempt produced `{bad['found']}`. The "
                "resumed run is a different experiment."
            )
            incident.prevention.append(
                "Find why the replay differs before resuming: a changed runtime, "
                "nondeterministic kernels, or state the checkpoint does not hold."
            )
        elif verdict is V.VERIFIED:
            replayed = [c["step"] for c in plan.checks if c["what"] == "update"]
            text = (
                f"verified: all {len(plan.checks)} logged state(s) reproduced exactly "
                f"(restored state and updates {step_ranges(replayed)})."
            )
        else:
            text = (
                "unverified: the failed attempt logged no state at or after the recovery "
                "point, so there was nothing to compare; the restored checkpoint passed "
                "every validation check."
            )
        incident.verification = {"verdict": verdict.value, "checks": plan.checks, "text": text}

    def _time_lost(self, event: Event) -> None:
        """The first new update past the failure: record the time the failure cost."""
        if self.time_lost_s is not None or self.plan.last_progress_time is None:
            return
        if event["step"] <= self.incident.boundary.get("last_logged_step", 0):
            return
        lost_since = self.incident.details.get("last_progress_time") or self.incident.opened
        self.time_lost_s = max(0.0, event["time"] - lost_since)
        self.incident.time_lost_s = self.time_lost_s

    @property
    def mismatch_step(self) -> int | None:
        """The step whose replayed state differed, if one did."""
        return self.plan.mismatch["step"] if self.plan.mismatch else None


def mismatch_continued_text(attempt: int, step: int | None) -> str:
    """The outcome of a replay that differed in a job that goes on regardless."""
    return (
        f"Mismatch, continued: attempt {attempt} replayed update {step} differently, so it "
        "runs a different experiment from the one that failed; the job asked to go on "
        "(on_mismatch = continue), so it was not stopped. Every later recovery of this "
        "job is unverifiable past this step; `wardenctl verify` and the drills still "
        "refuse it."
    )


def past_divergence_text(diverged: dict[str, Any]) -> str:
    """What a later recovery's outcome adds once its job has diverged."""
    return (
        f" It reproduced the attempt before it, which had already diverged at step "
        f"{diverged['step']} (incident {diverged['incident']}): the job is unverifiable "
        "past that step."
    )


MISMATCH_OUTCOME = (
    "Escalated: the attempt was stopped at once (SIGKILL, so it commits nothing more), "
    "every file is kept, and no restart follows. A person must compare the saved state's "
    "components (the one the verification names first), its step and the data, config "
    "and source hashes (wardenctl inspect) before deciding. To start fresh: "
    "`wardenctl remove JOB`, then submit; or `wardenctl submit --replace FILE`."
)
