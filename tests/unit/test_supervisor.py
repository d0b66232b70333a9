"""The supervisor in-process: a real `JobSupervisor` applying every outcome of the policy.

Each test drives one job through the real supervisor, `JobTable`,
`IncidentLog` and `Root` on tmp_path, with attempts played by the scripted
launcher (`tests.scripted`) and deadlines on a hand-driven clock, so no
worker, no JAX and no sleep is involved.  The outcomes, as `supervisor.apply`
and `_launch` carry them out: completed; restart (crash, stall, rss limit,
external preemption, with the replay verified, unverified, or failed again);
escalated (replay mismatch, each escalating refusal code, a duplicate writer,
an unsafe path); failed (restarts spent, a fatal exit status, a launch
refused); preempted (operator stop, daemon shutdown, a stop during a backoff).
"""

from __future__ import annotations

import asyncio
import errno
import json
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jobwarden.checkpoint.errors import (
    CheckpointDiskFull,
    ChecksumMismatch,
    IncompatibleCheckpoint,
    NoUsableCheckpoint,
    UnsafeCheckpointDirectory,
    WriterFenced,
    WriterLockLost,
)
from jobwarden.checkpoint.lease import LeaseLost
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.supervise import policy, stallevidence
from jobwarden.daemon.supervise.policy import IncidentKind
from jobwarden.errors import (
    JobFileError,
    JobwardenError,
    ResumePolicyError,
    UnsafeCacheError,
    WriterLockedError,
)
from jobwarden.events import Event, read_events
from jobwarden.files import UnsafePathError
from jobwarden.states import JobState
from tests.scripted import STACK_DUMP, Exit, Hang, Line, Refuse, Script, Stderr
from tests.unit.rig import Rig, play

S = JobState
K = IncidentKind


