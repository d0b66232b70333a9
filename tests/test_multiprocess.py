"""Multi-process jobs through a real wardend: N members joined by jax.distributed, restart-all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jobwarden.daemon.launch.base import ATTEMPT_ENV
from jobwarden.protocol import ControlError
from tests.daemon import Daemon, linreg_job
from tests.helpers import AttemptResult, kinds, wait_until

pytestmark = pytest.mark.slow

WARDENCTL = [sys.executable, "-m", "jobwarden.control.cli"]
TRAIN = {"seed": 3, "learning_rate": 0.04, "momentum": 0.8, "batch_size": 8}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One wardend for the module; each test uses its own job and checkpoint."""
    base = tmp_path_factory.mktemp("mp")
    with Daemon(base / "root", base / "cache") as running:
        yield running


def running(proc: psutil.Process) -> bool:
    """Whether ``proc`` (the same process, not a reuse of its pid) has not exited."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def members_alive(job_folder: Path) -> list[int]:
    """Pids of live processes whose environment names an attempt folder of the job."""
    prefix = f"{job_folder}{os.sep}attempts{os.sep}"
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(ATTEMPT_ENV, "").startswith(prefix):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def submit(daemon: Daemon, job: str, processes: int = 2, **sections: dict[str, Any]) -> None:
    run = {"steps": 8, "checkpoint_every": 2, "processes": processes, **sections.pop("run", {})}
    daemon.drop(f"{job}.toml", linreg_job(job, job, train=TRAIN, run=run, **sections))


def settle(daemon: Daemon, job: str, timeout: float = 180) -> dict[str, Any]:
    """Wait for the job to settle, then check that none of its members outlived it."""
    status = daemon.wait(job, timeout=timeout)
    deadline = time.monotonic() + 10
    while members_alive(daemon.job_folder(job)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert members_alive(daemon.job_folder(job)) == []
    return status


def final_hashes(daemon: Daemon, job: str, attempt: int) -> list[str]:
    """Each member's ``completed`` state hash in one attempt."""
    folder = daemon.job_folder(job) / "attempts" / str(attempt)
    hashes = []
    for name in ("events.jsonl", "events.1.jsonl"):
        lines = (folder / name).read_text().splitlines()
        done = [json.loads(x) for x in lines if '"completed"' in x]
        hashes.append(done[-1]["state_hash"])
    return hashes


def members_record(daemon: Daemon, job: str, attempt: int) -> dict[str, Any]:
    path = daemon.job_folder(job) / "attempts" / str(attempt) / "members.json"
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


class TestTwoProcesses:
    def test_completes_with_both_members_agreeing(self, daemon: Daemon) -> None:
        """A 2-process job completes; both members end in the same state, each kept apart."""
        submit(daemon, "mp-ok")
        assert settle(daemon, "mp-ok")["state"] == "completed"
        first, second = final_hashes(daemon, "mp-ok", 1)
        assert first == second
        record = members_record(daemon, "mp-ok", 1)
        assert [m["exit_status"] for m in record["members"]] == [0, 0]

    def test_same_hashes_as_single_process_linreg(self, daemon: Daemon) -> None:
        """Replicated linreg in 2 processes makes the updates a single process makes."""
        submit(daemon, "mp-one", processes=1)
        assert settle(daemon, "mp-one")["state"] == "completed"
        folder = daemon.job_folder("mp-one") / "attempts" / "1"
        lines = (folder / "events.jsonl").read_text().splitlines()
        single = [json.loads(x) for x in lines if '"completed"' in x][-1]["state_hash"]
        assert [single, single] == final_hashes(daemon, "mp-ok", 1)


def test_async_commit_in_a_two_process_job_recovers_verified_to_the_same_state(
    daemon: Daemon,
) -> None:
    """[run] async_commit with 2 processes: member 1 killed after update 5 of 8, all restart
    from a durable checkpoint, the replay is verified, and both members end in the state of
    the same job committing synchronously with no failure."""
    submit(daemon, "mp-sync")
    submit(daemon, "mp-async", run={"async_commit": True}, faults={"crash_after": 5, "process": 1})
    assert settle(daemon, "mp-sync")["state"] == "completed"
    status = settle(daemon, "mp-async")
    assert (status["state"], status["attempt"]) == ("completed", 2)
    [incident] = daemon.incidents("mp-async")
    assert incident["verification"]["verdict"] == "verified"
    assert incident["recovery_point"]["step"] in (2, 4)
    events = (daemon.job_folder("mp-async") / "attempts" / "1" / "events.jsonl").read_text()
    committed = [json.loads(x) for x in events.splitlines() if '"checkpoint"' in x]
    assert committed, "attempt 1 committed nothing before the kill"
    # a commit durable in the instant before the kill may not have said so yet
    assert incident["recovery_point"]["step"] >= committed[-1]["step"]
    assert final_hashes(daemon, "mp-async", 2) == final_hashes(daemon, "mp-sync", 1)


