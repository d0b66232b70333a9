"""The supervisor in-process: a real `JobSupervisor` applying the policy's outcomes (2/2).

As test_supervisor.py, with deadlines on the rig's hand-driven clock: stalls
(after ready, at startup, of a plain program's heartbeat) and the memory
limit restart; an operator stop, a daemon shutdown and both during a restart
backoff preempt; an external SIGTERM restarts; a plain program completes and
recovers unverified; a daemon's own restart resumes under a daemon_restart
incident.  Last, what first failed here (once pinned as strict xfails): a job
that comes to rest during a recovery concludes its incident, and a stop that
comes while a stall or the memory limit is being stopped preempts the job.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.api.lifecycle import Lifecycle
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.supervise import stallevidence
from jobwarden.daemon.supervise.policy import IncidentKind
from jobwarden.daemon.supervise.supervisor import JobSupervisor
from jobwarden.states import JobState
from tests.scripted import STACK_DUMP, Exit, Hang, Line, Refuse, Script
from tests.unit.rig import Rig, play

S = JobState
K = IncidentKind


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
        assert record.history[3]["reason"] == (
            "no progress for 5.00 s in the step phase (timeout 5 s)"
        )
        [incident] = rig.incident_records("stuck")
        assert (incident["kind"], incident["status"]) == (K.STALL.value, "verified")
        assert tuple(incident["details"][k] for k in ("gap_s", "timeout_s", "phase")) == (
            5.0,
            5.0,
            "step",
        )
        assert Path(incident["evidence"]["stack dump"]).read_text() == STACK_DUMP
        assert rig.stats.stalls_detected == 1

    play(tmp_path, scenario)


def test_no_started_within_the_startup_timeout_is_a_startup_stall(tmp_path: Path) -> None:
    """Spawned but never started: the startup deadline, not the stall one, ends the attempt."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("slow", supervision={"max_restarts": 0})
        rig.launcher.plan("slow", [Hang()])
        await rig.launched(record)
        await rig.launcher.attempts[0].reached()
        rig.clock.advance(30.0)
        await rig.until_settled("slow")
        assert record.history[2]["reason"] == (
            "no started for 30.00 s in the startup phase (timeout 30 s)"
        )
        assert (record.state, record.reason) == (S.FAILED, "stall; max_restarts = 0: no restart")
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
        assert rig.event_kinds(record.id, 1)[-2:] == ["checkpoint", "preempted"]
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
        assert rig.exit_record(record.id, 1)["stopped_by"] == "shutdown"

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
        assert (record.state, record.reason) == (S.FAILED, "stall; max_restarts = 0: no restart")

    play(tmp_path, scenario)


# ---- a daemon's own restart


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


# ---- stops that overtake a recovery, a stall or a memory-limit stop


def cut_short(rig: Rig, supervisor: JobSupervisor, how: str) -> Awaitable[None] | None:
    """End the recovery under way ``how``: an operator stop of the recovery attempt (still
    importing JAX: nothing written yet), a stop or a cancel during its restart backoff."""
    if how == "cancel":
        Lifecycle(rig).handlers()["cancel"]({"jobs": [supervisor.record.id]})
        return rig.until(lambda: supervisor.record.state is S.CANCELLED)
    supervisor.stop()
    return None