@pytest.fixture(autouse=True)
def quick_stall_handling(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real waiting for a stack dump, and a short SIGTERM-to-kill grace after a stall."""
    monkeypatch.setattr(stallevidence, "STACK_DUMP_WAIT_S", 0.0)
    monkeypatch.setattr(stallevidence, "STALL_KILL_GRACE_S", 0.01)


def kinds(rig: Rig, record: JobRecord, attempt: int) -> list[str]:
    """The kinds of the events an attempt's events.jsonl kept."""
    path = rig.root.job(record.id) / "attempts" / str(attempt) / "events.jsonl"
    return [item.kind for item in read_events(path) if isinstance(item, Event)]


def exit_record(rig: Rig, record: JobRecord, attempt: int) -> dict[str, Any]:
    """An attempt's exit.json."""
    path = rig.root.job(record.id) / "attempts" / str(attempt) / "exit.json"
    return json.loads(path.read_text())


def concrete(base: type[JobwardenError]) -> list[type[JobwardenError]]:
    """Every subclass of ``base`` with a code of its own (the refusals a worker raises)."""
    found, stack = [], list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.code != base.code:
            found.append(cls)
    return sorted(found, key=lambda cls: cls.code)


# ---- completed


def test_a_completed_attempt_completes_the_job(tmp_path: Path) -> None:
    """A completed event and exit 0: the job is completed at its last step, no incident."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("done")
        rig.launcher.plan("done", rig.worker(record).run())
        await rig.launched(record)
        await rig.until_settled("done")
        assert rig.states(record) == ["queued", "starting", "running", "completed"]
        assert (record.step, record.newest_checkpoint_step) == (8, 8)
        assert record.incidents == []
        assert rig.saved_state("done")["state"] == "completed"
        assert rig.stats.checkpoints == 4
        assert tuple(
            exit_record(rig, record, 1)[k] for k in ("exit_status", "signal", "stopped_by")
        ) == (0, None, None)
        assert rig.launcher.attempts[0].received == []

    play(tmp_path, scenario)


def test_exit_zero_without_a_completed_event_is_a_crash(tmp_path: Path) -> None:
    """Exit 0 before the last step is not a completion: a crash (here with no restart left)."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("early", supervision={"max_restarts": 0})
        work = rig.worker(record)
        rig.launcher.plan("early", [*work.start(), *work.updates(1, 3), Exit(0)])
        await rig.launched(record)
        await rig.until_settled("early")
        assert record.state is S.FAILED
        assert [i["kind"] for i in rig.incident_records("early")] == [K.CRASH.value]

    play(tmp_path, scenario)


def test_malformed_lines_are_counted_and_kept(tmp_path: Path) -> None:
    """A line that is no event is counted and kept verbatim; the job completes all the same."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("noisy")
        work = rig.worker(record)
        run = work.run()
        rig.launcher.plan("noisy", [*run[:2], Line("print() from the task"), *run[2:]])
        await rig.launched(record)
        await rig.until_settled("noisy")
        assert record.state is S.COMPLETED
        assert rig.stats.malformed_event_lines == 1
        events = rig.root.job("noisy") / "attempts" / "1" / "events.jsonl"
        assert b"\nprint() from the task\n" in events.read_bytes()

    play(tmp_path, scenario)


# ---- restart after a crash, and the replay proof


def test_crash_restarts_from_the_newest_checkpoint_and_verifies_the_replay(tmp_path: Path) -> None:
    """Crash after update 5: attempt 2 restores step 4, replays 5 identically, the incident is
    verified and the job completes."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("crash")
        work = rig.worker(record)
        rig.launcher.plan(
            "crash",
            [*work.start(), *work.updates(1, 5), Stderr("Traceback ...\n"), Exit(1)],
            work.run(at=4),
        )
        await rig.launched(record)
        await rig.until_settled("crash")
        assert rig.states(record) == [
            "queued",
            "starting",
            "running",
            "recovering",
            "running",
            "completed",
        ]
        assert record.history[4]["reason"] == "recovery verified"
        assert (record.restarts, record.attempt, record.replayed_updates) == (1, 2, 1)
        [incident] = rig.incident_records("crash")
        assert (incident["kind"], incident["status"], incident["attempt"]) == (
            "crash",
            "verified",
            1,
        )
        assert incident["recovery_point"]["step"] == 4
        assert {k: incident["boundary"][k] for k in ("last_logged_step", "checkpoint_step")} == {
            "last_logged_step": 5,
            "checkpoint_step": 4,
        }
        checks = incident["verification"]["checks"]
        assert [(c["step"], c["what"], c["ok"]) for c in checks] == [
            (4, "restored state", True),
            (5, "update", True),
        ]
        assert incident["replayed_steps"] == [5]
        assert "exited with status 1 without a failed event" in incident["symptom"]
        assert Path(incident["evidence"]["stderr"]).read_text() == "Traceback ...\n"
        assert incident["outcome"].endswith("The job then completed at step 8.")
        spec = rig.launcher.specs[1]
        assert (spec.attempt, spec.job_id) == (2, "crash")
        assert incident["details"]["backoff_s"] == 0.0

    play(tmp_path, scenario)


def test_a_recovery_with_nothing_logged_to_compare_is_unverified(tmp_path: Path) -> None:
    """A crash before ready leaves no logged state: the recovery is concluded unverified."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("fresh")
        work = rig.worker(record)
        rig.launcher.plan("fresh", [*work.start()[:1], Exit(-signal.SIGSEGV)], work.run())
        await rig.launched(record)
        await rig.until_settled("fresh")
        assert record.state is S.COMPLETED
        [incident] = rig.incident_records("fresh")
        assert (
            incident["status"],
            incident["recovery_point"],
        ) == ("unverified", {"fresh": True, "step": 0})
        assert "was killed by SIGSEGV" in incident["symptom"]

    play(tmp_path, scenario)


def test_a_recovery_that_fails_again_before_its_replay_is_verified(tmp_path: Path) -> None:
    """The recovery attempt crashes before its replay is settled: its incident is concluded
    failed, a second one opened, and the next restart waits the backoff."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("twice", supervision={"restart_backoff_s": 0.01})
        work = rig.worker(record)
        rig.launcher.plan(
            "twice",
            [*work.start(), *work.updates(1, 5), Exit(1)],
            [*work.start(4), Exit(1)],
            work.run(at=4),
        )
        await rig.launched(record)
        await rig.until_settled("twice")
        assert record.state is S.COMPLETED
        assert rig.states(record)[3:6] == ["recovering", "recovering", "running"]
        first, second = rig.incident_records("twice")
        assert (first["status"], second["status"]) == ("failed", "verified")
        assert f"see incident {second['id']}" in first["outcome"]
        assert second["details"]["backoff_s"] == 0.01
        assert "restart 2 in 0.01 s" in record.history[4]["reason"]

    play(tmp_path, scenario)


# ---- escalated: replay mismatch


def test_a_replayed_update_that_differs_escalates_and_kills_at_once(tmp_path: Path) -> None:
    """Update 5 replayed with another hash: the attempt is killed before its next line, the
    incident and the job are escalated, and no restart follows."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("drift")
        same, other = rig.worker(record, "a"), rig.worker(record, "b")
        rig.launcher.plan(
            "drift",
            [*same.start(), *same.updates(1, 5), Exit(1)],
            [*same.start(4), *other.updates(5, 8), *other.completed()],
        )
        await rig.launched(record)
        await rig.until_settled("drift")
        assert record.state is S.ESCALATED
        assert record.reason == "replay mismatch at step 5"
        assert rig.launcher.attempts[1].received == ["kill"]
        assert kinds(rig, record, 2) == ["started", "restored", "ready", "progress"]
        assert tuple(exit_record(rig, record, 2)[k] for k in ("signal", "stopped_by")) == (
            "SIGKILL",
            "mismatch",
        )
        [incident] = rig.incident_records("drift")
        assert (
            incident["status"],
            incident["verification"]["verdict"],
        ) == ("escalated", "mismatch")
        assert len(rig.launcher.attempts) == 2

    play(tmp_path, scenario)


def test_a_restored_state_that_differs_escalates(tmp_path: Path) -> None:
    """The resumed starting state differs from the logged one: mismatch at the boundary."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("boundary")
        same, other = rig.worker(record, "a"), rig.worker(record, "b")
        rig.launcher.plan(
            "boundary", [*same.start(), *same.updates(1, 5), Exit(1)], other.run(at=4)
        )
        await rig.launched(record)
        await rig.until_settled("boundary")
        assert (record.reason, record.state) == ("replay mismatch at step 4", S.ESCALATED)
        [incident] = rig.incident_records("boundary")
        [check] = incident["verification"]["checks"]
        assert (check["what"], check["ok"]) == ("restored state", False)

    play(tmp_path, scenario)


# ---- escalated: refusals a restart cannot mend


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        *[(cls, K.INCOMPATIBLE_CHECKPOINT) for cls in concrete(IncompatibleCheckpoint)],
        (NoUsableCheckpoint, K.CORRUPT_CHECKPOINT),
        (CheckpointDiskFull, K.DISK_FULL),
        (WriterLockedError, K.DUPLICATE_WRITER),
        (WriterLockLost, K.DUPLICATE_WRITER),
        (WriterFenced, K.DUPLICATE_WRITER),
        (LeaseLost, K.DUPLICATE_WRITER),
        (UnsafePathError, K.UNSAFE_PATH),
        (UnsafeCheckpointDirectory, K.UNSAFE_PATH),
        (ResumePolicyError, K.RESUME_POLICY),
        (JobFileError, K.INVALID_REQUEST),
        (UnsafeCacheError, K.UNSAFE_CACHE),
    ],
    ids=lambda value: getattr(value, "code", None) or str(value),
)
def test_an_escalating_refusal_escalates_without_restart(
    tmp_path: Path, error: type[JobwardenError], kind: IncidentKind
) -> None:
    """A worker refusal a restart would meet again escalates the job with its incident kind."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("refused")
        work = rig.worker(record)
        rig.launcher.plan("refused", [*work.start(), *work.failed(error, "refused here")])
        await rig.launched(record)
        await rig.until_settled("refused")
        assert (record.state, record.reason) == (S.ESCALATED, f"{kind}: refused here")
        [incident] = rig.incident_records("refused")
        assert (incident["kind"], incident["status"]) == (kind.value, "escalated")
        assert incident["details"]["failure"]["code"] == error.code
        assert (record.restarts, len(rig.launcher.attempts)) == (0, 1)

    play(tmp_path, scenario)


def test_a_corrupt_file_alone_is_a_crash_that_restarts(tmp_path: Path) -> None:
    """A damaged file's code is not final (the worker quarantines it and falls back): the
    job is restarted, not escalated."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("damaged")
        work = rig.worker(record)
        rig.launcher.plan(
            "damaged",
            [*work.start(), *work.updates(1, 2), *work.failed(ChecksumMismatch, "bad crc")],
            work.run(at=2),
        )
        await rig.launched(record)
        await rig.until_settled("damaged")
        assert record.state is S.COMPLETED
        [incident] = rig.incident_records("damaged")
        assert (incident["kind"], incident["status"]) == (K.CRASH.value, "verified")

    play(tmp_path, scenario)


