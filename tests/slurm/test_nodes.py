"""Jobs of several members over several nodes of a real Slurm, each node its own network
namespace: the coordinator in the allocation, a member killed, and (below) a node lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.launch.slurm.state import parse_fields
from tests.daemon import ANY_STATE, Daemon, ctl, linreg_job
from tests.helpers import wait_until
from tests.slurm.nodes import Nodes

pytestmark = pytest.mark.slow


@pytest.fixture
def wardend(slurm_nodes: Nodes, tmp_path: Path, compile_cache: Path) -> Any:
    """A wardend on the host (no compute node) whose attempts are jobs of the nodes' cluster."""
    with Daemon(tmp_path / "root", compile_cache, "--launcher", "slurm") as daemon:
        yield daemon


def attempt_folder(daemon: Daemon, job: str, attempt: int) -> Path:
    """The folder of ``attempt`` of ``job``."""
    return daemon.job_folder(job) / "attempts" / str(attempt)


def slurm_fields(cluster: Nodes, daemon: Daemon, job: str, attempt: int) -> dict[str, str]:
    """``scontrol -o show job`` of the Slurm job that ran ``attempt``, as fields."""
    record = json.loads((attempt_folder(daemon, job, attempt) / "slurm.json").read_text())
    return parse_fields(cluster.run("scontrol", "-o", "show", "job", record["slurm_job"]))


def member_nodes(daemon: Daemon, job: str, attempt: int) -> list[str | None]:
    """Each member's node, as ``members.json`` of ``attempt`` records it."""
    view = json.loads((attempt_folder(daemon, job, attempt) / "members.json").read_text())
    return [member["node"] for member in view["members"]]


def test_member_1_killed_on_the_second_node_restarts_both_and_is_verified(
    wardend: Daemon, slurm_nodes: Nodes
) -> None:
    """2 members over [slurm] nodes = 2: one per node, the coordinator on the allocation's
    first node; member 1 killed after update 3, both resubmitted, the replay verified."""
    run = {"steps": 8, "checkpoint_every": 2, "processes": 2}
    faults = {"crash_after": 3, "process": 1}
    wardend.drop("two.toml", linreg_job("two", run=run, faults=faults, slurm={"nodes": 2}))
    status = wardend.wait("two", timeout=180)
    first, second = (slurm_fields(slurm_nodes, wardend, "two", n) for n in (1, 2))
    allocated = slurm_nodes.run("scontrol", "show", "hostnames", second["NodeList"]).split()
    coordinator = (attempt_folder(wardend, "two", 2) / "coordinator").read_text().split(":")[0]
    (incident,) = wardend.incidents("two")
    shown = ctl(wardend, "status", "two", "--json")
    assert (status["state"], status["attempt"]) == ("completed", 2)
    assert (first["NumNodes"], second["NumNodes"], second["NumTasks"]) == ("2", "2", "2")
    assert (incident["kind"], incident["verification"]["verdict"]) == ("crash", "verified")
    assert member_nodes(wardend, "two", 2) == allocated
    assert len(set(member_nodes(wardend, "two", 1))) == 2
    assert coordinator == allocated[0]
    assert [m["node"] for m in json.loads(shown.stdout)["members"]] == allocated


def test_a_lost_node_fails_the_attempt_and_the_next_one_excludes_it(
    wardend: Daemon, slurm_nodes: Nodes
) -> None:
    """Every process of member 1's node SIGKILLed: the attempt fails, the job is resubmitted
    with --exclude of that node onto two others, restores and its replay is verified."""
    run = {"steps": 40, "checkpoint_every": 5, "processes": 2}
    faults = {"step_delay_s": 0.2}
    wardend.drop("lost.toml", linreg_job("lost", run=run, faults=faults, slurm={"nodes": 2}))
    folder = attempt_folder(wardend, "lost", 1)
    wardend.wait("lost", ANY_STATE, timeout=30)
    wait_until(
        lambda: wardend.state("lost"),
        lambda state: (state.get("newest_checkpoint_step") or 0) >= 5,
        timeout=120,
        what="a first checkpoint of job lost",
    )
    lost = (folder / "member.1.node").read_text().strip()
    try:
        killed = slurm_nodes.fail(lost)
        status = wardend.wait("lost", timeout=180)
        record = json.loads((attempt_folder(wardend, "lost", 2) / "slurm.json").read_text())
        second = slurm_fields(slurm_nodes, wardend, "lost", 2)
        allocated = slurm_nodes.run("scontrol", "show", "hostnames", second["NodeList"]).split()
        (incident,) = wardend.incidents("lost")
    finally:
        slurm_nodes.restart(lost)
    assert (len(killed) > 0, status["state"], status["attempt"]) == (True, "completed", 2)
    assert (record["exclude"], f"--exclude={lost}" in record["sbatch"]) == ([lost], True)
    assert (len(allocated), lost in allocated) == (2, False)
    assert member_nodes(wardend, "lost", 2) == allocated
    assert incident["verification"]["verdict"] == "verified"
    # The machine is blamed, not member 0, whose collective only lost its peer.
    assert (
        f"Member 1 (no pid known on {lost}) failed first: it was lost with its node ({lost}, "
        in (incident["symptom"])
    )
    members = json.loads((folder / "members.json").read_text())
    assert (members["failed_member"], members["members"][1]["node_lost"].split(",")[0]) == (1, lost)
    assert any(f"Member 1's node was lost ({lost}, " in line for line in incident["prevention"])
