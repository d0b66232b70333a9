"""The exit policy: one rule per test, pure and in microseconds."""

from __future__ import annotations

from typing import Any

import pytest

from jobwarden.daemon.launch.base import ExitInfo
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.supervise import policy
from jobwarden.daemon.supervise.policy import (
    AttemptReport,
    Completed,
    Escalate,
    Fail,
    IncidentKind,
    Preempted,
    Restart,
    StopReason,
)
from jobwarden.errors import JobFileError, PreemptedExit
from jobwarden.jobfile import job_from_mapping

K = IncidentKind


def record(restarts: int = 0, step: int = 5, **supervision: Any) -> JobRecord:
    """A job record with the given restart count (each of them without progress, the count
    ``max_restarts`` bounds) and [supervision] fields."""
    job = job_from_mapping({"id": "j", "task": "linreg", "supervision": supervision})
    return JobRecord(
        id="j", job=job, restarts=restarts, restarts_without_progress=restarts, step=step
    )


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
        """A plain program's restarts without progress are bounded by max_restarts like any
        job's (a run shorter than restart_reset_after_s is no progress)."""
        outcome = decide(
            AttemptReport(2, emits_events=False), 1, record(restarts=1, max_restarts=1)
        )
        assert isinstance(outcome, Fail)
        assert outcome.reason.startswith("crash; no progress in 2 attempts")


class TestBudget:
    def test_first_restart_is_immediate(self) -> None:
        """Restart 1 of a streak waits for nothing, whatever restart_backoff_s is."""
        outcome = decide(AttemptReport(1), 1, record(restarts=0, restart_backoff_s=0.5))
        assert Restart(0.0, "crash of attempt 1; restart 1 at once", K.CRASH, 1) == outcome

    def test_later_restarts_back_off_from_the_base(self) -> None:
        """The second restart in a row waits restart_backoff_s, and says so."""
        outcome = policy.decide(record(restarts=1), AttemptReport(2), exited(1), streak=1)
        assert Restart(0.5, "crash of attempt 2; restart 2 in 0.50 s", K.CRASH, 2) == outcome

    def test_backoff_doubles_per_restart_in_a_row(self) -> None:
        """0, 0.5, 1, 2, 4 s for restarts 1..5 of quick failures."""
        delays, streak, rec = [], 0, record(max_restarts=9)
        for used in range(5):
            rec.restarts = used
            outcome = policy.decide(rec, AttemptReport(used + 1), exited(1), streak)
            assert isinstance(outcome, Restart)
            delays.append(outcome.delay_s)
            streak = outcome.streak
        assert delays == [0.0, 0.5, 1.0, 2.0, 4.0]

    def test_last_restart_within_budget_is_granted(self) -> None:
        """restarts == max_restarts - 1 still restarts."""
        outcome = decide(AttemptReport(3), 1, record(restarts=2, max_restarts=3))
        assert isinstance(outcome, Restart)

    def test_spent_budget_fails(self) -> None:
        """restarts without progress == max_restarts fails with the kind named."""
        outcome = decide(AttemptReport(4), 1, record(restarts=3, max_restarts=3))
        assert isinstance(outcome, Fail)
        assert outcome.kind is K.CRASH
        assert outcome.reason.startswith("crash; no progress in 4 attempts")
        assert outcome.reason.endswith("(max_restarts 3)")

    def test_no_restarts_allowed_fails_at_once(self) -> None:
        """max_restarts = 0: the first failure is final, progress or not."""
        report = AttemptReport(1, stopped_by=StopReason.STALL, committed_step=4)
        outcome = decide(report, -9, record(max_restarts=0))
        assert Fail("stall; max_restarts = 0: no restart", K.STALL) == outcome

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


