"""The restart budget judged by progress: one rule per test, on simulated time.

`policy.decide` is pure: each test feeds it attempt reports and wall-clock
instants (a month of them in milliseconds) and applies its counters to the
record as the supervisor's outcomes do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobwarden.daemon.launch.base import ExitInfo
from jobwarden.daemon.store.jobs import JobRecord, read_folder, state_text
from jobwarden.daemon.supervise import budget, policy
from jobwarden.daemon.supervise.policy import AttemptReport, Fail, IncidentKind, Restart
from jobwarden.errors import PreemptedExit
from jobwarden.jobfile import job_from_mapping

K = IncidentKind
HOUR = 3600.0
DAY = 24 * HOUR


def record(**supervision: Any) -> JobRecord:
    """A linreg job's record with the given [supervision] fields."""
    job = job_from_mapping({"id": "j", "task": "linreg", "supervision": supervision})
    return JobRecord(id="j", job=job)


def end(
    rec: JobRecord, report: AttemptReport, now: float, status: int = 1, ran_s: float = 60.0
) -> policy.Outcome:
    """Decide the end of ``report`` at ``now`` and keep the counters, as `outcomes.failure`
    does for a restart."""
    outcome = policy.decide(rec, report, ExitInfo.from_status(status, ran_s), 0, now)
    if isinstance(outcome, Restart | Fail) and outcome.budget is not None:
        rec.restarts_without_progress = outcome.budget.without_progress
        rec.failure_times = list(outcome.budget.failures)
        rec.no_progress = list(outcome.budget.attempts)
    if isinstance(outcome, Restart):
        rec.restarts += 1
    return outcome


def committing(number: int, restored: int | None, committed: int | None) -> AttemptReport:
    """An attempt that restored ``restored`` and committed up to ``committed``."""
    last = committed if committed is not None else None
    return AttemptReport(number, restored_step=restored, committed_step=committed, last_step=last)


def test_a_job_failing_every_hour_for_a_month_lives() -> None:
    """720 crashes an hour apart, each after a commit: every one restarted, none counted."""
    rec = record()
    for n in range(1, 721):
        outcome = end(rec, committing(n, restored=(n - 1) * 10, committed=n * 10), n * HOUR)
        assert isinstance(outcome, Restart), (n, outcome)
    assert rec.restarts == 720
    assert rec.restarts_without_progress == 0
    assert len(rec.failure_times) == 1  # the window holds only the last hour's


def test_a_job_failing_every_5_s_is_stopped_by_the_window_despite_its_commits() -> None:
    """Every attempt commits once, and fails 5 s after the last: the 21st failure within
    300 s fails the job, 100 s after the first."""
    rec = record()
    outcomes = [end(rec, committing(n, n - 1, n), 5.0 * n, ran_s=5.0) for n in range(1, 22)]
    assert all(isinstance(o, Restart) for o in outcomes[:20])
    last = outcomes[20]
    assert isinstance(last, Fail)
    assert last.reason == "crash; 21 failures within 300 s, over restart_limit 20"
    assert last.loop is None


def test_a_job_dying_before_any_new_commit_is_stopped_after_the_budget() -> None:
    """Restored step 2 each time, dead at update 3 each time, exit 1: restarts 1..3 are
    granted, the 4th attempt without progress fails the job as a deterministic failure."""
    rec = record()
    report = {"restored_step": 2, "committed_step": None, "last_step": 3}
    outcomes = [end(rec, AttemptReport(n, **report), n * HOUR) for n in range(1, 5)]
    assert [type(o) for o in outcomes] == [Restart, Restart, Restart, Fail]
    failed = outcomes[-1]
    assert isinstance(failed, Fail)
    assert failed.loop is not None
    assert failed.loop.deterministic
    assert failed.reason == (
        "crash; no progress in 4 attempts: each died at update 3 with 'exit status 1', "
        "a deterministic failure (max_restarts 3)"
    )
    assert [a["restored_step"] for a in failed.loop.attempts] == [2, 2, 2, 2]
    assert "Fix the program or the data" in failed.loop.runbook()


def test_attempts_dying_at_different_points_are_an_unstable_environment() -> None:
    """No progress, but at updates 3, 4, 3, 5: the verdict points at the machine."""
    rec = record()
    outcomes = [
        end(rec, AttemptReport(n, restored_step=2, last_step=step), n * HOUR)
        for n, step in enumerate((3, 4, 3, 5), start=1)
    ]
    failed = outcomes[-1]
    assert isinstance(failed, Fail)
    assert failed.loop is not None
    assert not failed.loop.deterministic
    assert "an unstable environment" in failed.reason
    assert "look at the machine" in failed.loop.runbook()


