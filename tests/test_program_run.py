"""Status, runbooks, tail and maintail describe the job that runs: an SDK program's own
``steps`` and ``checkpoint_every``, a plain program's none, and the members of a
multi-process job by name."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.daemon import Daemon, ctl, linreg_job
from tests.test_command_jobs import PLAIN, command_job
from tests.test_multiprocess import members_record, settle, submit

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def table_line(daemon: Daemon, job: str) -> list[str]:
    """The job's line of the ``wardenctl status`` table, split in cells."""
    shown = ctl(daemon, "status").stdout.splitlines()
    return next(line.split() for line in shown if line.split()[:1] == [job])


def transitions_to_completed(daemon: Daemon, job: str) -> list[str]:
    """The ``maintail`` lines of the job's move to completed."""
    shown = ctl(daemon, "maintail", "-n", "2000").stdout.splitlines()
    return [line for line in shown if f"job={job} " in line and "to=completed" in line]


def test_an_sdk_program_s_own_steps_and_checkpoint_every_are_shown_and_kept(
    tmp_path: Path, compile_cache: Path
) -> None:
    """A command job whose [run] is empty: status, the table, the runbook and maintail use the
    program's steps = 12 and checkpoint_every = 4, also after the daemon restarts."""
    program = tmp_path / "work" / "train.py"
    program.parent.mkdir()
    shutil.copy(HERE / "sdk_program.py", program)
    text = command_job(
        "own",
        [sys.executable, str(program)],
        workdir=str(program.parent),
        faults={"fail_after": 6},
        supervision={"stall_timeout_s": 60},
    )
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("own.toml", text)
        status = daemon.wait("own", timeout=180)
        assert (status["state"], status["step"], status["steps"]) == ("completed", 12, 12)
        assert status["checkpoint_every"] == 4
        assert table_line(daemon, "own")[:4] == ["own", "completed", "2", "12/12"]
        (incident,) = daemon.incidents("own")
        runbook = ctl(daemon, "runbook", incident["id"]).stdout
        assert "checkpoint_every = 4 bounds that loss" in runbook
        [completed] = transitions_to_completed(daemon, "own")
        assert "step=12" in completed.split()
    with Daemon(tmp_path / "root", compile_cache) as again:
        kept = again.state("own")
        assert (kept["step"], kept["steps"], kept["checkpoint_every"]) == (12, 12, 4)
        assert table_line(again, "own")[3] == "12/12"


def test_a_plain_program_shows_no_steps(tmp_path: Path, compile_cache: Path) -> None:
    """sdk = false: status reports no step nor steps, the table shows '-', and the move to
    completed carries no step."""
    plain = tmp_path / "plain.py"
    plain.write_text(PLAIN)
    text = command_job("bare", [sys.executable, str(plain), "3", "0.05", "0", "-"], sdk=False)
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("bare.toml", text)
        status = daemon.wait("bare", timeout=60)
        assert (status["state"], status["step"], status["steps"]) == ("completed", None, None)
        assert status["checkpoint_every"] is None
        assert table_line(daemon, "bare")[:4] == ["bare", "completed", "1", "-"]
        [completed] = transitions_to_completed(daemon, "bare")
        assert "step=" not in completed


def test_a_killed_member_is_named_in_the_symptom_runbook_tail_and_status(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Member 1 of 2 killed after update 3: the incident names it (index, pid, node) and what
    became of member 0, the runbook points at its stderr, tail's attempt.started shows both
    pids, and status JOB lists each member of the newest attempt with its node and exit."""
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        submit(daemon, "mp-kill", faults={"crash_after": 3, "process": 1})
        status = settle(daemon, "mp-kill")
        assert (status["state"], status["attempt"]) == ("completed", 2)
        first = members_record(daemon, "mp-kill", 1)
        killed = first["members"][1]
        [incident] = daemon.incidents("mp-kill")
        told = (
            f"Member 1 (pid {killed['pid']} on {killed['node']}) failed first: it was killed "
            "by SIGKILL after update 3; member 0 "
        )
        assert told in incident["symptom"]
        stderr = daemon.attempt_folder("mp-kill", 1) / "stderr.1.log"
        runbook = ctl(daemon, "runbook", incident["id"]).stdout
        assert f"Member 1 failed first: read its stderr ({stderr})" in runbook
        tail = ctl(daemon, "tail", "mp-kill", "-n", "5000").stdout.splitlines()
        started = [line for line in tail if "attempt.started" in line and line.startswith("#1 ")]
        pids = [{"process": m["process"], "pid": m["pid"]} for m in first["members"]]
        assert len(started) == 1
        assert f"members={json.dumps(pids)}" in started[0]
        members = status["members"]
        assert [(m["process"], m["exit_status"]) for m in members] == [(0, 0), (1, 0)]
        assert all(m["node"] for m in members)
        shown = ctl(daemon, "status", "mp-kill").stdout.split("members:\n", 1)[1].splitlines()
        assert shown[0].split() == [
            "MEMBER", "PID", "NODE", "RSS", "STEP", "LAST", "READY", "EXIT",
        ]  # fmt: skip


def test_a_run_resumed_at_its_end_completes_at_its_step(
    tmp_path: Path, compile_cache: Path
) -> None:
    """A second job on a finished checkpoint has no update left: its status and its move to
    completed in maintail say step 8, not 0."""
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("done.toml", linreg_job("done", "shared"))
        assert daemon.wait("done", timeout=120)["state"] == "completed"
        daemon.drop("again.toml", linreg_job("again", "shared"))
        status = daemon.wait("again", timeout=120)
        assert (status["state"], status["step"], status["steps"]) == ("completed", 8, 8)
        [completed] = transitions_to_completed(daemon, "again")
        assert "step=8" in completed.split()
