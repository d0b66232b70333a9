"""The exit policy: one rule per test, pure and in microseconds."""

from __future__ import annotations

from typing import Any

import pytest

from jobwarden.daemon import policy
from jobwarden.daemon.jobs import JobRecord
from jobwarden.daemon.launcher import ExitInfo
from jobwarden.daemon.policy import (
    AttemptReport,
    Completed,
    Escalate,
    Fail,
    IncidentKind,
    Preempted,
    Restart,
    StopReason,
)
from jobwarden.errors import PreemptedExit
from jobwarden.jobfile import job_from_mapping

K = IncidentKind


def record(restarts: int = 0, step: int = 5, **supervision: Any) -> JobRecord:
    """A job record with the given restart count and [supervision] fields."""
    job = job_from_mapping({"id": "j", "task": "linreg", "supervision": supervision})
    return JobRecord(id="j", job=job, restarts=restarts, step=step)


def exited(status: int) -> ExitInfo:
    """An exit with ``status``."""
    return ExitInfo.from_status(status, 1.0)


def decide(report: AttemptReport, status: int, rec: JobRecord | None = None) -> policy.Outcome:
    """policy.decide with a default record."""
    return policy.decide(rec or record(), report, exited(status))


class TestDecide:
    def test_completed_with_status_zero_is_completed(self) -> None:
        """A completed event and exit 0 finish the job."""
        assert Completed("attempt 2 completed") == decide(
            AttemptReport(2, completed=True), status=0
        )

    def test_status_zero_without_completed_is_a_crash(self) -> None:
        """Exit 0 without the completed event is not a success."""
        outcome = decide(AttemptReport(1), status=0)
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.CRASH

    def test_completed_with_nonzero_status_is_a_crash(self) -> None:
        """A completed event followed by a failing exit is not trusted."""
        outcome = decide(AttemptReport(1, completed=True), status=1)
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.CRASH

    def test_operator_stop_preempts(self) -> None:
        """An operator's stop waits for resume, whatever the exit status."""
        assert Preempted("stopped by operator at step 5") == decide(
            AttemptReport(1, stopped_by=StopReason.OPERATOR), status=PreemptedExit.exit_status
        )

    def test_operator_stop_of_a_completed_attempt_completes(self) -> None:
        """A stop that arrives after the last update does not undo the completion."""
        outcome = decide(AttemptReport(1, completed=True, stopped_by=StopReason.OPERATOR), 0)
        assert isinstance(outcome, Completed)

    def test_shutdown_preempts_and_resumes_on_start(self) -> None:
        """The daemon's own shutdown marks the job for resumption at the next start."""
        assert Preempted(
            "daemon shutdown preempted attempt 3 at step 5", resume_on_start=True
        ) == decide(AttemptReport(3, stopped_by=StopReason.SHUTDOWN), status=75)

    def test_mismatch_escalates_even_if_completed(self) -> None:
        """A replay mismatch is a different experiment: escalate, never complete."""
        report = AttemptReport(2, completed=True, stopped_by=StopReason.MISMATCH, mismatch_step=4)
        assert Escalate("replay mismatch at step 4", K.REPLAY_MISMATCH) == decide(report, 0)

    @pytest.mark.parametrize(
        ("stopped_by", "kind"),
        [(StopReason.STALL, K.STALL), (StopReason.RSS, K.RSS_LIMIT)],
    )
    def test_daemon_stops_are_restarted_as_their_kind(
        self, stopped_by: StopReason, kind: IncidentKind
    ) -> None:
        """A stall or memory stop is a failure of that kind, restarted."""
        outcome = decide(AttemptReport(1, stopped_by=stopped_by), status=-9)
        assert isinstance(outcome, Restart)
        assert kind == outcome.kind

    def test_killed_by_a_signal_is_a_crash(self) -> None:
        """SIGKILL from outside is a crash."""
        outcome = decide(AttemptReport(1), status=-9)
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.CRASH

    def test_a_preempted_exit_nobody_asked_for_is_restarted(self) -> None:
        """Exit 75 without a stop of ours (SIGTERM from outside) resumes at once."""
        outcome = decide(AttemptReport(1), status=PreemptedExit.exit_status)
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.PREEMPTION

    @pytest.mark.parametrize(
        ("code", "kind"),
        [
            ("checkpoint.config", K.INCOMPATIBLE_CHECKPOINT),
            ("checkpoint.runtime", K.INCOMPATIBLE_CHECKPOINT),
            ("checkpoint.generation", K.INCOMPATIBLE_CHECKPOINT),
            ("checkpoint.none_usable", K.CORRUPT_CHECKPOINT),
            ("writer.locked", K.DUPLICATE_WRITER),
            ("job.invalid", K.INVALID_REQUEST),
            ("resume.policy", K.RESUME_POLICY),
            ("worker.cache_unsafe", K.UNSAFE_CACHE),
        ],
    )
    def test_refusals_a_restart_cannot_mend_escalate(self, code: str, kind: IncidentKind) -> None:
        """Each escalating worker code escalates with its kind, restarts left or not."""
        report = AttemptReport(1, failure_code=code, failure_message="why")
        assert Escalate(f"{kind}: why", kind) == decide(report, status=20)

    def test_corrupt_files_do_not_escalate(self) -> None:
        """A checksum failure the worker met is not final: it quarantined and fell back."""
        outcome = decide(AttemptReport(1, failure_code="checkpoint.checksum"), status=22)
        assert isinstance(outcome, Restart)

    def test_every_incompatible_refusal_escalates(self) -> None:
        """All eleven incompatibility codes are in the escalating table."""
        incompatible = [
            c for c, k in policy.ESCALATING_CODES.items() if k is K.INCOMPATIBLE_CHECKPOINT
        ]
        assert len(incompatible) == 11