# ---- escalated: refused before any worker starts


def test_a_checkpoint_owned_by_a_live_job_is_refused_as_a_duplicate_writer(
    tmp_path: Path,
) -> None:
    """A second job on a live job's checkpoint is escalated, and no worker is started for it."""

    async def scenario(rig: Rig) -> None:
        owner = rig.submit("owner", checkpoint="shared")
        second = rig.submit("second", checkpoint="shared")
        work = rig.worker(owner)
        rig.launcher.plan("owner", [*work.start(), Hang()])
        await rig.launched(owner)
        await rig.launcher.attempts[0].reached()
        await rig.launched(second)
        assert rig.settled == ["second"]
        assert (second.state, second.attempt) == (S.ESCALATED, 0)
        assert [spec.job_id for spec in rig.launcher.specs] == ["owner"]
        [incident] = rig.incident_records("second")
        assert (incident["kind"], incident["status"]) == (K.DUPLICATE_WRITER.value, "escalated")
        assert "is owned by live job owner" in second.reason
        assert owner.state is S.RUNNING

    play(tmp_path, scenario)


def test_a_launch_through_a_symbolic_link_escalates_as_an_unsafe_path(tmp_path: Path) -> None:
    """A launch refused with ELOOP (a link where the daemon writes) escalates unsafe_path."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("linked")
        planted = str(rig.root.job("linked") / "attempts" / "1" / "stderr.log")
        refusal = OSError(errno.ELOOP, "Too many levels of symbolic links", planted)
        rig.launcher.plan("linked", Refuse(refusal))
        await rig.launched(record)
        assert rig.settled == ["linked"]
        assert record.state is S.ESCALATED
        [incident] = rig.incident_records("linked")
        assert (incident["kind"], incident["evidence"]["path"]) == (K.UNSAFE_PATH.value, planted)

    play(tmp_path, scenario)


# ---- failed


def test_a_launch_the_launcher_refuses_fails_the_job(tmp_path: Path) -> None:
    """LauncherError at start: the job is failed naming it, with no incident."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("unlaunchable")
        rig.launcher.plan("unlaunchable", Refuse(LauncherError("sbatch: invalid partition")))
        await rig.launched(record)
        assert rig.settled == ["unlaunchable"]
        assert rig.states(record) == ["queued", "starting", "failed"]
        assert record.reason == "attempt 1 could not be launched: sbatch: invalid partition"
        assert (record.incidents, rig.saved_state("unlaunchable")["attempt"]) == ([], 1)

    play(tmp_path, scenario)


