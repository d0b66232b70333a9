"""A plain program submitted without ``sdk = false`` is told so at once, not restarted."""

from __future__ import annotations

import sys
from pathlib import Path

from jobwarden.daemon.launch.base import ExitInfo
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.supervise import policy
from jobwarden.daemon.supervise.policy import AttemptReport, Escalate, IncidentKind, Restart
from jobwarden.jobfile import job_from_mapping
from tests.daemon import Daemon
from tests.test_command_jobs import command_job

PRINTER = "for n in range(5):\n    print(f'epoch {n} done')\n"


def test_exit_0_with_no_event_escalates_and_a_crash_does_not() -> None:
    """Exit 0 with no event on stdout: escalated, naming sdk = false; exit 1 with none (an
    import error before the SDK started, say) is still a crash, restarted."""
    job = job_from_mapping({"id": "j", "command": ["python", "x.py"]})
    record = JobRecord(id="j", job=job)
    silent = AttemptReport(1, events_seen=False, stray_lines=5)
    outcome = policy.decide(record, silent, ExitInfo.from_status(0, 1.0))
    assert isinstance(outcome, Escalate)
    assert outcome.kind is IncidentKind.INVALID_REQUEST
    assert "(5 lines that are no events)" in outcome.reason
    assert outcome.reason.endswith("set sdk = false")
    crashed = policy.decide(record, silent, ExitInfo.from_status(1, 1.0))
    assert isinstance(crashed, Restart)


def test_a_plain_program_left_at_sdk_true_is_escalated_on_its_first_attempt(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Through a real daemon: a script printing 5 lines and exiting 0 is escalated after
    attempt 1 (it used to be called a crash, restarted 3 times and failed), and its
    incident says to set sdk = false."""
    program = tmp_path / "printer.py"
    program.write_text(PRINTER)
    with Daemon(tmp_path / "root", compile_cache) as daemon:
        daemon.drop("printer.toml", command_job("printer", [sys.executable, str(program)]))
        status = daemon.wait("printer", timeout=60)
        [incident] = daemon.incidents("printer")
    assert (status["state"], status["attempt"]) == ("escalated", 1)
    assert "does not use jobwarden.sdk; set sdk = false" in status["reason"]
    assert incident["kind"] == "invalid_request"
    assert "Set `sdk = false`" in incident["outcome"]
    assert "(5 lines that are no events)" in incident["outcome"]
