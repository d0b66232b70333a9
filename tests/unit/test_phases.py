"""The phase watches on a hand-driven clock: each phase's own deadline, learned or set.

`StallWatch.observe` is fed events as a worker emits them, with the clock
moved between them by the durations the test gives each phase; the last
tests run a real `JobSupervisor` on the rig (`tests.unit.rig`) whose attempts
hang in a commit, after a restore, or learn from an earlier attempt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.api.status import status
from jobwarden.daemon.supervise import phases
from jobwarden.daemon.supervise.phases import RULES, Durations, StallPhase
from jobwarden.daemon.supervise.stall import StallWatch
from jobwarden.events import Event
from jobwarden.states import JobState
from tests.scripted import Emit, Exit, Hang, Script, Step, Worker
from tests.unit.clock import MockClock
from tests.unit.rig import Rig, play

P = StallPhase
S = JobState


def watch(
    explicit: dict[StallPhase, float | None] | None = None, history: Durations | None = None
) -> tuple[MockClock, StallWatch, list[tuple[StallPhase, float]]]:
    """A watch on a mock clock, recording every stall it reports."""
    clock = MockClock()
    fired: list[tuple[StallPhase, float]] = []
    stall = StallWatch(clock, lambda p, gap: fired.append((p, gap)), explicit, history)
    return clock, stall, fired


def event(kind: str, **fields: Any) -> Event:
    """One parsed event of ``kind``."""
    return Event(kind, {"event": kind, **fields})


STARTED = event("started", run={"steps": 100, "checkpoint_every": 10})


def begin(clock: MockClock, stall: StallWatch, restore_s: float = 1.0) -> None:
    """Start-up of 1 s, a set-up of ``restore_s``, a first update of 2 s."""
    stall.start(60)
    clock.advance(1)
    stall.observe(STARTED)
    clock.advance(restore_s)
    stall.observe(event("ready", step=0))
    clock.advance(2)
    stall.observe(event("progress", step=1))


def commit(clock: MockClock, stall: StallWatch, step: int, seconds: float) -> None:
    """Update ``step`` (0.1 s) announcing a synchronous commit of ``seconds``."""
    clock.advance(0.1)
    stall.observe(event("progress", step=step, commit="sync"))
    clock.advance(seconds)
    stall.observe(event("checkpoint", step=step))


class TestRules:
    def test_a_rule_gives_its_default_until_the_phase_is_seen(self) -> None:
        """Never seen: the default; seen: max(floor, factor x the longest)."""
        rule = phases.Rule(default_s=300, floor_s=10, factor=10)
        assert (rule.timeout(None), rule.timeout(0.2), rule.timeout(4)) == (300, 10, 40)

    def test_each_field_sets_its_phase(self) -> None:
        """[supervision] fields map to the phases they set; unset ones are None (learned)."""
        from jobwarden.jobfile import SupervisionSection

        given = SupervisionSection(commit_timeout_s=5.0, restore_timeout_s=900.0)
        explicit = phases.explicit_timeouts(given)
        assert (explicit[P.COMMIT], explicit[P.RESTORE], explicit[P.STEP]) == (5.0, 900.0, None)
        assert explicit[P.STARTUP] == explicit[P.EXIT] == 60.0


class TestPhases:
    def test_events_move_the_watch_through_the_phases(self) -> None:
        """started, ready, the first update, updates, a commit, the last update, completed."""
        _clock, stall, _ = watch()
        seen = [stall.phase]
        stall.observe(event("started", run={"steps": 3}))
        seen.append(stall.phase)
        stall.observe(event("ready", step=0))
        seen.append(stall.phase)
        stall.observe(event("progress", step=1))
        seen.append(stall.phase)
        stall.observe(event("progress", step=2, commit="sync"))
        seen.append(stall.phase)
        stall.observe(event("checkpoint", step=2))
        seen.append(stall.phase)
        stall.observe(event("progress", step=3, commit="sync"))
        stall.observe(event("checkpoint", step=3))
        stall.observe(event("completed", step=3))
        seen.append(stall.phase)
        assert seen == [P.STARTUP, P.RESTORE, P.COMPILE, P.STEP, P.COMMIT, P.FINAL, P.FINAL]

    def test_a_failed_event_leaves_the_startup_time_to_exit(self) -> None:
        """After failed, the process has startup_timeout_s to leave (the exit phase)."""
        clock, stall, _fired = watch({P.EXIT: 60.0})
        begin(clock, stall)
        stall.observe(event("failed", code="x", message="m", exit_status=1))
        assert (stall.phase, stall.timeout_s) == (P.EXIT, 60.0)


class TestCommitWatch:
    def test_a_hung_commit_is_found_in_seconds_when_commits_take_one(self) -> None:
        """Commits of 1 s: the next commit's watch is 10 s; a hang is found then, as a commit
        stall timed from its start, well before the step's 60 s floor."""
        clock, stall, fired = watch()
        begin(clock, stall)
        for step in (10, 20, 30):
            commit(clock, stall, step, 1.0)
        clock.advance(0.1)
        stall.observe(event("progress", step=40, commit="sync"))
        assert stall.timeout_s == 10.0
        clock.advance(9.99)
        assert fired == []
        clock.advance(0.02)
        assert fired == [(P.COMMIT, 10.0)]

    def test_the_first_commit_of_a_job_gets_the_generous_default(self) -> None:
        """Nothing learned yet: the first commit may take up to 300 s."""
        clock, stall, fired = watch()
        begin(clock, stall)
        clock.advance(0.1)
        stall.observe(event("progress", step=10, commit="sync"))
        assert (stall.phase, stall.timeout_s) == (P.COMMIT, RULES[P.COMMIT].default_s)
        clock.advance(250)
        stall.observe(event("checkpoint", step=10))
        assert fired == []
        assert stall.watch_s(P.COMMIT) == pytest.approx(2500)

    def test_an_explicit_commit_timeout_wins(self) -> None:
        """commit_timeout_s = 2: the first commit already has 2 s."""
        clock, stall, fired = watch({P.COMMIT: 2.0})
        begin(clock, stall)
        clock.advance(0.1)
        stall.observe(event("progress", step=10, commit="sync"))
        clock.advance(2.01)
        assert fired == [(P.COMMIT, 2.0)]

    def test_commits_do_not_lengthen_the_step_watch(self) -> None:
        """A 20 s commit on a job of 0.1 s updates: the update's watch stays at its floor."""
        clock, stall, _fired = watch()
        begin(clock, stall)
        commit(clock, stall, 10, 20.0)
        assert (stall.phase, stall.timeout_s) == (P.STEP, 60.0)
        assert stall.watch_s(P.COMMIT) == pytest.approx(200)

    def test_an_old_worker_without_the_commit_field_is_watched_as_updates(self) -> None:
        """Events of a worker that announces no commit: the commit counts as the update, as
        before phases."""
        clock, stall, _ = watch()
        begin(clock, stall)
        clock.advance(0.1)
        stall.observe(event("progress", step=10))
        assert stall.phase is P.STEP
        clock.advance(5)
        stall.observe(event("checkpoint", step=10))
        assert stall.phase is P.STEP  # a checkpoint outside a commit phase moves nothing

    def test_a_checkpoint_reported_before_its_progress_opens_no_commit(self) -> None:
        """A job of several processes: member 0's checkpoint can come before the progress held
        for the slowest member; that commit is done, so the update phase follows."""
        clock, stall, _ = watch()
        begin(clock, stall)
        stall.observe(event("checkpoint", step=10))
        stall.observe(event("progress", step=10, commit="sync"))
        assert stall.phase is P.STEP


