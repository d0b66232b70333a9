"""The worker's command line: the one way anything (daemon, drills, tests) starts a worker."""

from __future__ import annotations

import sys
from pathlib import Path


def worker_argv(
    job_file: Path,
    checkpoint_dir: Path,
    cache: Path | None = None,
    signing_key: Path | None = None,
) -> list[str]:
    """``python -m jobwarden.worker`` for one attempt, exactly as an operator would type it.

    ``signing_key`` is the key file's path (the key itself never goes on a command line).

    ``-P`` keeps the current directory off ``sys.path``, so a ``jobwarden/`` folder
    wherever the worker happens to start cannot shadow the installed package.
    """
    argv = [
        sys.executable,
        "-P",
        "-m",
        "jobwarden.worker",
        "--job",
        str(job_file),
        "--checkpoint-dir",
        str(checkpoint_dir),
    ]
    if cache is not None:
        argv += ["--compile-cache", str(cache)]
    if signing_key is not None:
        argv += ["--signing-key", str(signing_key)]
    return argv
