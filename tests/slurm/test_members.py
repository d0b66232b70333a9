"""A 2-process job on a real single-node Slurm: one Slurm job with --ntasks=2, restart-all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.launch.slurm.state import parse_fields
from tests.daemon import Daemon, linreg_job
from tests.slurm.cluster import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def wardend(slurm: Cluster, tmp_path: Path, compile_cache: Path) -> Any:
    """A wardend whose attempts are Slurm jobs of the session's cluster."""
    with Daemon(tmp_path / "root", compile_cache, "--launcher", "slurm") as daemon:
        yield daemon


def shown(cluster: Cluster, daemon: Daemon, job: str, attempt: int) -> dict[str, str]:
    """``scontrol -o show job`` of the Slurm job that ran ``attempt``, as fields."""
    folder = daemon.job_folder(job) / "attempts" / str(attempt)
    slurm_job = json.loads((folder / "slurm.json").read_text())["slurm_job"]
    return parse_fields(cluster.run("scontrol", "-o", "show", "job", slurm_job))


def test_a_crash_of_member_1_restarts_both_and_is_verified(wardend: Daemon, slurm: Cluster) -> None:
    """Member 1 killed after update 3: the one Slurm job of 2 tasks fails, both members
    restart in a new one, each member's replay matches its own log, verified."""
    run = {"steps": 8, "checkpoint_every": 2, "processes": 2}
    faults = {"crash_after": 3, "process": 1}
    wardend.drop("mp.toml", linreg_job("mp", run=run, faults=faults))
    status = wardend.wait("mp", timeout=150)
    first, second = (shown(slurm, wardend, "mp", n) for n in (1, 2))
    folder = wardend.job_folder("mp") / "attempts"
    members = [json.loads((folder / str(n) / "members.json").read_text()) for n in (1, 2)]
    (incident,) = wardend.incidents("mp")
    finals = [
        [json.loads(x) for x in (folder / "2" / name).read_text().splitlines()][-1]
        for name in ("events.jsonl", "events.1.jsonl")
    ]
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert (first["NumTasks"], second["NumTasks"], second["JobState"]) == ("2", "2", "COMPLETED")
    assert first["JobId"] != second["JobId"]
    assert (members[0]["failed_member"], members[0]["members"][1]["exit_status"]) == (1, -9)
    assert (incident["kind"], incident["verification"]["verdict"]) == ("crash", "verified")
    assert (
        members[1]["members"][1]["replay_checks"] > 0,
        members[1]["members"][1]["replay_ok"],
    ) == (
        True,
        True,
    )
    assert [f["event"] for f in finals] == ["completed", "completed"]
    assert finals[0]["state_hash"] == finals[1]["state_hash"]
