"""Spares of users' SDK programs through a real wardend: handed, refused, replaced, killed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.daemon import ANY_STATE, Daemon, ctl
from tests.helpers import wait_until
from tests.test_command_jobs import command_job
from tests.test_warm_spare import log_records, open_under

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SLOW_FIRST_ATTEMPT = {"step_delay_s": 2.5}
"""20 s for attempt 1's 8 updates: time for its spare to be ready, whatever the load."""


@pytest.fixture
def daemon(tmp_path: Path, compile_cache: Path) -> Iterator[Daemon]:
    """A running wardend on a fresh root."""
    with Daemon(tmp_path / "root", compile_cache) as running:
        yield running


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """tests/sdk_program.py where a user keeps it."""
    path = tmp_path / "work" / "train.py"
    path.parent.mkdir()
    shutil.copy(HERE / "sdk_program.py", path)
    return path


def drop_job(daemon: Daemon, program: Path, job_id: str = "user") -> None:
    """An SDK command job of ``program``, 8 updates, attempt 1 slowed by the drill fault."""
    text = command_job(
        job_id,
        [sys.executable, str(program)],
        workdir=str(program.parent),
        run={"steps": 8},
        faults=SLOW_FIRST_ATTEMPT,
        supervision={"stall_timeout_s": 60},
    )
    daemon.drop(f"{job_id}.toml", text)
    daemon.wait(job_id, ANY_STATE, timeout=30)


def wait_spare(daemon: Daemon, job_id: str, other_than: int = 0) -> dict[str, Any]:
    """The job's spare as status shows it, once one (not ``other_than``) is ready."""

    def spare() -> Any:
        return daemon.state(job_id).get("spare") or {}

    found: dict[str, Any] = wait_until(
        spare,
        lambda s: s.get("state") == "ready" and s.get("pid") != other_than,
        timeout=90,
        what="a ready spare",
    )
    return found


def crash_at_step(daemon: Daemon, job_id: str, step: int) -> None:
    """SIGKILL the job's worker once it reports ``step`` (a checkpoint holds step 4)."""
    status = wait_until(
        lambda: daemon.state(job_id), lambda s: (s["step"] or 0) >= step, timeout=60, what="step"
    )
    assert (status["attempt"], status["step"] < 8) == (1, True), "attempt 1 ended too soon"
    os.kill(status["pid"], signal.SIGKILL)


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts)."""
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True


def naming(folder: Path) -> list[int]:
    """Every process whose environment names ``folder`` (a spare's, or its children's)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("JOBWARDEN_ATTEMPT_FOLDER") == str(folder):
                found.append(proc.pid)
    return found


def test_a_crash_is_handed_to_the_programs_spare_and_verified(
    daemon: Daemon, program: Path
) -> None:
    """SIGKILL of attempt 1: attempt 2 is the waiting spare (holding nothing before), verified;
    once the job completes no spare is left."""
    drop_job(daemon, program)
    spare = wait_spare(daemon, "user")
    checkpoints = daemon.root / "checkpoints" / "user"
    held_while_waiting = open_under(spare["pid"], checkpoints)
    shown = ctl(daemon, "status", "user").stdout
    crash_at_step(daemon, "user", 5)
    status = daemon.wait("user", timeout=120)
    folders = list((daemon.job_folder("user") / "spares").iterdir())
    left = wait_until(
        lambda: [pid for folder in folders for pid in naming(folder)],
        lambda pids: pids == [],
        timeout=10,
        what="no spare left once the job completed",
    )
    (handed,) = log_records(daemon, "spare.handed")
    resumed = daemon.events("user", 2)
    (incident,) = daemon.incidents("user")
    spare_stderr = next((daemon.job_folder("user") / "spares").glob("*/stderr.log"))
    assert held_while_waiting == []
    assert "spare: ready, " in shown
    assert f"pid {spare['pid']}" in shown
    assert left == []
    assert spare["rss_mb"] > 0
    assert (status["state"], status["attempt"], status["step"]) == ("completed", 2, 8)
    assert (handed["pid"], handed["attempt"]) == (spare["pid"], 2)
    assert [e["event"] for e in resumed][:3] == ["started", "restored", "ready"]
    assert resumed[0]["pid"] == spare["pid"]
    assert resumed[1]["step"] == 4
    assert (incident["kind"], incident["status"]) == ("crash", "verified")
    assert "Traceback" not in spare_stderr.read_text()


