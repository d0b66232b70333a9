"""The harness itself: the cluster runs a batch job and reports its state without slurmdbd."""

from __future__ import annotations

import time

import pytest

from tests.helpers import wait_until
from tests.slurm.cluster import Cluster


@pytest.mark.slow
def test_a_batch_job_runs_and_completes(slurm: Cluster) -> None:
    """sbatch --parsable gives a job id; scontrol shows it COMPLETED with its output kept."""
    out = slurm.base / "hello.out"
    job = slurm.run("sbatch", "--parsable", "-o", str(out), "--wrap", "echo hello").strip()
    began = time.monotonic()
    wait_until(
        lambda: slurm.run("scontrol", "-o", "show", "job", job),
        lambda text: "JobState=COMPLETED" in text,
        timeout=30,
        what=f"Slurm job {job} completed",
    )
    assert (out.read_text(), time.monotonic() - began < 30) == ("hello\n", True)
