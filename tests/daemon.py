"""A real wardend on a temporary root, driven the way users drive it: by dropping files.

The daemon is the package's harness (`jobwarden.control.harness.Wardend`); a test adds
`state` and `incidents`, which raise for a job the daemon does not know, and reads an
attempt's events strictly: every line a worker wrote must be JSON.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

from jobwarden.control.harness import SETTLED_STATES, Wardend, job_text
from jobwarden.states import JobState
from tests import schemas

__all__ = ["ANY_STATE", "SETTLED_STATES", "WARDENCTL", "Daemon", "ctl", "linreg_job"]

ANY_STATE = tuple(state.value for state in JobState)
"""Every state: waiting for one of them waits until the daemon has accepted the job."""

WARDENCTL = [sys.executable, "-m", "jobwarden.control.cli"]
"""The command line of wardenctl, run by this interpreter."""


def ctl(daemon: Daemon, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """wardenctl --root ROOT ARGS; a ``--json`` output is checked against its schema."""
    done = subprocess.run(
        [*WARDENCTL, "--root", str(daemon.root), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode in (0, 3):  # 3: status found a job needing attention
        schemas.check_cli(list(args), done.stdout, str(daemon.root))
    return done


class Daemon(Wardend):
    """One wardend process; `drop` submits a job file, `wait` polls its state over the socket."""

    start_timeout_s = 30.0

    def ask(self, cmd: str, timeout: float = 10.0, **args: Any) -> Any:
        """One control request; its answer is checked against the command's schema."""
        answer = super().ask(cmd, timeout, **args)
        schemas.check_answer(cmd, answer, str(self.root))
        return answer

    def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int | None:
        """Stop the daemon as the harness does, then check what it wrote (`schemas`)."""
        status = super().stop(sig, timeout)
        if status is not None:
            schemas.check_root(self.root)
        return status

    def state(self, job: str) -> dict[str, Any]:
        """The job's detail status (ControlError for a job the daemon does not know)."""
        result: dict[str, Any] = self.ask("status", job=job)
        return result

    def incidents(self, job: str) -> list[dict[str, Any]]:
        """The job's incident records."""
        result: list[dict[str, Any]] = self.ask("incidents", job=job)
        return result

    def events(self, job: str, attempt: int) -> list[dict[str, Any]]:
        """Parsed events of one attempt; a line that is not JSON fails the test."""
        path = self.attempt_folder(job, attempt) / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def linreg_job(job_id: str, checkpoint: str | None = None, **sections: dict[str, Any]) -> str:
    """A linreg job file's text with the lesson's training fields."""
    return job_text(job_id, checkpoint, **sections)
