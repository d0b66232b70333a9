"""A daemon SIGKILLed at its worst instants: no job escalated wrongly, no incident left open.

Real wardend processes and real workers on CPU.  The instant between a
worker's start and the save of its pid is reached with the test-only fault
``pause_after_launch`` (the daemon blocks there, so the test can SIGKILL it
exactly then); the other kills land while a recovery is still being proven.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jobwarden.checkpoint import format
from jobwarden.protocol import ControlError
from jobwarden.testfaults import ENV, Fault
from tests.daemon import Daemon, linreg_job
from tests.helpers import AttemptResult, kinds, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def started() -> Iterator[list[Daemon]]:
    """Daemons a test starts outside a ``with``: any still running at its end is killed."""
    daemons: list[Daemon] = []
    yield daemons
    for daemon in daemons:
        daemon.stop(signal.SIGKILL)


def final_arrays(path: Path) -> dict[str, bytes]:
    """The raw bytes of every leaf of a checkpoint file."""
    return {p: a.tobytes() for p, a in format.read(path).arrays.items()}


def reference_final(reference: AttemptResult) -> dict[str, bytes]:
    """The uninterrupted default run's final state."""
    return final_arrays(Path(kinds(reference, "completed")[0]["file"]))


def newest(folder: Path) -> Path:
    """The newest committed checkpoint file in a directory."""
    return sorted(folder.glob("ckpt-*.safetensors"))[-1]


def saved_state(daemon: Daemon, job: str) -> dict[str, Any]:
    """The job's state.json as it is on disk."""
    saved: dict[str, Any] = json.loads((daemon.job_folder(job) / "state.json").read_text())
    return saved


def assert_replayed_exactly(daemon: Daemon, job: str, attempt: int, reference: Any) -> None:
    """Every update of ``attempt`` has the reference run's state hash at the same step, and
    the job's final checkpoint is bit-equal to the reference's."""
    logged = {e["step"]: e["state_hash"] for e in kinds(reference, "progress")}
    replayed = [e for e in daemon.events(job, attempt) if e["event"] == "progress"]
    assert replayed
    assert {e["step"]: e["state_hash"] for e in replayed} == {
        e["step"]: logged[e["step"]] for e in replayed
    }
    assert final_arrays(newest(daemon.root / "checkpoints" / job)) == reference_final(reference)


def test_a_kill_between_launch_and_pid_save_waits_for_the_orphan_and_resumes_exactly(
    tmp_path: Path,
    compile_cache: Path,
    reference: AttemptResult,
    monkeypatch: pytest.MonkeyPatch,
    started: list[Daemon],
) -> None:
    """state.json says starting with no pid; the restarted daemon finds the worker still
    holding the writer lock, waits for it (no attempt 2 while it lives), and once it is gone
    completes the job: no duplicate_writer.

    The orphan stalls for good after step 2's commit and the test kills it only once the
    second daemon says it waits, so the wait is seen however slowly that daemon starts.
    The first daemon is killed only once the orphan's stderr says its stall began: killed
    between the commit and the stall, it would have the orphan preempted (its supervisor
    gone) and leave none."""
    monkeypatch.setenv(ENV, Fault.PAUSE_AFTER_LAUNCH.value)
    first = Daemon(tmp_path / "root", compile_cache).start()
    started.append(first)
    # The worker holds the writer lock from its start and stalls after step 2's commit.
    first.drop("orphan.toml", linreg_job("orphan", faults={"stall_at": 2, "stall_seconds": 600}))
    log = first.root / "wardend.log"
    wait_until(log.read_text, lambda t: "testfault.paused" in t, timeout=30, what="the pause")
    saved = saved_state(first, "orphan")
    assert (saved["state"], saved["attempt"], saved["pid"]) == ("starting", 1, None)
    checkpoints = first.root / "checkpoints" / "orphan"
    wait_until(
        lambda: list(checkpoints.glob("ckpt-0000000002.safetensors")),
        timeout=60,
        what="the orphan's commit of step 2",
    )
    orphan = int((checkpoints / ".writer.lock").read_text())
    stderr = first.root / "jobs" / "orphan" / "attempts" / "1" / "stderr.log"
    wait_until(
        stderr.read_text,
        lambda text: "injected stall of 600 s after update 2" in text,
        timeout=60,
        what="the orphan's stall",
    )
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    monkeypatch.delenv(ENV)
    with Daemon(tmp_path / "root", compile_cache) as second:
        wait_until(log.read_text, lambda t: '"orphan.waiting"' in t, timeout=60, what="the wait")
        assert saved_state(second, "orphan")["attempt"] == 1
        assert psutil.pid_exists(orphan)
        os.kill(orphan, signal.SIGKILL)
        status = second.wait("orphan", timeout=120)
        incidents = second.incidents("orphan")
        waited = [
            json.loads(line) for line in log.read_text().splitlines() if '"orphan.waiting"' in line
        ]
    assert (status["state"], status["attempt"]) == ("completed", 2), status["reason"]
    assert [(i["kind"], i["status"]) for i in incidents] == [("daemon_restart", "unverified")]
    assert [(w["pid"], w["pid_saved"]) for w in waited] == [(orphan, False)]
    assert_replayed_exactly(second, "orphan", 2, reference)


def test_two_kills_in_a_row_leave_no_incident_open(
    tmp_path: Path, compile_cache: Path, reference: AttemptResult, started: list[Daemon]
) -> None:
    """Killed while running, then again while the restart's recovery is unproven: the first
    daemon_restart incident is concluded interrupted, the second settled, the job exact."""
    slow = {"step_delay_s": 0.4, "every_attempt": True}
    first = Daemon(tmp_path / "root", compile_cache).start()
    started.append(first)
    first.drop("twice.toml", linreg_job("twice", faults=slow))
    wait_until(
        lambda: first.state("twice"),
        lambda status: status["step"] >= 3,
        timeout=60,
        what="attempt 1 past step 3",
        retry=(ControlError,),
    )
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    second = Daemon(tmp_path / "root", compile_cache).start()
    started.append(second)
    opened = wait_until(
        lambda: second.incidents("twice"),
        lambda found: [i["kind"] for i in found] == ["daemon_restart"],
        timeout=60,
        what="the first restart's incident",
    )
    assert opened[0]["status"] == "open"
    assert second.stop(signal.SIGKILL) == -signal.SIGKILL
    with Daemon(tmp_path / "root", compile_cache) as third:
        status = third.wait("twice", timeout=120)
        incidents = third.incidents("twice")
    assert status["state"] == "completed", status["reason"]
    assert [(i["kind"], i["status"]) for i in incidents[:1]] == [("daemon_restart", "interrupted")]
    # The second proves against attempt 2's log, which the second kill may have left empty.
    assert [(i["kind"], i["status"] in ("verified", "unverified")) for i in incidents[1:]] == [
        ("daemon_restart", True)
    ]
    assert all(i["closed"] is not None for i in incidents)
    assert f"incident {incidents[1]['id']} carries the recovery on" in incidents[0]["outcome"]
    assert_replayed_exactly(third, "twice", status["attempt"], reference)
