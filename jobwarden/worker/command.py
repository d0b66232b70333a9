"""The worker's command line: the one way anything (daemon, drills, tests) starts a worker."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

MODULE = "jobwarden.worker"
SPARE_MODULE = "jobwarden.worker.spare"


@dataclass(frozen=True)
class WorkerCall:
    """One attempt of the built-in worker, as data: built once (by the daemon, from the job it
    holds) and turned into an argv, or into the handoff a warm spare takes instead."""

    job_file: Path
    checkpoint_dir: Path
    cache: Path | None = None
    signing_key: Path | None = None
    """The key file's path (the key itself never goes on a command line)."""
    python: str = sys.executable

    def argv(self) -> list[str]:
        """``python -m jobwarden.worker`` for this attempt, exactly as an operator would type it.

        ``-P`` keeps the current directory off ``sys.path``, so a ``jobwarden/`` folder
        wherever the worker happens to start cannot shadow the installed package.
        """
        argv = [
            self.python,
            "-P",
            "-m",
            MODULE,
            "--job",
            str(self.job_file),
            "--checkpoint-dir",
            str(self.checkpoint_dir),
        ]
        if self.cache is not None:
            argv += ["--compile-cache", str(self.cache)]
        if self.signing_key is not None:
            argv += ["--signing-key", str(self.signing_key)]
        return argv

    def spare_argv(self) -> list[str]:
        """A warm spare prepared for this attempt's task (`jobwarden.worker.spare`)."""
        argv = [self.python, "-P", "-m", SPARE_MODULE, "--job", str(self.job_file)]
        if self.cache is not None:
            argv += ["--compile-cache", str(self.cache)]
        return argv

    def handoff(self, stderr: Path) -> dict[str, str | None]:
        """What a spare is told when it is handed this attempt (one JSON line on its stdin)."""
        return {
            "job": str(self.job_file),
            "checkpoint_dir": str(self.checkpoint_dir),
            "compile_cache": str(self.cache) if self.cache is not None else None,
            "signing_key": str(self.signing_key) if self.signing_key is not None else None,
            "stderr": str(stderr),
        }


def worker_argv(
    job_file: Path,
    checkpoint_dir: Path,
    cache: Path | None = None,
    signing_key: Path | None = None,
) -> list[str]:
    """``python -m jobwarden.worker`` for one attempt (`WorkerCall.argv`)."""
    return WorkerCall(job_file, checkpoint_dir, cache, signing_key).argv()