@pytest.mark.parametrize("member", [0, 1])
def test_crash_of_either_member_restarts_all_verified(daemon: Daemon, member: int) -> None:
    """A member killed after update 3 fails the attempt; all restart, the replay is verified."""
    job = f"mp-crash{member}"
    submit(daemon, job, faults={"crash_after": 3, "process": member})
    status = settle(daemon, job)
    assert (status["state"], status["attempt"]) == ("completed", 2)
    first = members_record(daemon, job, 1)
    assert member == first["failed_member"]
    assert first["members"][member]["exit_status"] == -9
    [incident] = daemon.incidents(job)
    assert incident["verification"]["verdict"] == "verified"
    resumed = members_record(daemon, job, 2)["members"][1]
    assert (resumed["replay_checks"] > 0, resumed["replay_ok"]) == (True, True)


def test_stalled_member_is_named(daemon: Daemon) -> None:
    """Member 1 hangs after update 3: the stall names it, and all restart from step 2."""
    job = "mp-stall"
    submit(
        daemon,
        job,
        faults={"stall_at": 3, "stall_seconds": 120, "process": 1},
        supervision={"stall_timeout_s": 3.0},
    )
    status = settle(daemon, job)
    assert (status["state"], status["attempt"]) == ("completed", 2)
    [incident] = daemon.incidents(job)
    assert (incident["kind"], incident["details"]["stalled_member"]) == ("stall", 1)
    assert incident["details"]["missing"] == []


def test_process_count_mismatch_is_refused(daemon: Daemon) -> None:
    """A 2-process checkpoint resumed by a 4-process job is refused naming both counts."""
    submit(daemon, "mp-two", run={"steps": 4})
    assert settle(daemon, "mp-two")["state"] == "completed"
    text = linreg_job(
        "mp-four",
        "mp-two",
        train=TRAIN,
        run={"steps": 8, "checkpoint_every": 2, "processes": 4, "resume": "require"},
    )
    daemon.drop("mp-four.toml", text)
    status = settle(daemon, "mp-four")
    assert status["state"] == "escalated"
    [incident] = daemon.incidents("mp-four")
    text = json.dumps(incident)
    assert "processes (saved '2', running '4')" in text


@pytest.mark.parametrize(
    ("fault", "member", "restored"),
    [
        ({"crash_after": 3}, 1, 2),  # a member dies before the step-4 hash comparison
        ({"stall_at": 3, "stall_seconds": 120}, 1, 2),  # ... or hangs before it, then is killed
        ({"crash_in_commit": 4}, 0, 2),  # member 0 dies with step 4 durable but not in place
        ({"crash_after": 4}, 0, 4),  # ... or just after step 4 is committed
    ],
)
def test_kill_at_each_commit_phase_resumes_from_the_last_complete_step(
    daemon: Daemon, fault: dict[str, Any], member: int, restored: int
) -> None:
    """Whichever member dies at whichever phase of a commit, all resume from the newest
    complete step and verify."""
    job = f"mp-phase-{next(iter(fault))}-{member}".replace("_", "-")
    submit(daemon, job, faults={**fault, "process": member}, supervision={"stall_timeout_s": 3.0})
    status = settle(daemon, job)
    assert (status["state"], status["attempt"]) == ("completed", 2)
    [incident] = daemon.incidents(job)
    assert incident["recovery_point"]["step"] == restored
    assert incident["verification"]["verdict"] == "verified"