def test_a_spare_of_stale_sources_is_refused_and_the_job_starts_cold(
    daemon: Daemon, program: Path
) -> None:
    """The program's source edited while its spare waits: the spare refuses, attempt 2 is cold."""
    drop_job(daemon, program)
    spare = wait_spare(daemon, "user")
    program.write_text(program.read_text() + "\n# edited while the spare waited\n")
    crash_at_step(daemon, "user", 5)

    def attempt_2_started() -> list[dict[str, Any]]:
        with contextlib.suppress(OSError):
            return [e for e in daemon.events("user", 2) if e["event"] == "started"]
        return []

    started = wait_until(attempt_2_started, timeout=60, what="attempt 2 started")
    (refused,) = log_records(daemon, "spare.refused")
    assert refused["pid"] == spare["pid"]
    assert "sources changed" in json.dumps(refused["answer"])
    assert started[0]["pid"] != spare["pid"]
    assert gone(spare["pid"])
    assert log_records(daemon, "spare.handed") == []


def test_a_spare_killed_while_waiting_is_replaced_and_the_new_one_handed(
    daemon: Daemon, program: Path
) -> None:
    """SIGKILL of the waiting spare: another starts, and the crash is handed to that one."""
    drop_job(daemon, program)
    first = wait_spare(daemon, "user")
    os.kill(first["pid"], signal.SIGKILL)
    second = wait_spare(daemon, "user", other_than=first["pid"])
    crash_at_step(daemon, "user", 5)
    status = daemon.wait("user", timeout=120)
    (handed,) = log_records(daemon, "spare.handed")
    (died,) = log_records(daemon, "spare.died")
    assert died["pid"] == first["pid"]
    assert handed["pid"] == second["pid"] != first["pid"]
    assert (status["state"], status["attempt"]) == ("completed", 2)


def test_a_job_cancelled_while_its_spare_waits_leaves_no_process(
    daemon: Daemon, program: Path
) -> None:
    """wardenctl cancel: the worker and the waiting spare, with its whole tree, are gone."""
    drop_job(daemon, program)
    spare = wait_spare(daemon, "user")
    (folder,) = (daemon.job_folder("user") / "spares").iterdir()
    answer = ctl(daemon, "cancel", "user")
    assert answer.returncode == 0, answer.stderr
    daemon.wait("user", timeout=60)
    wait_until(lambda: gone(spare["pid"]), timeout=10, what="the spare gone")
    assert naming(folder) == []
    assert daemon.state("user")["state"] == "cancelled"


def test_a_hung_spare_is_passed_over_and_the_job_starts_cold(daemon: Daemon, program: Path) -> None:
    """A stopped (SIGSTOP) spare: the handoff times out, it is killed, attempt 2 starts cold."""
    drop_job(daemon, program)
    spare = wait_spare(daemon, "user")
    os.kill(spare["pid"], signal.SIGSTOP)
    crash_at_step(daemon, "user", 5)
    status = daemon.wait("user", timeout=120)
    (refused,) = log_records(daemon, "spare.refused")
    started = [e for e in daemon.events("user", 2) if e["event"] == "started"]
    assert refused["pid"] == spare["pid"]
    assert "TimeoutError" in refused["answer"]["error"]
    assert started[0]["pid"] != spare["pid"]
    assert gone(spare["pid"])
    assert (status["state"], status["attempt"]) == ("completed", 2)


def test_a_spare_over_the_memory_cap_is_killed(
    tmp_path: Path, compile_cache: Path, program: Path
) -> None:
    """--spare-memory-mb 1: the ready spare is killed at once and its job gets no other."""
    with Daemon(tmp_path / "root", compile_cache, "--spare-memory-mb", "1") as capped:
        drop_job(capped, program)
        (over,) = wait_until(
            lambda: log_records(capped, "spare.over_memory"), timeout=90, what="over memory"
        )
        (ready,) = log_records(capped, "spare.ready")
        wait_until(lambda: gone(ready["pid"]), timeout=10, what="the spare gone")
        # status shows the job's last sample, taken each sampling turn: the spare leaves it by
        # the next turn.
        wait_until(
            lambda: capped.state("user").get("spare"),
            lambda spare: spare is None,
            timeout=10,
            what="status showing no spare",
        )
        status = capped.wait("user", timeout=120)
    assert over["rss_mb"] > over["limit_mb"] == 1
    assert len(log_records(capped, "spare.started")) == 1
    assert status["state"] == "completed"