class TestBackgroundCommits:
    def test_training_goes_on_while_one_commit_is_in_flight(self) -> None:
        """A background commit alone holds nothing: the updates' watch runs, and its report
        does not re-arm it."""
        clock, stall, _ = watch()
        begin(clock, stall)
        clock.advance(0.1)
        stall.observe(event("progress", step=10, commit="background"))
        assert stall.phase is P.STEP
        clock.advance(0.1)
        stall.observe(event("progress", step=11))
        clock.advance(0.5)
        deadline = stall.since + stall.timeout_s
        stall.observe(event("checkpoint", step=10))
        assert (stall.phase, stall.since + stall.timeout_s) == (P.STEP, deadline)
        assert stall.seen.longest[P.COMMIT] == pytest.approx(0.6)

    def test_the_next_commit_waits_on_the_one_in_flight_timed_from_its_start(self) -> None:
        """The second commit waits for the first: a commit phase whose deadline counts from the
        first commit's start; its report lets the training go on."""
        clock, stall, fired = watch({P.COMMIT: 5.0})
        begin(clock, stall)
        clock.advance(0.1)
        stall.observe(event("progress", step=10, commit="background"))
        clock.advance(3)
        stall.observe(event("progress", step=20, commit="background"))
        assert (stall.phase, stall.gap()) == (P.COMMIT, 3.0)
        clock.advance(1)
        stall.observe(event("checkpoint", step=10))
        assert stall.phase is P.STEP
        clock.advance(4.5)  # commit 20 alone in flight: still no stall
        assert fired == []

    def test_a_hung_background_commit_is_found_when_the_run_waits_on_it(self) -> None:
        """The first background commit hangs: found once the next must wait, at the commit
        watch from the hung one's start."""
        clock, stall, fired = watch({P.COMMIT: 5.0})
        begin(clock, stall)
        clock.advance(0.1)
        stall.observe(event("progress", step=10, commit="background"))
        for step in range(11, 20):
            clock.advance(0.2)
            stall.observe(event("progress", step=step))
        clock.advance(0.2)
        stall.observe(event("progress", step=20, commit="background"))
        clock.advance(3.0)
        assert [phase for phase, _ in fired] == [P.COMMIT]
        assert fired[0][1] == 5.0