def test_restarts_exhausted_fail_the_job(tmp_path: Path) -> None:
    """max_restarts = 1: the second crash fails the job, and both incidents say why."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("flaky", supervision={"max_restarts": 1})
        work = rig.worker(record)
        rig.launcher.plan(
            "flaky",
            [*work.start(), *work.updates(1, 3), Exit(1)],
            [*work.start(2), Exit(1)],
        )
        await rig.launched(record)
        await rig.until_settled("flaky")
        assert (record.state, record.reason) == (S.FAILED, "crash; max_restarts exhausted")
        first, second = rig.incident_records("flaky")
        assert (first["status"], second["status"]) == ("failed", "failed")
        assert "max_restarts is 1" in second["outcome"]
        assert (record.restarts, len(rig.launcher.attempts)) == (1, 2)

    play(tmp_path, scenario)


def test_a_fatal_exit_status_fails_without_restart(tmp_path: Path) -> None:
    """An exit status listed in fatal_exit_codes fails the job at once, budget or not."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("fatal", supervision={"fatal_exit_codes": [42]})
        work = rig.worker(record)
        rig.launcher.plan("fatal", [*work.start(), *work.updates(1, 1), Exit(42)])
        await rig.launched(record)
        await rig.until_settled("fatal")
        assert record.state is S.FAILED
        assert record.reason == "crash; exit status 42 is in fatal_exit_codes"
        assert record.restarts == 0

    play(tmp_path, scenario)


# ---- stalls and limits


