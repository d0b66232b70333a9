"""The supervisor in-process: a real `JobSupervisor` applying the policy's outcomes (1/2).

Each test drives one job through the real supervisor, `JobTable`,
`IncidentLog` and `Root` on tmp_path, with attempts played by the scripted
launcher (`tests.scripted`), so no worker, no JAX and no sleep is involved.
Here: completed; restarts after a crash, with the replay verified,
unverified, or failed again, and settled at completion; escalated (a replay
mismatch, each escalating refusal code, a duplicate writer, unsafe paths);
failed (restarts spent, a fatal exit status, a launch refused); an outcome
without its attempt.  Stalls, limits, stops and restarts of the daemon are
in test_supervisor_stops.py.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import replace
from pathlib import Path

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
from jobwarden.daemon.supervise import policy
from jobwarden.daemon.supervise.policy import IncidentKind
from jobwarden.errors import (
    JobFileError,
    JobwardenError,
    ResumePolicyError,
    UnsafeCacheError,
    WriterLockedError,
)
from jobwarden.files import UnsafePathError
from jobwarden.states import JobState
from tests.scripted import Exit, Hang, Line, Refuse, Stderr
from tests.unit.rig import Rig, play

S = JobState
K = IncidentKind


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
            rig.exit_record(record.id, 1)[k] for k in ("exit_status", "signal", "stopped_by")
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


def test_an_ended_attempt_keeps_its_exit_and_phases_before_its_outcome(tmp_path: Path) -> None:
    """exit.json and phases.json, written together off the loop, are both in the attempt's
    folder when its outcome is applied (the crash's incident written, the job failed)."""
    seen: list[list[str]] = []

    async def scenario(rig: Rig) -> None:
        record = rig.submit("kept", supervision={"max_restarts": 0})
        work = rig.worker(record)
        rig.launcher.plan("kept", [*work.start(), *work.updates(1, 2), Exit(1)])
        rig.incidents.listeners.append(
            lambda incident, _: seen.append(sorted(os.listdir(rig.root.attempt("kept", 1))))
        )
        await rig.launched(record)
        await rig.until_settled("kept")
        assert record.state is S.FAILED
        assert {"exit.json", "phases.json"} <= set(seen[0])
        assert rig.exit_record("kept", 1)["exit_status"] == 1

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
        assert rig.event_kinds(record.id, 2) == ["started", "restored", "ready", "progress"]
        assert tuple(rig.exit_record(record.id, 2)[k] for k in ("signal", "stopped_by")) == (
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


@pytest.mark.parametrize(
    ("refusal", "code", "mend"),
    [
        (LauncherError("sbatch: invalid partition"), None, "Mend what the error names."),
        (OSError(errno.E2BIG, "Argument list too long", "train"), "E2BIG", "Keep each command"),
    ],
)
def test_a_launch_that_fails_fails_the_job_with_a_launch_incident(
    tmp_path: Path, refusal: Exception, code: str | None, mend: str
) -> None:
    """The launcher refuses the attempt, or execve fails: the job is failed naming it, under a
    launch_failed incident concluded failed at once (never retried), saying what to mend."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("unlaunchable")
        rig.launcher.plan("unlaunchable", Refuse(refusal))
        await rig.launched(record)
        assert rig.settled == ["unlaunchable"]
        assert rig.states(record) == ["queued", "starting", "failed"]
        assert record.reason == f"attempt 1 could not be launched: {refusal}"
        assert (len(rig.launcher.attempts), rig.saved_state("unlaunchable")["attempt"]) == (0, 1)
        [incident] = rig.incident_records("unlaunchable")
        assert (incident["kind"], incident["status"]) == (K.LAUNCH_FAILED.value, "failed")
        assert record.history[-1]["incident"] == incident["id"]
        assert (incident["details"].get("errno"), incident["details"]["error"]) == (
            code,
            str(refusal),
        )
        assert incident["prevention"][0].startswith(mend)
        assert "never retried" in incident["outcome"]

    play(tmp_path, scenario)


def test_restarts_without_progress_exhausted_fail_the_job(tmp_path: Path) -> None:
    """max_restarts = 1: attempt 1 commits step 2 and crashes (progress: restarted), then
    two attempts crash before any update; the second of them fails the job as a
    deterministic failure, and the incidents say why."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("flaky", supervision={"max_restarts": 1})
        work = rig.worker(record)
        rig.launcher.plan(
            "flaky",
            [*work.start(), *work.updates(1, 3), Exit(1)],
            [*work.start(2), Exit(1)],
            [*work.start(2), Exit(1)],
        )
        await rig.launched(record)
        await rig.until_settled("flaky")
        assert (record.state, record.reason) == (
            S.FAILED,
            "crash; no progress in 2 attempts: each died before its first update with "
            "'exit status 1', a deterministic failure (max_restarts 1)",
        )
        *_, third = rig.incident_records("flaky")
        assert third["status"] == "failed"
        assert "max_restarts is 1" in third["outcome"]
        assert third["details"]["crash_loop"]["deterministic"] is True
        assert [a["restored_step"] for a in third["details"]["crash_loop"]["attempts"]] == [2, 2]
        assert (record.restarts, len(rig.launcher.attempts)) == (2, 3)

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


# ---- a recovery settled at completion, and a link planted where incidents go


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
