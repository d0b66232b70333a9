"""The writer lease across two hosts: writers in real Slurm jobs on nodes n1 and n2.

Each writer is a small Python program run by ``sbatch -w <node>``, so it runs in
that node's namespaces (its own hostname and network) under its own Slurm job id,
on the checkpoint directory both nodes share.  It claims the lease for a
generation with `jobwarden.checkpoint.lease.take` (as its WriterLock does under
Slurm), prints what came of it, and either holds on or checks its lease as a
commit would.  The daemon's judgement of the lease is `judge_directory`, from the
state of the Slurm job the lease names.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from jobwarden.checkpoint import lease
from jobwarden.daemon.launch.slurm.lease import LeaseState, judge_directory
from tests.helpers import wait_until
from tests.slurm.nodes import Nodes

pytestmark = pytest.mark.slow

WRITER = """
import json, sys, time
from pathlib import Path
from jobwarden.checkpoint import lease
directory, generation, action = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
job = __import__("os").environ["SLURM_JOB_ID"]
try:
    if action == "check":
        lease.check(directory, generation)
    else:
        lease.take(directory, generation, job)
    outcome = {"ok": True}
except lease.LeaseLost as error:
    outcome = {"ok": False, "code": error.code, "message": str(error)}
outcome.update(host=__import__("socket").gethostname(), job=job)
print(json.dumps(outcome), flush=True)
if action == "hold" and outcome["ok"]:
    time.sleep(600)
"""


def writer(nodes: Nodes, node: str, folder: Path, generation: int, action: str) -> str:
    """Submit a writer of ``generation`` on ``node``; its Slurm job id."""
    script = folder / "writer.py"
    script.write_text(WRITER)
    out = folder / f"{node}-{generation}-{action}.out"
    command = f"{sys.executable} {script} {folder / 'ck'} {generation} {action}"
    return nodes.run(
        "sbatch",
        "--parsable",
        f"--nodelist={node}",
        f"--output={out}",
        f"--export=ALL,PYTHONPATH={os.pathsep.join(sys.path)}",
        f"--wrap={command}",
    ).strip()


def outcome(folder: Path, node: str, generation: int, action: str) -> dict[str, object]:
    """What the writer printed, once it has."""
    out = folder / f"{node}-{generation}-{action}.out"

    def read() -> dict[str, object] | None:
        try:
            first = out.read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        return dict(json.loads(first))

    found = wait_until(read, lambda got: got is not None, timeout=60, what=f"{out.name}")
    assert found is not None
    return found


def judged(folder: Path, state: LeaseState) -> object:
    """The daemon's judgement of the lease, once it is ``state``."""
    return wait_until(
        lambda: asyncio.run(judge_directory(folder / "ck")),
        lambda judgement: judgement.state is state,
        timeout=40,
        what=f"a {state.value} lease",
    )


def test_a_second_writer_on_another_node_is_refused_and_takes_over_once_the_first_is_gone(
    slurm_nodes: Nodes, tmp_path: Path
) -> None:
    """n1 holds generation 1; a writer of the same generation on n2 is refused, naming n1's
    Slurm job and host; the lease is live while n1's job runs.  Once that job is
    cancelled the lease is stale, generation 2 on n2 takes it, and a commit check of
    generation 1 (n1's writer, had it lived) is fenced."""
    folder = tmp_path
    folder.chmod(0o755)
    (folder / "ck").mkdir()
    first = writer(slurm_nodes, "n1", folder, 1, "hold")
    held = outcome(folder, "n1", 1, "hold")
    assert (held["ok"], held["host"], held["job"]) == (True, "n1", first)
    assert judged(folder, LeaseState.LIVE)

    writer(slurm_nodes, "n2", folder, 1, "take")
    refused = outcome(folder, "n2", 1, "take")
    assert (refused["ok"], refused["code"], refused["host"]) == (False, "writer.lease_lost", "n2")
    assert f"Slurm job {first}, n1" in str(refused["message"])
    assert "already claimed" in str(refused["message"])

    slurm_nodes.run("scancel", first)
    stale = judged(folder, LeaseState.STALE)
    assert f"Slurm job {first} is" in getattr(stale, "why", "")

    second = writer(slurm_nodes, "n2", folder, 2, "take")
    taken = outcome(folder, "n2", 2, "take")
    assert (taken["ok"], taken["host"]) == (True, "n2")
    now = lease.read(folder / "ck")
    assert now is not None
    assert (now.generation, now.slurm_job, now.host) == (2, second, "n2")

    writer(slurm_nodes, "n1", folder, 1, "check")
    fenced = outcome(folder, "n1", 1, "check")
    assert (fenced["ok"], fenced["code"], fenced["host"]) == (False, "writer.lease_lost", "n1")
    assert "fenced before the commit" in str(fenced["message"])
