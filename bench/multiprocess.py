"""Multi-process jobs: time until all N members are ready, and the median update time of dp_mlp.

Runs N worker processes directly (as wardend's local launcher does), N = 1, 2, 4,
on a fresh checkpoint directory each; prints a table and writes
bench/results/multiprocess.json.  Usage: python bench/multiprocess.py [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """id = "bench"
task = "dp_mlp"
[train]
seed = 1
width = 64
batch_size = 64
[run]
steps = {steps}
checkpoint_every = {steps}
processes = {n}
"""


def run(n: int, steps: int, base: Path) -> dict[str, float]:
    """One N-member run: seconds from spawn to the last member's ready, median update."""
    job = base / f"job{n}.toml"
    job.write_text(JOB.format(steps=steps, n=n))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    began = time.time()
    procs = []
    for i in range(n):
        env = {"JOBWARDEN_PROCESS_ID": str(i), "JOBWARDEN_PROCESSES": str(n)}
        env["JOBWARDEN_COORDINATOR"] = f"127.0.0.1:{port}"
        argv = [sys.executable, "-m", "jobwarden.worker", "--job", str(job)]
        argv += ["--checkpoint-dir", str(base / f"ck{n}")]
        procs.append(
            subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**__import__("os").environ, **env},
            )
        )
    outs = [p.communicate(timeout=600)[0].decode() for p in procs]
    events = [json.loads(x) for x in outs[0].splitlines() if x.startswith("{")]
    readies = [
        next(json.loads(x)["time"] for x in out.splitlines() if '"ready"' in x) for out in outs
    ]
    updates = [e["update_s"] for e in events if e["event"] == "progress"][1:]
    return {"n": n, "ready_s": max(readies) - began, "update_ms": 1e3 * statistics.median(updates)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2, 4):
            rows.append(run(n, args.steps, Path(tmp)))
    print(f"{'N':>3} {'all ready (s)':>14} {'update (ms)':>12}")
    for row in rows:
        print(f"{row['n']:>3} {row['ready_s']:>14.2f} {row['update_ms']:>12.3f}")
    out = Path(__file__).parent / "results" / "multiprocess.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
