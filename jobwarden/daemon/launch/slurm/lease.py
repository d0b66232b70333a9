"""Whether a checkpoint directory's writer lease is stale, judged from Slurm's job state.

A lease names the Slurm job of its writer.  It is stale once that job is over
(ended, requeued, or forgotten by Slurm), and live while the job is queued or
runs, however long ago the writer last renewed it: a clock alone never judges
(a writer in a long collective or a slow commit renews late, and a paused
node's clock says nothing of the job).  A lease with no Slurm job (a writer off
Slurm) cannot be judged here.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.checkpoint import lease
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.launch.slurm.ctl import query
from jobwarden.daemon.launch.slurm.state import Phase, SlurmJob


class LeaseState(enum.StrEnum):
    """What the daemon makes of a lease."""

    NONE = "none"
    LIVE = "live"
    STALE = "stale"
    UNKNOWN = "unknown"
    """no Slurm job named, or slurmctld did not answer"""


@dataclass(frozen=True)
class LeaseJudgement:
    """A lease, what it is judged to be, and why; for slurm.json and incidents."""

    state: LeaseState
    why: str
    held: lease.Lease | None = None
    renewed: float | None = None

    def as_record(self) -> dict[str, Any]:
        """JSON-ready."""
        held = self.held
        return {
            "state": self.state.value,
            "why": self.why,
            "generation": held.generation if held else None,
            "slurm_job": held.slurm_job if held else None,
            "renewed": self.renewed,
        }


def judge(held: lease.Lease | None, job: SlurmJob | None, known: bool = True) -> LeaseJudgement:
    """Pure: the lease ``held`` whose Slurm job is ``job`` (None: Slurm does not know it;
    ``known`` False: slurmctld could not be asked)."""
    if held is None:
        return LeaseJudgement(LeaseState.NONE, "no lease")
    if held.slurm_job is None:
        return LeaseJudgement(LeaseState.UNKNOWN, "the writer ran off Slurm", held)
    if not known:
        return LeaseJudgement(LeaseState.UNKNOWN, "slurmctld did not answer", held)
    if job is None:
        return LeaseJudgement(LeaseState.STALE, f"Slurm job {held.slurm_job} is gone", held)
    if job.phase in (Phase.ENDED, Phase.REQUEUED):
        why = f"Slurm job {held.slurm_job} is {job.state}"
        return LeaseJudgement(LeaseState.STALE, why, held)
    return LeaseJudgement(LeaseState.LIVE, f"Slurm job {held.slurm_job} is {job.state}", held)


async def judge_directory(directory: Path) -> LeaseJudgement:
    """The lease of ``directory``, judged from its Slurm job's state as slurmctld tells it."""
    held = lease.read(directory)
    job, known = None, True
    if held is not None and held.slurm_job is not None:
        try:
            job = await query(held.slurm_job)
        except LauncherError:
            known = False
    judged = judge(held, job, known)
    if held is None:
        return judged
    renewed = lease.renewed(directory, held.generation)
    return LeaseJudgement(judged.state, judged.why, held, renewed)


def checkpoint_of(attempt_folder: Path) -> Path | None:
    """The checkpoint directory of the attempt in ``ROOT/jobs/<id>/attempts/<n>``, from the
    ``checkpoint`` its ``job.json`` names."""
    try:
        name = json.loads((attempt_folder / "job.json").read_text())["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return attempt_folder.parents[3] / "checkpoints" / str(name)
