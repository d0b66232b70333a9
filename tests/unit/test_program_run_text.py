"""The pure parts of what status and runbooks say of the run: the program's own settings,
the step cell, and how the members of a multi-process attempt ended."""

from __future__ import annotations

import sys
from typing import Any

from jobwarden.control.tables import member_exit, progress
from jobwarden.daemon.incidents.members import consequence, first_failure, how_ended
from jobwarden.daemon.store.programrun import run_value
from jobwarden.jobfile import Job, job_from_mapping

PYTHON = [sys.executable, "train.py"]


def job(**fields: Any) -> Job:
    """A job document's `Job`."""
    return job_from_mapping({"id": "j", **fields})


class TestRunValue:
    def test_the_program_s_report_wins(self) -> None:
        """What the started event reported is used over the job file's [run]."""
        reported = {"steps": 490, "checkpoint_every": 11}
        assert run_value(job(command=PYTHON), reported, "steps") == 490
        assert run_value(job(command=PYTHON), reported, "checkpoint_every") == 11

    def test_a_task_uses_its_run_section(self) -> None:
        """A task's steps are its [run]'s, defaults included."""
        assert run_value(job(task="linreg"), None, "steps") == 8

    def test_an_sdk_program_before_started_knows_only_the_fields_its_file_sets(self) -> None:
        """An SDK program's [run] field given by the file is known, one left out is not."""
        given = job(command=PYTHON, run={"steps": 30})
        assert (
            run_value(given, None, "steps"),
            run_value(given, None, "checkpoint_every"),
        ) == (30, None)

    def test_a_plain_program_has_none(self) -> None:
        """sdk = false: no steps, whatever the [run] defaults."""
        assert None is run_value(job(command=PYTHON, sdk=False), None, "steps")


class TestProgressCell:
    def test_step_of_steps(self) -> None:
        """Both known: step/steps."""
        assert progress(490, 4400) == "490/4400"

    def test_unknown_total(self) -> None:
        """An SDK program before its started event: step/-."""
        assert progress(0, None) == "0/-"

    def test_neither(self) -> None:
        """A plain program: a single '-'."""
        assert progress(None, None) == "-"


KILLED = {"process": 1, "pid": 41, "node": "node-a", "step": 9, "exit_status": -9}
KILLED["exit_signal"] = "SIGKILL"
LOST = {"process": 0, "pid": 40, "node": "node-a", "step": 9, "exit_status": 1}
LOST.update(failure="worker.crash", peer_lost=True, stopped=False)
STOPPED = {"process": 2, "pid": 42, "exit_status": -15, "exit_signal": "SIGTERM", "stopped": True}


class TestMembersText:
    def test_the_first_failure_and_its_consequences(self) -> None:
        """The member that failed first by index, pid and node; then each other member."""
        view = {"failed_member": 1, "members": [LOST, KILLED, STOPPED]}
        expected = (
            "Member 1 (pid 41 on node-a) failed first: it was killed by SIGKILL after update "
            "9; member 0 then exited 1 (worker.crash): the collective lost its peer; member 2 "
            "was then stopped by the daemon (SIGTERM)."
        )
        assert expected == first_failure(view)

    def test_no_failed_member_says_nothing(self) -> None:
        """A group that completed, or a single process, has no such sentence."""
        assert None is first_failure({"failed_member": None, "members": [LOST]})
        assert None is first_failure({})

    def test_an_early_exit_and_a_failure_before_any_update(self) -> None:
        """Exit 0 before completing is named so; a member with no update says so."""
        early = {"process": 1, "pid": 41, "step": 0, "exit_status": 0}
        text = first_failure({"failed_member": 1, "members": [early]})
        assert "Member 1 (pid 41) failed first: it exited 0 before it completed before its " in (
            text or ""
        )
        assert how_ended(early) == "exited 0 before it completed"

    def test_a_survivor_that_was_not_stopped_and_did_not_lose_a_peer(self) -> None:
        """A member that ended on its own for a reason of its own is told plainly."""
        assert consequence({"process": 3, "exit_status": 2}) == "member 3 then exited 2"

    def test_the_exit_cell(self) -> None:
        """Status JOB's EXIT column: the signal, the status, (stopped), or '-' while alive."""
        assert [member_exit(m) for m in (KILLED, LOST, STOPPED, {"exit_status": None})] == [
            "SIGKILL",
            "1",
            "SIGTERM (stopped)",
            "-",
        ]
