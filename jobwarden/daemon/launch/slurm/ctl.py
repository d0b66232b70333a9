"""The Slurm client commands the launcher runs: sbatch, scontrol, scancel; none raises for them.

Each runs as a child of the daemon with `COMMAND_TIMEOUT_S`; slurmctld that
does not answer is a `LauncherError` for the caller to log and poll again.
"""

from __future__ import annotations

import asyncio
import os

from jobwarden.daemon.children import CHILDREN
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.launch.slurm.state import SlurmJob

COMMAND_TIMEOUT_S = 30.0
CLIENT_ENV = ("PATH", "SLURM_CONF")
"""Of the daemon's own environment, what sbatch needs on top of the worker's."""


async def slurm_command(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run one Slurm client command; its status, stdout and stderr (never raises for it)."""
    try:
        with CHILDREN.starting():
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            CHILDREN.follow(proc)
        out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
    except (OSError, TimeoutError) as error:
        return 127, "", f"{argv[0]}: {error}"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def query(job_id: str) -> SlurmJob | None:
    """The job's state from ``scontrol -o show job``; None once Slurm no longer knows it.

    Raises `LauncherError` when slurmctld does not answer (the caller keeps polling)."""
    status, out, err = await slurm_command("scontrol", "-o", "show", "job", job_id)
    if status != 0:
        if "Invalid job id" in err:
            return None
        raise LauncherError(f"scontrol show job {job_id}: {err.strip()}", slurm_job=job_id)
    try:
        return SlurmJob.from_show(out.strip().splitlines()[0])
    except (ValueError, IndexError) as error:
        raise LauncherError(str(error), slurm_job=job_id) from error


async def sbatch(argv: list[str], worker_env: dict[str, str]) -> str:
    """Submit with ``argv`` (``sbatch --parsable ...``) in the worker's environment plus what
    the client needs; the Slurm job id.  Raises `LauncherError` when sbatch refuses."""
    env = {**worker_env, **{k: os.environ[k] for k in CLIENT_ENV if k in os.environ}}
    status, out, err = await slurm_command(*argv, env=env)
    job_id = out.strip().split(";")[0]
    if status != 0 or not job_id.isdigit():
        raise LauncherError(f"sbatch exited {status}: {err.strip()}", argv=argv)
    return job_id
