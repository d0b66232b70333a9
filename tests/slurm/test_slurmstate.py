"""The pure mapping from Slurm's job states to attempt phases and exits (no cluster needed)."""

from __future__ import annotations

import pytest

from jobwarden.daemon.launch.slurm.state import Phase, SlurmExit, SlurmJob, exit_of, from_shell

SHOWN = (
    "JobId=7 JobName=jw-ok-1 UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 RunTime=00:00:01 NodeList=vm BatchHost=vm "
    "Command=/root/jobs/ok/attempts/1/slurm.sh"
)


def job(state: str, exit_code: str = "0:0", restarts: int = 0, reason: str = "None") -> SlurmJob:
    """A shown job with these fields changed."""
    line = SHOWN.replace("JobState=RUNNING", f"JobState={state}")
    line = line.replace("ExitCode=0:0", f"ExitCode={exit_code}")
    line = line.replace("Restarts=0", f"Restarts={restarts}")
    return SlurmJob.from_show(line.replace("Reason=None", f"Reason={reason}"))


class TestFromShow:
    def test_the_fields_jobwarden_reads_are_parsed(self) -> None:
        """Job id, state, reason, exit code and signal, restarts, node."""
        assert SlurmJob("7", "RUNNING", "None", 0, 0, 0, "vm") == SlurmJob.from_show(SHOWN)

    def test_an_answer_without_a_job_id_is_refused(self) -> None:
        """Something other than scontrol's line is an error, not a job."""
        with pytest.raises(ValueError, match="no JobId"):
            SlurmJob.from_show("slurm_load_jobs error: Unable to contact slurm controller")

    def test_a_pending_job_shows_squeues_code_and_its_reason(self) -> None:
        """PD (Resources), as squeue writes it."""
        assert job("PENDING", reason="Resources").describe() == "PD (Resources)"


class TestPhase:
    @pytest.mark.parametrize(
        ("state", "restarts", "expected"),
        [
            ("PENDING", 0, Phase.QUEUED),
            ("CONFIGURING", 0, Phase.QUEUED),
            ("RUNNING", 0, Phase.RUNNING),
            ("COMPLETING", 0, Phase.RUNNING),
            ("COMPLETED", 0, Phase.ENDED),
            ("FAILED", 0, Phase.ENDED),
            ("CANCELLED", 0, Phase.ENDED),
            ("TIMEOUT", 0, Phase.ENDED),
            ("PREEMPTED", 0, Phase.ENDED),
            ("NODE_FAIL", 0, Phase.ENDED),
            ("OUT_OF_MEMORY", 0, Phase.ENDED),
            ("REQUEUED", 0, Phase.REQUEUED),
            ("PENDING", 1, Phase.REQUEUED),
        ],
    )
    def test_each_state_has_its_phase(self, state: str, restarts: int, expected: Phase) -> None:
        """Pending (also after a requeue: then the attempt is over), running, ended."""
        assert expected == job(state, restarts=restarts).phase


class TestExit:
    @pytest.mark.parametrize(
        ("state", "exit_code", "script", "expected"),
        [
            ("COMPLETED", "0:0", 0, (0, None)),
            ("FAILED", "10:0", 10, (10, None)),
            ("FAILED", "75:0", 75, (75, None)),
            ("FAILED", "137:0", 137, (-9, "SIGKILL")),
            ("CANCELLED", "0:9", None, (-9, "SIGKILL")),
            ("CANCELLED", "75:0", 75, (75, None)),
            ("TIMEOUT", "75:0", 75, (75, None)),
            ("TIMEOUT", "0:9", None, (-9, "SIGKILL")),
            ("PREEMPTED", "0:15", None, (75, None)),
            ("NODE_FAIL", "0:0", None, (75, None)),
            ("REQUEUED", "0:0", None, (75, None)),
        ],
    )
    def test_the_worker_exit_or_what_slurm_did(
        self, state: str, exit_code: str, script: int | None, expected: tuple[int, str | None]
    ) -> None:
        """The worker's status where it left one; preemptions and requeues are 75 (resume)."""
        found = exit_of(job(state, exit_code), script)
        assert expected == (found.status, found.signal)

    @pytest.mark.parametrize(
        ("state", "preempted"),
        [("PREEMPTED", True), ("NODE_FAIL", True), ("REQUEUED", True), ("TIMEOUT", False)],
    )
    def test_a_preemption_says_so_whatever_the_program(self, state: str, preempted: bool) -> None:
        """Preempted, failed node, requeued: marked preempted, so a plain program's restart
        is not counted against its budget either; a time limit is the program's own exit."""
        assert exit_of(job(state, "0:0"), None).preempted is preempted

    def test_out_of_memory_is_a_failure_that_names_itself(self) -> None:
        """OUT_OF_MEMORY: killed, and the signal field says by Slurm's memory limit."""
        found = exit_of(job("OUT_OF_MEMORY", "0:9"), None)
        assert (found.status, "OUT_OF_MEMORY" in (found.signal or "")) == (-9, True)

    def test_a_job_slurm_forgot_falls_back_to_the_scripts_record(self) -> None:
        """Aged out of slurmctld: the script's exit record, or a loss if there is none."""
        assert (
            SlurmExit(75, None, "the Slurm job is gone; its script's record"),
            -9,
        ) == (exit_of(None, 75), exit_of(None, None).status)

    def test_a_shells_signal_status_is_a_negative_returncode(self) -> None:
        """128 + 15 is SIGTERM; a plain 3 stays 3."""
        assert (from_shell(143), from_shell(3)) == (-15, 3)