@pytest.mark.parametrize("how", ["operator stop", "stop in backoff", "cancel", "launch refused"])
def test_a_job_that_settles_during_a_recovery_leaves_no_incident_open(
    tmp_path: Path, how: str
) -> None:
    """Once the job rests, none of its incidents is still open: the one whose recovery was
    cut short by a stop or a cancel is concluded interrupted, naming the job's state; one
    whose recovery attempt could not be launched, failed."""

    async def scenario(rig: Rig) -> None:
        backoff = {"restart_backoff_s": 60.0} if how == "stop in backoff" else {}
        record = rig.submit("cut", supervision=backoff)
        work = rig.worker(record)
        crash = [*work.start(), *work.updates(1, 5), Exit(1)]
        if how == "launch refused":
            rig.launcher.plan("cut", crash, Refuse(LauncherError("the node is gone")))
        elif how == "stop in backoff":  # the first restart is at once, the second waits
            rig.launcher.plan("cut", crash, [*work.start(4), Exit(1)])
        else:
            rig.launcher.plan("cut", crash, [Hang("importing jax")])
        supervisor = await rig.launched(record)
        if how == "stop in backoff":
            await rig.until(lambda: record.restarts == 2 and supervisor.attempt is None)
            cut_short(rig, supervisor, how)
        elif how != "launch refused":
            await (await rig.launcher.attempt("cut", 2)).reached("importing jax")
            if (waiting := cut_short(rig, supervisor, how)) is not None:
                await waiting
        await rig.until_settled("cut")
        incidents = rig.incident_records("cut")
        assert [i["status"] for i in incidents if i["status"] == "open"] == []
        cut = incidents[-1]
        if how == "launch refused":
            crashed, launch = incidents
            assert (record.state, record.history[-1]["incident"]) == (S.FAILED, launch["id"])
            assert (launch["kind"], launch["status"]) == (K.LAUNCH_FAILED.value, "failed")
            assert (crashed["kind"], crashed["status"]) == (K.CRASH.value, "failed")
            assert f"see incident {launch['id']}" in crashed["outcome"]
        else:
            assert record.state in (S.PREEMPTED, S.CANCELLED)
            assert (cut["kind"], cut["status"]) == (K.CRASH.value, "interrupted")
            assert "it is preempted (stopped by operator" in cut["outcome"]
            assert cut["closed"] is not None

    play(tmp_path, scenario)


def ended(rig: Rig, job_id: str) -> bool:
    """Whether the end of the job's first attempt is handled: its exit.json written (off the
    loop), then its outcome applied (here, the job at rest)."""
    return (rig.root.attempt(job_id, 1) / "exit.json").exists() and job_id in rig.settled


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
        await rig.until(lambda: ended(rig, "raced"))
        assert rig.states(record)[-2:] == ["stalled", "preempted"]
        assert record.reason == "stopped by operator at step 3"
        assert (len(rig.launcher.attempts), record.restarts, record.incidents) == (1, 0, [])
        stopped = rig.exit_record("raced", 1)
        assert (stopped["stopped_by"], stopped["superseded"]) == ("operator", "stall")

    play(tmp_path, scenario)


def test_a_stop_during_a_memory_limit_stop_preempts_the_job(tmp_path: Path) -> None:
    """The same for a stop that comes while the daemon stops an attempt over max_rss_mb."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("fat", supervision={"max_rss_mb": 100, "stop_grace_s": 2})
        work = rig.worker(record)
        stuck = Script((*work.start(), *work.updates(1, 3), Hang()), on_term="ignore")
        rig.launcher.plan("fat", stuck, [*work.start(2), Hang()])
        supervisor = await rig.launched(record)
        first = rig.launcher.attempts[0]
        await first.reached()
        first.resources = {"rss_mb": 512.0}
        supervisor.sample()
        await rig.until(lambda: "SIGTERM" in first.received)
        assert supervisor.stop() is not None
        first.kill()
        await rig.until(lambda: ended(rig, "fat"))
        assert (record.state, record.reason) == (S.PREEMPTED, "stopped by operator at step 3")
        assert (len(rig.launcher.attempts), record.incidents) == (1, [])
        assert rig.exit_record("fat", 1)["superseded"] == "rss"

    play(tmp_path, scenario)


def test_a_recovery_cut_short_by_a_planted_incident_folder_still_frees_the_slot(
    tmp_path: Path,
) -> None:
    """The incident folder becomes a link while a recovery is under way: the job is escalated
    unsafe_path and frees its slot, though the recovery's incident cannot be concluded (the
    refusal is logged; nothing is written through the link)."""

    async def scenario(rig: Rig) -> None:
        record = rig.submit("linked")
        work = rig.worker(record)
        crash = [*work.start(), *work.updates(1, 5), Exit(1)]
        rig.launcher.plan("linked", crash, [Hang("planting"), *work.start(4), Hang()])
        await rig.launched(record)
        await (await rig.launcher.attempt("linked", 2)).reached("planting")
        folder, elsewhere = rig.root.job("linked") / "incidents", tmp_path / "elsewhere"
        folder.rename(elsewhere)
        folder.symlink_to(elsewhere)
        kept = sorted(p.name for p in elsewhere.iterdir())
        rig.launcher.attempts[1].release()
        await rig.until_settled("linked")
        assert (record.state, rig.settled) == (S.ESCALATED, ["linked"])
        assert record.reason.startswith(f"unsafe_path: {folder}")
        assert sorted(p.name for p in elsewhere.iterdir()) == kept

    play(tmp_path, scenario)