class TestRestoreAndCompile:
    def test_a_five_minute_restore_of_a_large_model_is_not_a_stall(self) -> None:
        """A first restore of 300 s passes under the 600 s default; then it is learned."""
        clock, stall, fired = watch()
        stall.start(60)
        clock.advance(2)
        stall.observe(STARTED)
        clock.advance(290)
        stall.observe(event("restored", step=10))
        clock.advance(10)
        stall.observe(event("ready", step=10))
        assert fired == []
        assert stall.watch_s(P.RESTORE) == 900.0

    def test_a_fresh_start_is_not_learned_as_a_restore(self) -> None:
        """A fresh start's 2 s set-up leaves the next attempt's restore its default."""
        clock, stall, _ = watch()
        begin(clock, stall, restore_s=2.0)
        assert P.RESTORE not in stall.seen.longest
        assert stall.watch_s(P.RESTORE) == RULES[P.RESTORE].default_s

    def test_a_hang_before_ready_is_a_restore_stall(self) -> None:
        """Started, never ready: the restore watch (explicit here) ends it, as a restore."""
        clock, stall, fired = watch({P.RESTORE: 30.0})
        stall.start(60)
        stall.observe(STARTED)
        clock.advance(30.01)
        assert [phase for phase, _ in fired] == [P.RESTORE]

    def test_a_long_compile_is_not_an_update(self) -> None:
        """A 100 s first update (compilation) on a job whose updates get 60 s is no stall,
        and does not lengthen the updates' watch."""
        clock, stall, fired = watch()
        stall.start(60)
        stall.observe(STARTED)
        stall.observe(event("ready", step=0))
        assert (stall.phase, stall.timeout_s) == (P.COMPILE, 600.0)
        clock.advance(100)
        stall.observe(event("progress", step=1))
        assert fired == []
        assert (stall.phase, stall.timeout_s) == (P.STEP, 60.0)

    def test_the_last_update_has_the_final_watch(self) -> None:
        """The update before the end is where a program evaluates: the final phase's watch."""
        clock, stall, fired = watch()
        begin(clock, stall)
        for step in range(2, 100):
            clock.advance(0.1)
            stall.observe(event("progress", step=step))
        assert (stall.phase, stall.timeout_s) == (P.FINAL, 600.0)
        clock.advance(120)
        stall.observe(event("progress", step=100, commit="sync"))
        assert fired == []


class TestHistory:
    def test_an_earlier_attempt_teaches_the_next(self) -> None:
        """Attempt 1's 1 s commits: attempt 2's first commit already has 10 s."""
        clock, first, _ = watch()
        begin(clock, first)
        commit(clock, first, 10, 1.0)
        history = Durations()
        history.merge(first.ended())
        clock, second, _fired = watch(history=history)
        begin(clock, second)
        clock.advance(0.1)
        second.observe(event("progress", step=10, commit="sync"))
        assert second.timeout_s == 10.0

    def test_durations_are_kept_and_read_back(self, tmp_path: Path) -> None:
        """phases.json of each attempt, read back into one history (the longest wins)."""
        for number, seconds in ((1, 1.0), (2, 3.0)):
            durations = Durations()
            durations.learn(P.COMMIT, seconds)
            durations.spent(P.COMMIT, seconds)
            (tmp_path / str(number)).mkdir()
            phases.save(tmp_path / str(number), durations)
        (tmp_path / "3").mkdir()
        (tmp_path / "3" / phases.PHASES_FILE).write_text("{not json")
        history = phases.history(tmp_path, before=4)
        assert (history.longest[P.COMMIT], history.total_s[P.COMMIT]) == (3.0, 4.0)
        assert history.count[P.COMMIT] == 2

    def test_the_record_names_the_phase_and_every_watch(self) -> None:
        """as_record: the phase now, its age and watch, and each phase's figures."""
        clock, stall, _ = watch({P.COMMIT: 4.0})
        begin(clock, stall)
        clock.advance(0.5)
        record = stall.as_record()
        assert (record["phase"], record["for_s"], record["watch_s"]) == ("step", 0.5, 60.0)
        assert record["phases"]["compile"]["longest_s"] == 2.0
        assert record["phases"]["commit"] == {
            "longest_s": None,
            "total_s": None,
            "count": 0,
            "watch_s": 4.0,
            "explicit": True,
        }