def test_a_stall_is_stopped_recorded_and_restarted(tmp_path: Path) -> None:
    """No progress for stall_timeout_s: stack dump, SIGTERM, kill after the grace, a stall
    incident with the evidence, and a verified recovery."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("stuck")
        work = rig.worker(record)
        rig.launcher.plan(
            "stuck",
            Script((*work.start(), *work.updates(1, 3), Hang("stuck")), on_term="ignore"),
            work.run(at=2),
        )
        await rig.launched(record)
        hung = rig.launcher.attempts[0]
        await hung.reached("stuck")
        assert rig.clock.advance(4.99) == 0
        assert rig.clock.advance(0.01) == 1
        await rig.until_settled("stuck")
        assert hung.received == ["SIGUSR1", "stop(0.01)", "SIGTERM", "kill"]
        assert rig.states(record)[2:] == [
            "running",
            "stalled",
            "recovering",
            "running",
            "completed",
        ]
        assert record.history[3]["reason"] == "no progress for 5.00 s (timeout 5 s)"
        [incident] = rig.incident_records("stuck")
        assert (incident["kind"], incident["status"]) == (K.STALL.value, "verified")
        assert tuple(incident["details"][k] for k in ("gap_s", "timeout_s", "phase")) == (
            5.0,
            5.0,
            "stall",
        )
        assert Path(incident["evidence"]["stack dump"]).read_text() == STACK_DUMP
        assert rig.stats.stalls_detected == 1

    play(tmp_path, scenario)


def test_no_ready_within_the_startup_timeout_is_a_startup_stall(tmp_path: Path) -> None:
    """Started but never ready: the startup deadline, not the stall one, ends the attempt."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("slow", supervision={"max_restarts": 0})
        work = rig.worker(record)
        rig.launcher.plan("slow", [*work.start()[:1], Hang()])
        await rig.launched(record)
        await rig.launcher.attempts[0].reached()
        rig.clock.advance(30.0)
        await rig.until_settled("slow")
        assert record.history[2]["reason"] == "no ready for 30.00 s (timeout 30 s)"
        assert (record.state, record.reason) == (S.FAILED, "stall; max_restarts exhausted")
        [incident] = rig.incident_records("slow")
        assert incident["details"]["phase"] == "startup"

    play(tmp_path, scenario)


def test_memory_over_the_limit_stops_and_restarts(tmp_path: Path) -> None:
    """A sample over max_rss_mb stops the attempt (it commits) and restarts it: rss_limit."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("hungry", supervision={"max_rss_mb": 100, "stop_grace_s": 2})
        work = rig.worker(record)
        rig.launcher.plan("hungry", [*work.start(), *work.updates(1, 3), Hang()], work.run(at=3))
        supervisor = await rig.launched(record)
        fat = rig.launcher.attempts[0]
        await fat.reached()
        fat.resources = {"rss_mb": 99.0}
        supervisor.sample()
        assert fat.received == []
        fat.resources = {"rss_mb": 512.0}
        supervisor.sample()
        await rig.until_settled("hungry")
        assert fat.received == ["stop(2)", "SIGTERM"]
        assert kinds(rig, record, 1)[-2:] == ["checkpoint", "preempted"]
        [incident] = rig.incident_records("hungry")
        assert (incident["kind"], incident["status"]) == (K.RSS_LIMIT.value, "verified")
        assert record.state is S.COMPLETED

    play(tmp_path, scenario)


# ---- preempted


def test_an_operator_stop_preempts_after_the_worker_commits(tmp_path: Path) -> None:
    """stop: SIGTERM, the worker commits its step and exits 75, the job waits preempted."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("paused")
        work = rig.worker(record)
        rig.launcher.plan("paused", [*work.start(), *work.updates(1, 3), Hang()])
        supervisor = await rig.launched(record)
        attempt = rig.launcher.attempts[0]
        await attempt.reached()
        answer = supervisor.stop()
        assert {"job": "paused", "stopping": True, "pid": attempt.pid, "grace_s": 30.0} == answer
        await rig.until_settled("paused")
        assert (record.state, record.reason) == (S.PREEMPTED, "stopped by operator at step 3")
        assert (record.newest_checkpoint_step, record.resume_on_start) == (3, False)
        assert record.history[-1]["exit_status"] == 75
        assert attempt.received == ["stop(30)", "SIGTERM"]
        assert record.incidents == []

    play(tmp_path, scenario)


