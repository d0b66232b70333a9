"""Recovery on two nodes of a real Slurm: a member SIGKILLed, and a node lost.

The repo's own ``slurm/cluster.sh`` brings up three nodes, each slurmd in its own
network namespace (tests/slurm/nodes.py, as the tests do).  A real wardend on the
host runs a 2-member linreg job with ``[slurm] nodes = 2`` (one member per node,
the coordinator on the allocation's first node), ``--repeats`` times for each
failure, in the same run:

* ``member``: member 1 SIGKILLs itself after update 3 (``[faults] crash_after``,
  ``process = 1``); from its last event (the kill follows it at once) to the
  first progress of the next attempt.
* ``node``: every process of member 1's node SIGKILLed once a checkpoint is
  committed (the node lost as a machine is: slurmd and the job's steps); from the
  kill to the next attempt's first progress, on two other nodes (the lost one is
  excluded).  Slurm ends a job with a step on a dead node only once it declares the
  node down (``SlurmdTimeout``, 10 s in the test cluster's slurm.conf), which
  dominates this figure; the node is started again after each run.

    .venv/bin/python bench/slurm_nodes.py [--repeats 3]

Prints a table (medians) and writes ``bench/results/slurm_nodes.json``.  Runs as
root; installs Slurm's Debian packages when they are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import context, records

from tests.daemon import ANY_STATE, Daemon, linreg_job
from tests.helpers import wait_until
from tests.slurm.cluster import ensure_installed
from tests.slurm.nodes import Nodes

RESULTS = Path(__file__).resolve().parent / "results" / "slurm_nodes.json"
RUN = {"steps": 40, "checkpoint_every": 5, "processes": 2}


def events(path: Path) -> list[dict[str, Any]]:
    """One event file, parsed."""
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def first_progress(attempt: Path) -> float:
    """The time of an attempt's first ``progress`` (member 0's file, which the daemon
    forwards once every member has reported that update)."""
    return float(
        next(e["time"] for e in events(attempt / "events.jsonl") if e["event"] == "progress")
    )


def member_kill(base: Path, cache: Path) -> dict[str, float]:
    """Member 1 killed after update 3; its last event to the next attempt's first progress."""
    faults = {"crash_after": 3, "process": 1}
    with Daemon(base / "root", cache, "--launcher", "slurm") as daemon:
        daemon.drop("m.toml", linreg_job("m", run=RUN, faults=faults, slurm={"nodes": 2}))
        status = daemon.wait("m", timeout=300)
        attempts = daemon.job_folder("m") / "attempts"
    assert (status["state"], status["attempt"]) == ("completed", 2), status
    killed = float(events(attempts / "1" / "events.1.jsonl")[-1]["time"])
    return {"recovery_s": first_progress(attempts / "2") - killed}


def node_loss(base: Path, cache: Path, nodes: Nodes) -> dict[str, float]:
    """Member 1's node lost after the first commit; the kill to the next first progress."""
    faults = {"step_delay_s": 0.2}
    with Daemon(base / "root", cache, "--launcher", "slurm") as daemon:
        daemon.drop("n.toml", linreg_job("n", run=RUN, faults=faults, slurm={"nodes": 2}))
        daemon.wait("n", ANY_STATE, timeout=30)
        attempts = daemon.job_folder("n") / "attempts"
        wait_until(
            lambda: daemon.state("n"),
            lambda state: (state.get("newest_checkpoint_step") or 0) >= 5,
            timeout=180,
            what="a first checkpoint",
        )
        lost = (attempts / "1" / "member.1.node").read_text().strip()
        killed = time.time()
        try:
            nodes.fail(lost)
            status = daemon.wait("n", timeout=300)
        finally:
            nodes.restart(lost)
    assert (status["state"], status["attempt"]) == ("completed", 2), status
    record = json.loads((attempts / "2" / "slurm.json").read_text())
    assert record["exclude"] == [lost], record
    return {"recovery_s": first_progress(attempts / "2") - killed}


def main() -> int:
    """Both failures, ``--repeats`` times each, alternately; medians and the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-nodes-"))
    ensure_installed(work / "install.lock")
    nodes = Nodes().start()
    runs: dict[str, list[dict[str, float]]] = {"member": [], "node": []}
    try:
        os.environ["SLURM_CONF"] = str(nodes.conf)
        cache = work / "cache"
        for n in range(args.repeats):
            runs["member"].append(member_kill(work / f"member-{n}", cache))
            runs["node"].append(node_loss(work / f"node-{n}", cache, nodes))
    finally:
        nodes.stop()
    medians = {
        name: round(statistics.median(r["recovery_s"] for r in rows), 3)
        for name, rows in runs.items()
    }
    print(f"{'failure on 2 nodes':34}{'recovery p50':>14}{'n':>4}")
    print(f"{'member 1 SIGKILLed':34}{medians['member']:>12.3f} s{args.repeats:>4}")
    print(f"{'member 1 node lost (all killed)':34}{medians['node']:>12.3f} s{args.repeats:>4}")
    RESULTS.parent.mkdir(exist_ok=True)
    figures = records(
        [
            context(
                "2 nodes, member SIGKILL to first resumed progress", medians["member"], ".3f", " s"
            ),
            context("2 nodes, node lost to first resumed progress", medians["node"], ".3f", " s"),
        ]
    )
    RESULTS.write_text(
        json.dumps(
            {"repeats": args.repeats, "medians_s": medians, "runs": runs, "figures": figures},
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