# ---- through the supervisor


def paused_commits(work: Worker, steps: range, label: str) -> list[Step]:
    """Updates whose commits pause at a `Hang` called ``label``-<step> before reporting."""
    out: list[Step] = []
    for step in steps:
        for item in work.updates(step, step):
            if isinstance(item, Emit) and item.kind == "checkpoint":
                out.append(Hang(f"{label}-{step}"))
            out.append(item)
    return out


def test_a_hung_commit_is_a_commit_stall_named_in_the_incident(tmp_path: Path) -> None:
    """Two commits of 1 s, then one that hangs: a stall at 10 s, of the commit phase, its
    symptom and the job's history naming it; ``status JOB`` shows the phase, live and after."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("commit", supervision={"max_restarts": 0, "stall_timeout_s": None})
        work = rig.worker(record)
        steps = [*work.start(), *paused_commits(work, range(1, 5), "c"), *work.updates(5, 5)]
        steps += [work.updates(6, 6)[0], Hang("hung")]
        rig.launcher.plan("commit", Script(tuple(steps), on_term="ignore"))
        await rig.launched(record)
        attempt = rig.launcher.attempts[0]
        for step in (2, 4):
            await attempt.reached(f"c-{step}")
            rig.clock.advance(1.0)
            attempt.release()
        await attempt.reached("hung")
        assert rig.clock.advance(9.99) == 0
        live = status(rig, {"job": "commit"})["phases"]
        assert (live["phase"], live["for_s"], live["watch_s"]) == ("commit", 9.99, 10.0)
        assert live["phases"]["commit"]["longest_s"] == 1.0
        assert rig.clock.advance(0.02) == 1
        await rig.until_settled("commit")
        ended = status(rig, {"job": "commit"})["phases"]
        assert (ended["phase"], ended["phases"]["commit"]["count"]) == (None, 3)
        assert record.history[3]["reason"] == (
            "no checkpoint for 10.00 s in the commit phase (timeout 10 s)"
        )
        [incident] = rig.incident_records("commit")
        assert (incident["details"]["phase"], incident["details"]["timeout_s"]) == ("commit", 10)
        assert "stuck in its commit phase: no checkpoint event for 10.00 s" in incident["symptom"]
        saved = phases.load(rig.root.job("commit") / "attempts" / "1")
        assert saved is not None
        assert saved.longest[P.COMMIT] == 1.0

    play(tmp_path, scenario)


def test_an_earlier_attempt_sets_the_commit_watch_of_the_next(tmp_path: Path) -> None:
    """Attempt 1 commits in 2 s and crashes; attempt 2's first commit hangs: found at 20 s,
    not at the first-commit default."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("learn", supervision={"max_restarts": 1})
        work = rig.worker(record)
        first = [*work.start(), *paused_commits(work, range(1, 3), "c"), *work.updates(3, 3)]
        second = [*work.start(at=2), *work.updates(3, 4)[:1], work.updates(4, 4)[0]]
        rig.launcher.plan(
            "learn",
            [*first, Exit(1)],
            Script((*second, Hang("hung")), on_term="ignore"),
        )
        await rig.launched(record)
        attempt = rig.launcher.attempts[0]
        await attempt.reached("c-2")
        rig.clock.advance(2.0)
        attempt.release()
        await rig.until(lambda: len(rig.launcher.attempts) == 2)
        await rig.launcher.attempts[1].reached("hung")
        assert rig.clock.advance(19.99) == 0
        assert rig.clock.advance(0.02) == 1
        await rig.until_settled("learn")
        reasons = [entry["reason"] for entry in record.history]
        assert "no checkpoint for 20.00 s in the commit phase (timeout 20 s)" in reasons

    play(tmp_path, scenario)