def test_a_daemon_shutdown_preempts_to_resume_on_start(tmp_path: Path) -> None:
    """shutdown: the worker commits, the job is preempted and marked to resume at start."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("nightly")
        work = rig.worker(record)
        rig.launcher.plan("nightly", [*work.start(), *work.updates(1, 1), Hang()])
        supervisor = await rig.launched(record)
        await rig.launcher.attempts[0].reached()
        await supervisor.shutdown()
        assert record.state is S.PREEMPTED
        assert record.reason == "daemon shutdown preempted attempt 1 at step 1"
        assert rig.saved_state("nightly")["resume_on_start"] is True
        assert exit_record(rig, record, 1)["stopped_by"] == "shutdown"

    play(tmp_path, scenario)


def test_sigterm_from_outside_is_an_external_preemption_that_restarts(tmp_path: Path) -> None:
    """SIGTERM the daemon did not send (a node drain, wardenctl signal): the worker commits
    and exits 75, a preemption incident, and the job resumes from that commit."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("drained")
        work = rig.worker(record)
        rig.launcher.plan("drained", [*work.start(), *work.updates(1, 3), Hang()], work.run(at=3))
        await rig.launched(record)
        first = rig.launcher.attempts[0]
        await first.reached()
        first.signal(signal.SIGTERM)
        await rig.until_settled("drained")
        [incident] = rig.incident_records("drained")
        assert (incident["kind"], incident["status"]) == (K.PREEMPTION.value, "verified")
        assert (record.state, record.restarts) == (S.COMPLETED, 1)

    play(tmp_path, scenario)


def test_a_stop_during_the_restart_backoff_preempts_with_no_attempt(tmp_path: Path) -> None:
    """stop while the next restart waits its backoff: the restart is called off, preempted."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("backoff", supervision={"restart_backoff_s": 60})
        work = rig.worker(record)
        rig.launcher.plan(
            "backoff", [*work.start(), *work.updates(1, 1), Exit(1)], [*work.start(), Exit(1)]
        )
        supervisor = await rig.launched(record)
        await rig.until(lambda: record.restarts == 2 and supervisor.attempt is None)
        assert record.state is S.RECOVERING
        answer = supervisor.stop()
        assert answer == {"job": "backoff", "stopping": False, "state": "preempted"}
        assert record.reason == "stopped by operator during restart backoff"
        assert rig.settled == ["backoff"]
        assert supervisor.stop() is None
        assert len(rig.launcher.attempts) == 2

    play(tmp_path, scenario)


def test_a_shutdown_during_the_restart_backoff_leaves_the_job_recovering(tmp_path: Path) -> None:
    """shutdown while a restart waits: no attempt is started, the job stays recovering for
    the next daemon start to resume."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("later", supervision={"restart_backoff_s": 60})
        work = rig.worker(record)
        rig.launcher.plan(
            "later", [*work.start(), *work.updates(1, 1), Exit(1)], [*work.start(), Exit(1)]
        )
        supervisor = await rig.launched(record)
        await rig.until(lambda: record.restarts == 2 and supervisor.attempt is None)
        await supervisor.shutdown()
        assert (record.state, rig.settled) == (S.RECOVERING, [])
        assert rig.saved_state("later")["state"] == "recovering"
        assert len(rig.launcher.attempts) == 2

    play(tmp_path, scenario)


# ---- plain programs (no SDK)


def test_a_plain_program_completes_on_exit_zero(tmp_path: Path) -> None:
    """A program without events: running from spawn, completed on exit 0, stdout kept."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("plain", command=["/usr/bin/true"], sdk=False)
        rig.launcher.plan("plain", [Line("epoch 1 loss 0.3"), Exit(0)])
        await rig.launched(record)
        await rig.until_settled("plain")
        assert rig.states(record) == ["queued", "starting", "running", "completed"]
        output = rig.root.job("plain") / "attempts" / "1" / "output.log"
        assert output.read_bytes() == b"epoch 1 loss 0.3\n"
        assert rig.stats.malformed_event_lines == 0

    play(tmp_path, scenario)


def test_a_plain_program_recovery_is_concluded_unverified_at_once(tmp_path: Path) -> None:
    """A plain program's crash restarts it; the recovery is unverified as soon as it starts."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("plainer", command=["/usr/bin/true"], sdk=False)
        rig.launcher.plan("plainer", [Exit(1)], [Hang(), Exit(0)])
        await rig.launched(record)
        second = await rig.launcher.attempt("plainer", 2)
        await second.reached()
        [incident] = rig.incident_records("plainer")
        assert (incident["status"], record.state) == ("unverified", S.RUNNING)
        second.release()
        await rig.until_settled("plainer")
        assert record.state is S.COMPLETED

    play(tmp_path, scenario)