def test_progress_sets_the_count_back_to_zero() -> None:
    """Two attempts without progress, one with a newer commit, two more without: the count
    is 2, 0, 2, never past max_restarts = 3."""
    rec = record()
    counts = []
    for n, committed in enumerate((None, None, 9, None, None), start=1):
        end(rec, AttemptReport(n, restored_step=2, committed_step=committed), n * HOUR)
        counts.append(rec.restarts_without_progress)
    assert counts == [1, 2, 0, 1, 2]


def test_a_commit_of_the_restored_step_is_no_progress() -> None:
    """Committing the step it restored (nothing new) does not count as progress."""
    report = AttemptReport(2, restored_step=4, committed_step=4, last_step=4)
    assert not budget.made_progress(report, 600.0, 10.0)
    assert budget.made_progress(AttemptReport(1, committed_step=2), 1.0, 10.0)


def test_preemptions_never_count() -> None:
    """200 preemptions (exit 75 of an SDK worker) a second apart, none committing: all
    restarted, neither counter moves."""
    rec = record()
    for n in range(1, 201):
        outcome = end(rec, AttemptReport(n), float(n), status=PreemptedExit.exit_status)
        assert isinstance(outcome, Restart)
        assert outcome.kind is K.PREEMPTION
    assert (rec.restarts_without_progress, rec.failure_times) == (0, [])


def test_a_plain_program_progresses_by_running_long_enough() -> None:
    """A plain program commits nothing the daemon sees: restart_reset_after_s of running
    is its progress."""
    quick = AttemptReport(1, emits_events=False)
    assert budget.made_progress(quick, 10.0, 10.0)
    assert not budget.made_progress(quick, 9.9, 10.0)


def test_an_external_checkpointer_progresses_past_a_save_point() -> None:
    """Orbax's saves are not seen: updates past a multiple of checkpoint_every beyond the
    restored step are its progress."""

    def external(restored: int, last: int | None) -> AttemptReport:
        return AttemptReport(
            2,
            restored_step=restored,
            external_checkpoints=True,
            last_step=last,
            checkpoint_every=10,
        )

    assert budget.made_progress(external(10, 20), 60.0, 10.0)
    assert not budget.made_progress(external(10, 19), 60.0, 10.0)
    assert not budget.made_progress(external(10, None), 60.0, 10.0)


def test_max_restarts_zero_never_restarts_even_after_progress() -> None:
    """The old meaning of 0 holds: no restart at all."""
    outcome = end(record(max_restarts=0), committing(1, None, 8), 1.0)
    assert isinstance(outcome, Fail)
    assert outcome.reason == "crash; max_restarts = 0: no restart"


def test_the_counters_survive_a_daemon_restart(tmp_path: Path) -> None:
    """Counters saved in state.json are read back, and counting goes on from them."""
    rec = record()
    for n in (1, 2):
        end(rec, AttemptReport(n, restored_step=2, last_step=3), n * HOUR)
    folder = tmp_path / "j"
    folder.mkdir()
    (folder / "job.json").write_text(json.dumps(rec.job.to_record()))
    (folder / "state.json").write_text(state_text(rec))
    back = read_folder(folder)
    assert back.restarts_without_progress == 2
    assert back.failure_times == rec.failure_times
    assert [a["died_at_update"] for a in back.no_progress] == [3, 3]
    end(back, AttemptReport(3, restored_step=2, last_step=3), 3 * HOUR)
    outcome = end(back, AttemptReport(4, restored_step=2, last_step=3), 4 * HOUR)
    assert isinstance(outcome, Fail)
    assert outcome.loop is not None
    assert [a["attempt"] for a in outcome.loop.attempts] == [1, 2, 3, 4]


def test_a_plain_program_preempted_by_slurm_never_counts() -> None:
    """A plain program's exit 75 is its own failure, but one Slurm preempted or requeued
    (ExitInfo.preempted) is a preemption: restarted, neither counter moves."""
    rec = record()
    report = AttemptReport(1, emits_events=False)
    preempted = ExitInfo(PreemptedExit.exit_status, None, 1.0, preempted=True)
    for _ in range(10):
        outcome = policy.decide(rec, report, preempted, 0, 1.0)
        assert isinstance(outcome, Restart)
        assert outcome.kind is K.PREEMPTION
        assert outcome.budget is not None
        assert (outcome.budget.without_progress, outcome.budget.failures) == (0, ())
    own = policy.decide(rec, report, ExitInfo.from_status(PreemptedExit.exit_status, 1.0), 0, 1.0)
    assert isinstance(own, Restart)
    assert own.kind is K.CRASH
