"""wardenctl drill --launcher slurm: the drill's private daemon runs every attempt on Slurm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm.cluster import Cluster

pytestmark = pytest.mark.slow
WARDENCTL = [sys.executable, "-m", "jobwarden.control.cli"]


def test_the_crash_drill_passes_on_slurm(
    slurm: Cluster, tmp_path: Path, compile_cache: Path
) -> None:
    """drill crash --launcher slurm: every check holds, and every attempt was a Slurm job."""
    argv = [*WARDENCTL, "drill", "crash", "--launcher", "slurm", "--out", str(tmp_path), "--json"]
    argv += ["--compile-cache", str(compile_cache)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    report = json.loads(done.stdout)
    assert (done.returncode, report["failed_checks"]) == (0, []), done.stderr[-3000:]
    attempts = sorted((tmp_path / "root" / "jobs").glob("*/attempts/*"))
    on_slurm = [a for a in attempts if (a / "slurm.json").exists()]
    assert (report["drill"], report["restored_step"]) == ("crash", 2)
    assert (len(attempts), on_slurm) == (3, attempts)  # the reference, the crash, its resume