class TestBackoff:
    """The exponential backoff, its cap and its reset: pure functions of counts and times."""

    @pytest.mark.parametrize(
        ("streak", "expected"), [(0, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (60, 30.0)]
    )
    def test_backoff_s_doubles_up_to_the_cap(self, streak: int, expected: float) -> None:
        """None for the first, then base * 2^(n-1), never above the cap."""
        assert expected == policy.backoff_s(streak, 0.5, 30.0)

    def test_the_cap_applies_in_decide(self) -> None:
        """restart_backoff_max_s bounds the wait of a long streak."""
        rec = record(restarts=5, max_restarts=9, restart_backoff_max_s=1.5)
        outcome = policy.decide(rec, AttemptReport(6), exited(1), streak=5)
        assert isinstance(outcome, Restart)
        assert (outcome.delay_s, outcome.streak) == (1.5, 6)

    def test_a_healthy_run_resets_the_backoff(self) -> None:
        """An attempt that ran restart_reset_after_s is restarted at once, a new streak."""
        rec = record(restarts=4, max_restarts=9, restart_reset_after_s=10.0)
        outcome = policy.decide(rec, AttemptReport(5), ExitInfo.from_status(-9, 10.0), streak=4)
        assert Restart(0.0, "crash of attempt 5; restart 5 at once", K.CRASH, 1) == outcome

    def test_a_run_just_short_of_the_reset_keeps_backing_off(self) -> None:
        """9.99 s of a 10 s reset is not healthy: the streak goes on."""
        rec = record(restarts=2, max_restarts=9, restart_reset_after_s=10.0)
        outcome = policy.decide(rec, AttemptReport(3), ExitInfo.from_status(-9, 9.99), streak=2)
        assert isinstance(outcome, Restart)
        assert (outcome.delay_s, outcome.streak) == (1.0, 3)

    def test_the_reset_does_not_refill_the_restart_budget(self) -> None:
        """A long run that commits nothing is no progress: a healthy run's length resets the
        wait, not the budget (only a newer checkpoint does)."""
        rec = record(restarts=3, max_restarts=3)
        outcome = policy.decide(rec, AttemptReport(4), ExitInfo.from_status(1, 3600.0), streak=0)
        assert isinstance(outcome, Fail)
        assert outcome.reason.startswith("crash; no progress in 4 attempts")

    @pytest.mark.parametrize(("previous", "ran_s", "expected"), [(3, 0.2, 3), (3, 10.0, 0)])
    def test_streak_of(self, previous: int, ran_s: float, expected: int) -> None:
        """The streak survives a short run and ends at restart_reset_after_s."""
        assert expected == policy.streak_of(previous, ran_s, 10.0)

    def test_defaults(self) -> None:
        """0.5 s base, 30 s cap, reset after 10 s, no fatal exit codes."""
        sup = record().job.supervision
        expected = (0.5, 30.0, 10.0, ())
        actual = (
            sup.restart_backoff_s,
            sup.restart_backoff_max_s,
            sup.restart_reset_after_s,
            sup.fatal_exit_codes,
        )
        assert expected == actual


class TestFatalExitCodes:
    """RestartPreventExitStatus-style rules: the listed exits fail the job, unrestarted."""

    def test_a_listed_exit_fails_with_restarts_left(self) -> None:
        """Exit 3 in fatal_exit_codes fails the job although restarts remain."""
        outcome = decide(AttemptReport(1), 3, record(fatal_exit_codes=[3, 4]))
        assert Fail("crash; exit status 3 is in fatal_exit_codes", K.CRASH) == outcome

    def test_an_unlisted_exit_restarts(self) -> None:
        """Exit 5 is not listed: restarted as any crash."""
        assert isinstance(decide(AttemptReport(1), 5, record(fatal_exit_codes=[3, 4])), Restart)

    def test_a_kill_by_signal_is_never_fatal(self) -> None:
        """A negative status (killed by a signal) is not an exit code."""
        assert isinstance(decide(AttemptReport(1), -9, record(fatal_exit_codes=[9])), Restart)

    def test_an_exit_after_the_daemons_own_stop_keeps_its_kind(self) -> None:
        """A stalled worker stopped by the daemon is a stall, whatever status it exits with."""
        outcome = decide(
            AttemptReport(1, stopped_by=StopReason.STALL), 75, record(fatal_exit_codes=[75])
        )
        assert isinstance(outcome, Restart)
        assert outcome.kind == K.STALL

    def test_an_escalating_refusal_stays_an_escalation(self) -> None:
        """A worker's refusal a restart cannot mend escalates even when its status is listed."""
        report = AttemptReport(1, failure_code="checkpoint.config", failure_message="m")
        outcome = decide(report, 25, record(fatal_exit_codes=[25]))
        assert isinstance(outcome, Escalate)

    @pytest.mark.parametrize("bad", [[0], [256], ["3"], 3])
    def test_invalid_codes_are_refused(self, bad: object) -> None:
        """Codes are integers 1..255 in a list."""
        with pytest.raises(JobFileError, match="fatal_exit_codes"):
            record(fatal_exit_codes=bad)


@pytest.mark.parametrize(
    ("new", "old", "takes_its_place"),
    [
        (StopReason.OPERATOR, StopReason.STALL, True),
        (StopReason.SHUTDOWN, StopReason.RSS, True),
        (StopReason.STALL, StopReason.OPERATOR, False),
        (StopReason.OPERATOR, StopReason.SHUTDOWN, False),
        (StopReason.OPERATOR, StopReason.MISMATCH, False),
        (StopReason.RSS, StopReason.STALL, False),
    ],
)
def test_a_preempting_stop_supersedes_only_one_that_would_restart(
    new: StopReason, old: StopReason, takes_its_place: bool
) -> None:
    """An operator's stop or a shutdown takes the place of a stall's or the memory limit's
    stop under way (the job is preempted, as asked); nothing takes a mismatch's place."""
    assert policy.supersedes(new, old) is takes_its_place