class TestPlainProgram:
    """A program without the SDK emits no events: its exit status is all it says."""

    def test_exit_zero_completes(self) -> None:
        """Exit 0 of a plain program the daemon did not stop is its completion."""
        assert Completed("attempt 1 completed") == decide(
            AttemptReport(1, emits_events=False), status=0
        )

    def test_exit_zero_after_a_stall_stop_is_a_stall(self) -> None:
        """A plain program that exits 0 on the daemon's SIGTERM after a stall did not finish."""
        outcome = decide(AttemptReport(1, stopped_by=StopReason.STALL, emits_events=False), 0)
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.STALL

    def test_exit_zero_after_a_memory_stop_is_an_rss_failure(self) -> None:
        """Stopped over max_rss_mb, exit 0 or not: an rss failure, restarted."""
        outcome = decide(AttemptReport(1, stopped_by=StopReason.RSS, emits_events=False), 0)
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.RSS_LIMIT

    def test_operator_stop_preempts_even_with_exit_zero(self) -> None:
        """An operator's stop of a plain program waits for resume, whatever it exits with."""
        report = AttemptReport(1, stopped_by=StopReason.OPERATOR, emits_events=False)
        assert Preempted("stopped by operator at step 5") == decide(report, 0)

    @pytest.mark.parametrize("status", [1, -9])
    def test_a_failing_exit_is_a_crash(self, status: int) -> None:
        """A nonzero exit or a signal is a crash, restarted within the budget."""
        outcome = decide(AttemptReport(1, emits_events=False), status)
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.CRASH

    def test_exit_75_is_a_crash_not_a_preemption(self) -> None:
        """75 is the SDK's preempted status; from a plain program it is just a failure."""
        outcome = decide(AttemptReport(1, emits_events=False), PreemptedExit.exit_status)
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.CRASH

    def test_spent_budget_fails(self) -> None:
        """A plain program's restarts are bounded by max_restarts like any job's."""
        outcome = decide(
            AttemptReport(2, emits_events=False), 1, record(restarts=1, max_restarts=1)
        )
        assert Fail("crash; max_restarts exhausted", K.CRASH) == outcome


class TestBudget:
    def test_first_restart_waits_the_base_backoff(self) -> None:
        """Restart 1 waits restart_backoff_s."""
        outcome = decide(AttemptReport(1), 1, record(restarts=0, restart_backoff_s=0.5))
        assert Restart(0.5, "crash of attempt 1; restart 1 in 0.50 s", K.CRASH) == outcome

    def test_backoff_doubles_per_restart(self) -> None:
        """0.5, 1, 2, 4 s for restarts 1..4."""
        delays = []
        for used in range(4):
            outcome = decide(AttemptReport(used + 1), 1, record(restarts=used, max_restarts=9))
            assert isinstance(outcome, Restart)
            delays.append(outcome.delay_s)
        assert delays == [0.5, 1.0, 2.0, 4.0]

    def test_last_restart_within_budget_is_granted(self) -> None:
        """restarts == max_restarts - 1 still restarts."""
        outcome = decide(AttemptReport(3), 1, record(restarts=2, max_restarts=3))
        assert isinstance(outcome, Restart)

    def test_spent_budget_fails(self) -> None:
        """restarts == max_restarts fails with the kind named."""
        outcome = decide(AttemptReport(4), 1, record(restarts=3, max_restarts=3))
        assert Fail("crash; max_restarts exhausted", K.CRASH) == outcome

    def test_no_restarts_allowed_fails_at_once(self) -> None:
        """max_restarts = 0: the first failure is final."""
        outcome = decide(AttemptReport(1, stopped_by=StopReason.STALL), -9, record(max_restarts=0))
        assert Fail("stall; max_restarts exhausted", K.STALL) == outcome

    def test_escalation_does_not_spend_the_budget(self) -> None:
        """An escalation with no restarts left is still an escalation, not a failure."""
        report = AttemptReport(1, failure_code="checkpoint.config", failure_message="m")
        outcome = decide(report, 20, record(restarts=3, max_restarts=3))
        assert isinstance(outcome, Escalate)


class TestAdmitAndLimits:
    def test_a_free_checkpoint_is_admitted(self) -> None:
        """No live owner: no refusal."""
        assert policy.admit(record(), None) is None

    def test_a_live_owner_is_a_duplicate_writer(self) -> None:
        """Another live job on the same checkpoint escalates before any worker starts."""
        owner = JobRecord(id="owner", job=record().job)
        assert Escalate(
            "duplicate writer prevented: checkpoint 'j' is owned by live job owner",
            K.DUPLICATE_WRITER,
        ) == policy.admit(record(), owner)

    @pytest.mark.parametrize(("rss", "over"), [(None, False), (4096.0, False), (4096.1, True)])
    def test_memory_limit_is_strictly_above(self, rss: float | None, over: bool) -> None:
        """At the limit is allowed; above it stops; no sample never stops."""
        assert over == policy.over_memory_limit(rss, 4096)

    def test_no_memory_limit_by_default(self) -> None:
        """max_rss_mb is off unless a job sets it: no rss ever stops a worker then."""
        assert record().job.supervision.max_rss_mb is None
        assert not policy.over_memory_limit(10**7, None)