def test_a_plain_program_stall_sends_no_stack_dump_signal(tmp_path: Path) -> None:
    """A plain program whose heartbeat stops: stopped as a stall, never sent SIGUSR1."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit(
            "beating",
            command=["/usr/bin/true"],
            sdk=False,
            heartbeat={"pattern": r"^step \d+"},
            supervision={"max_restarts": 0},
        )
        rig.launcher.plan("beating", [Line("step 1"), Line("step 2"), Hang()])
        await rig.launched(record)
        attempt = rig.launcher.attempts[0]
        await attempt.reached()
        assert record.state is S.RUNNING
        rig.clock.advance(5.0)
        await rig.until_settled("beating")
        assert attempt.received == ["stop(0.01)", "SIGTERM"]
        assert record.history[3]["reason"] == "no heartbeat for 5.00 s (timeout 5 s)"
        assert (record.state, record.reason) == (S.FAILED, "stall; max_restarts exhausted")

    play(tmp_path, scenario)


# ---- defects in the caller


def test_an_outcome_without_the_attempt_it_needs_is_refused(tmp_path: Path) -> None:
    """A restart with no attempt to restart from is a defect: UnappliableOutcome, no change."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("orphan")
        supervisor = rig.supervise(record)
        with pytest.raises(policy.UnappliableOutcome):
            supervisor.apply(policy.Restart(0.0, "restart", K.CRASH))
        assert (record.state, rig.settled) == (S.QUEUED, [])

    play(tmp_path, scenario)


# ---- a recovery settled at completion, and a daemon's own restart


def test_a_recovery_that_completes_before_its_replay_ends_is_settled_then(
    tmp_path: Path,
) -> None:
    """An SDK program (its step count its own) whose resumed attempt completes before the
    failed attempt's last logged update: the verifier is settled at completion with what was
    compared, and the incident says the job completed."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("short", command=["python3", "train.py"], run=None)
        longer = rig.worker(record)
        work = replace(longer, steps=6)
        rig.launcher.plan(
            "short",
            [*longer.start(), *longer.updates(1, 7), Exit(1)],
            [*work.start(6), *work.completed()],
        )
        await rig.launched(record)
        await rig.until_settled("short")
        [incident] = rig.incident_records("short")
        assert (record.state, incident["status"]) == (S.COMPLETED, "verified")
        assert [c["step"] for c in incident["verification"]["checks"]] == [6]
        assert "The job then completed at step" in incident["outcome"]

    play(tmp_path, scenario)


def test_an_incident_folder_replaced_by_a_link_escalates_as_an_unsafe_path(
    tmp_path: Path,
) -> None:
    """A crash whose incident cannot be written without following a planted link: nothing is
    written through it, no restart, the job escalated naming the path."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("planted")
        work = rig.worker(record)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (rig.root.job("planted") / "incidents").symlink_to(elsewhere)
        rig.launcher.plan("planted", [*work.start(), *work.updates(1, 3), Exit(1)])
        await rig.launched(record)
        await rig.until_settled("planted")
        assert (record.state, list(elsewhere.iterdir())) == (S.ESCALATED, [])
        assert record.reason.startswith(f"unsafe_path: {rig.root.job('planted') / 'incidents'}")
        assert rig.saved_state("planted")["error"] == record.error
        assert len(rig.launcher.attempts) == 1

    play(tmp_path, scenario)


async def die_running(path: Path) -> None:
    """A daemon that runs the job's attempt 1 to update 3 and is then killed (its tasks
    cancelled): state.json says running, the events are on disk, nothing is concluded."""
    async with Rig(path) as first:
        record = first.submit("job")
        work = first.worker(record)
        first.launcher.plan("job", [*work.start(), *work.updates(1, 3), Hang()])
        await first.launched(record)
        await first.launcher.attempts[0].reached()


async def stop_cleanly(path: Path) -> None:
    """A daemon that runs attempt 1 to update 3, then is shut down: its worker commits."""
    async with Rig(path) as first:
        record = first.submit("job")
        work = first.worker(record)
        first.launcher.plan("job", [*work.start(), *work.updates(1, 3), Hang()])
        supervisor = await first.launched(record)
        await first.launcher.attempts[0].reached()
        await supervisor.shutdown()