def test_a_daemon_killed_during_a_handoff_leaves_one_writer(
    tmp_path: Path, compile_cache: Path, program: Path
) -> None:
    """kill -9 of wardend as the spare is handed attempt 2: the restarted daemon waits for
    that process before it starts the next attempt, and the job completes."""
    first = Daemon(tmp_path / "root", compile_cache).start()
    try:
        drop_job(first, program)
        spare = wait_spare(first, "user")
        (folder,) = (first.job_folder("user") / "spares").iterdir()
        crash_at_step(first, "user", 5)
        wait_until((folder / "handed").exists, timeout=30, what="the handed file")
    finally:
        first.stop(signal.SIGKILL)
    with Daemon(tmp_path / "root", compile_cache) as second:
        status = second.wait("user", timeout=120)
        waited = [r["pid"] for r in log_records(second, "orphan.waiting")]
        last = status["attempt"]
        started = [e for e in second.events("user", last) if e["event"] == "started"]
    assert (folder / "handed").read_text() == str(second.attempt_folder("user", 2))
    assert gone(spare["pid"])
    assert waited in ([], [spare["pid"]])
    assert (status["state"], status["step"]) == ("completed", 8)
    assert started[0]["pid"] != spare["pid"]


def test_a_two_process_job_is_recovered_on_a_spare_per_member_verified(
    daemon: Daemon, program: Path
) -> None:
    """Member 1 SIGKILLed: the restart-all hands each member to its own spare, verified."""
    text = command_job(
        "pair",
        [sys.executable, str(program)],
        workdir=str(program.parent),
        run={"steps": 8, "processes": 2},
        faults=SLOW_FIRST_ATTEMPT,
        supervision={"stall_timeout_s": 60},
    )
    daemon.drop("pair.toml", text)
    daemon.wait("pair", ANY_STATE, timeout=30)
    spares = wait_spare(daemon, "pair")["members"]
    status = wait_until(
        lambda: daemon.state("pair"), lambda s: (s["step"] or 0) >= 5, timeout=90, what="step 5"
    )
    os.kill(status["members"][1]["pid"], signal.SIGKILL)
    status = daemon.wait("pair", timeout=120)
    handed = log_records(daemon, "spare.handed")
    (incident,) = daemon.incidents("pair")
    folder = daemon.attempt_folder("pair", 2)
    members = [folder / "events.jsonl", folder / "events.1.jsonl"]
    started = [json.loads(path.read_text().splitlines()[0]) for path in members]
    assert sorted(h["pid"] for h in handed) == sorted(s["pid"] for s in spares)
    assert [h["attempt"] for h in handed] == [2, 2]
    assert [e["event"] for e in started] == ["started", "started"]
    assert [e["pid"] for e in started] == [s["pid"] for s in spares]
    assert (status["state"], status["attempt"], status["step"]) == ("completed", 2, 8)
    assert (incident["kind"], incident["status"]) == ("crash", "verified")


HOLDS_A_CHECKPOINT_FILE = """\
    import json as _json, os as _os
    _run = _json.loads(Path(_os.environ["JOBWARDEN_RUN_FILE"]).read_text())
    _held = (Path(_run["checkpoint_dir"]) / "notes.txt").open("a")  # before run.restore
"""
"""Lines that break a spare's contract: a file under the checkpoint directory held open."""


def test_a_spare_holding_a_checkpoint_file_is_refused_by_name(
    daemon: Daemon, program: Path
) -> None:
    """A program that opens a file under its checkpoint directory before run.restore: its spare
    refuses the handoff naming the file, the attempt starts cold, and no other spare starts."""
    marker = "    parser.parse_args()  # the SDK took --checkpoint-dir out of sys.argv\n"
    text = program.read_text()
    program.write_text(text.replace(marker, marker + HOLDS_A_CHECKPOINT_FILE))
    drop_job(daemon, program)
    spare = wait_spare(daemon, "user")
    crash_at_step(daemon, "user", 5)
    status = daemon.wait("user", timeout=120)
    (refused,) = log_records(daemon, "spare.refused")
    started = [e for e in daemon.events("user", 2) if e["event"] == "started"]
    notes = daemon.root / "checkpoints" / "user" / "notes.txt"
    assert refused["pid"] == spare["pid"]
    assert refused["answer"]["problems"] == [f"holds {notes} open before run.restore()"]
    assert refused["answer"]["contract"] is True
    assert len(log_records(daemon, "spare.started")) == 1
    assert started[0]["pid"] != spare["pid"]
    assert (status["state"], status["attempt"]) == ("completed", 2)