def test_status_of_a_running_two_process_job_shows_each_member(daemon: Daemon) -> None:
    """wardenctl status JOB: one line per member, with its pid, rss, step and progress age;
    once the job has ended, how each member of its newest attempt ended."""
    job = "mp-status"
    submit(daemon, job, faults={"step_delay_s": 0.5})
    detail = wait_until(
        lambda: daemon.ask("status", job=job),
        lambda found: (
            found["state"] == "running"
            and all(m["step"] >= 2 for m in found.get("members") or [{"step": -1}])
        ),
        timeout=120,
        what="both members past step 2",
        retry=(ControlError,),
    )
    members = detail["members"]
    pids = [m["pid"] for m in members]
    assert [m["process"] for m in members] == [0, 1]
    assert sorted(pids) == sorted(members_alive(daemon.job_folder(job)))
    assert all(m["rss_mb"] > 0 and m["progress_age_s"] is not None for m in members)
    text = subprocess.run(
        [*WARDENCTL, "--root", str(daemon.root), "status", job],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    block = text.split("members:\n", 1)[1].splitlines()
    assert block[0].split() == ["MEMBER", "PID", "NODE", "RSS", "STEP", "LAST", "READY", "EXIT"]
    assert [line.split()[:2] for line in block[1:3]] == [["0", str(pids[0])], ["1", str(pids[1])]]
    assert settle(daemon, job)["state"] == "completed"
    ended = daemon.ask("status", job=job)["members"]  # nothing runs: how each member ended
    assert [(m["pid"], m["exit_status"]) for m in ended] == [(pids[0], 0), (pids[1], 0)]


def test_a_daemon_killed_under_a_two_process_job_leaves_no_member_of_it(
    tmp_path: Path, compile_cache: Path, reference: AttemptResult
) -> None:
    """wardend SIGKILLed while both members run: the restarted daemon finds every member of
    the old attempt (not only member 0) and waits them out; none outlives it, and the job
    completes with every update's state equal to the uninterrupted run's."""
    job = "mp-orphans"
    first = Daemon(tmp_path / "root", compile_cache).start()
    try:
        # Both members hold still after update 3 (past the kill and the next daemon's start),
        # then see their stdout gone and leave.
        submit(first, job, faults={"stall_at": 3, "stall_seconds": 8})
        attempt = first.job_folder(job) / "attempts" / "1"
        wait_until(
            lambda: [
                (attempt / name).read_text() if (attempt / name).exists() else ""
                for name in ("events.jsonl", "events.1.jsonl")
            ],
            lambda logs: all('"stall_injected"' in log for log in logs),
            timeout=120,
            what="both members holding still after update 3",
        )
        old = [psutil.Process(pid) for pid in members_alive(first.job_folder(job))]
        assert len(old) == 2
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        first.stop(signal.SIGKILL)
    with Daemon(tmp_path / "root", compile_cache) as second:
        status = settle(second, job)
        attempts = sorted(int(p.name) for p in second.job_folder(job).glob("attempts/*"))
        # Every member's updates and restored states: the old members ran on past the kill
        # (their step 4 is not logged, their stdout gone) and committed step 4 on their way.
        logs = second.job_folder(job).glob("attempts/*/events*.jsonl")
        events = [json.loads(line) for path in logs for line in path.read_text().splitlines()]
        logged = [e for e in events if e["event"] in ("progress", "ready") and e["step"] > 0]
    assert status["state"] == "completed", status["reason"]
    # is_running: the same process, not a reuse; a zombie has exited (this machine's init
    # reaps orphans about a second late), as the daemon's own wait_orphan judges it
    assert [p for p in old if running(p)] == []
    # ... and the restarted daemon waited for each of them, member 1 as well as member 0.
    log = (tmp_path / "root.stderr").read_text().splitlines()
    waited = {json.loads(line)["pid"] for line in log if '"orphan.waiting"' in line}
    assert {p.pid for p in old} <= waited
    expected = {e["step"]: e["state_hash"] for e in kinds(reference, "progress")}
    assert {(e["step"], e["state_hash"]) for e in logged} == set(expected.items())
    assert final_hashes(second, job, attempts[-1]) == [reference_final_hash(reference)] * 2


def reference_final_hash(reference: AttemptResult) -> str:
    """The uninterrupted single-process run's final state hash (replicated linreg equals it)."""
    return str(kinds(reference, "completed")[-1]["state_hash"])


def drill(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """wardenctl drill NAME --processes 2 with ``args``."""
    argv = [*WARDENCTL, "drill", name, "--processes", "2", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("name", ["crash", "stall"])
def test_drill_of_two_processes_verifies_each_member(
    tmp_path: Path, compile_cache: Path, name: str
) -> None:
    """wardenctl drill crash|stall --processes 2: member 1 fails (or hangs), both restart,
    and every resumed update of each member equals the reference's same member."""
    done = drill(name, "--json", "--out", str(tmp_path), "--compile-cache", str(compile_cache))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = json.loads(done.stdout)
    assert (verdict["ok"], verdict["processes"]) == (True, 2)
    restored = {"crash": 2, "stall": 4}[name]
    replayed = list(range(restored + 1, 9))
    assert [
        (m["process"], m["replayed_steps"], m["differing_steps"]) for m in verdict["members"]
    ] == [
        (0, replayed, []),
        (1, replayed, []),
    ]
    assert all(m["replay_verified"] and m["replay_checks"] > 0 for m in verdict["members"])
    checks = {c["name"]: c for c in verdict["checks"]}
    if name == "stall":
        assert checks["the stall names member 1, the one that hung"]["stalled_member"] == 1
    else:
        assert checks["the attempt failed by member 1, and every member was stopped"]["ok"]
    jobs = tmp_path / "root" / "jobs"
    assert all(members_alive(folder) == [] for folder in jobs.iterdir())


def test_drill_of_two_processes_refuses_the_single_process_drills(tmp_path: Path) -> None:
    """The drills that rehearse one process only are refused for --processes 2, named."""
    done = drill("corrupt", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "the corrupt drill rehearses one process only" in done.stderr