@pytest.mark.parametrize(("end", "resumed_at"), [(die_running, 2), (stop_cleanly, 3)])
def test_after_the_daemons_restart_the_job_resumes_under_a_daemon_restart_incident(
    tmp_path: Path, end: Any, resumed_at: int
) -> None:
    """The next daemon loads the job, waits out its old worker and resumes it from its newest
    checkpoint as attempt 2, under a daemon_restart incident that is verified."""

    async def main() -> None:
        await end(tmp_path / "root")
        async with Rig(tmp_path / "root") as rig:
            [record] = rig.table.load()
            assert (record.state.value, record.attempt) in (("running", 1), ("preempted", 1))
            left_open = rig.incidents.carry_over(record)
            rig.launcher.plan("job", rig.worker(record).run(at=resumed_at))
            await rig.supervise(record).recover_after_restart(left_open)
            await rig.until_settled("job")
            [incident] = rig.incident_records("job")
            assert (incident["kind"], incident["status"]) == (K.DAEMON_RESTART.value, "verified")
            assert (incident["recovery_point"]["step"], record.attempt) == (resumed_at, 2)
            assert rig.states(record)[-3:] == ["recovering", "running", "completed"]
            assert record.history[-3]["reason"] == "daemon restarted"

    asyncio.run(main())


# ---- defects found, pinned until fixed


SETTLED_WITH_AN_OPEN_INCIDENT = (
    "Preempted and a refused launch settle the job without concluding the incident whose "
    "recovery was under way (outcomes.preempt and supervisor._settle_as leave the pending "
    "verifier's incident open): it stays 'open' while the daemon runs, no later attempt "
    "carries its verification on, and the next start concludes it 'interrupted' as if the "
    "daemon had been killed."
)


@pytest.mark.xfail(strict=True, reason=SETTLED_WITH_AN_OPEN_INCIDENT)
@pytest.mark.parametrize("how", ["operator stop", "launch refused"])
def test_a_job_that_settles_during_a_recovery_leaves_no_incident_open(
    tmp_path: Path, how: str
) -> None:
    """Once the job rests, none of its incidents is still open: the one whose recovery was
    cut short by a stop, or by a launch refusal, is concluded."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("cut")
        work = rig.worker(record)
        crash = [*work.start(), *work.updates(1, 5), Exit(1)]
        if how == "operator stop":
            rig.launcher.plan("cut", crash, [*work.start(4), Hang()])
        else:
            rig.launcher.plan("cut", crash, Refuse(LauncherError("the node is gone")))
        supervisor = await rig.launched(record)
        if how == "operator stop":
            await (await rig.launcher.attempt("cut", 2)).reached()
            supervisor.stop()
        await rig.until_settled("cut")
        assert record.state in (S.PREEMPTED, S.FAILED)
        assert [i["status"] for i in rig.incident_records("cut") if i["status"] == "open"] == []

    play(tmp_path, scenario)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "A stop that arrives while a stall is being handled (stack dump, then SIGTERM and the "
        "grace) is answered {'stopping': True}, but the attempt's stop reason stays 'stall' "
        "(Attempt.stopping refuses a second reason), so the policy restarts the job instead "
        "of preempting it: the operator's stop is lost without a word."
    ),
)
def test_a_stop_during_a_stall_preempts_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator stop answered 'stopping' leaves the job preempted, even when it arrives
    while the daemon is stopping a stalled attempt."""
    monkeypatch.setattr(stallevidence, "STALL_KILL_GRACE_S", 5.0)

    async def scenario(rig: Rig) -> None:
        record = rig.submit("raced", supervision={"stop_grace_s": 0.01})
        work = rig.worker(record)
        stuck = Script((*work.start(), *work.updates(1, 3), Hang()), on_term="ignore")
        rig.launcher.plan("raced", stuck, [*work.start(2), Hang()])
        supervisor = await rig.launched(record)
        first = rig.launcher.attempts[0]
        await first.reached()
        rig.clock.advance(5.0)
        await rig.until(lambda: "SIGTERM" in first.received)
        assert supervisor.stop() == {
            "job": "raced",
            "stopping": True,
            "pid": first.pid,
            "grace_s": 0.01,
        }
        await rig.until(lambda: first.exit is not None and supervisor.attempt is not first)
        await rig.until(lambda: record.state is not S.STALLED)
        assert record.state is S.PREEMPTED

    play(tmp_path, scenario)
