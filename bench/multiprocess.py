"""Multi-process jobs: time until all N members are ready, dp_mlp's median update, commit cost.

Runs N worker processes directly (as wardend's local launcher does), N = 1, 2, 4,
on a fresh checkpoint directory each.  Then the commit of one step of replicated
state of ``--commit-mib`` MiB, N = 1, 2, 4 members joined by jax.distributed: every
member hashes its state, the hashes are all-gathered and compared
(`Membership.agree`), and member 0 alone writes the one durable file; N = 1 is the
single-file step of the same total size, with no gather.  Prints both tables and
writes bench/results/multiprocess.json.
Usage: python bench/multiprocess.py [--steps 40] [--commit-mib 64] [--commits 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import context, records

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
                env={**os.environ, **env},
            )
        )
    outs = [p.communicate(timeout=600)[0].decode() for p in procs]
    events = [json.loads(x) for x in outs[0].splitlines() if x.startswith("{")]
    readies = [
        next(json.loads(x)["time"] for x in out.splitlines() if '"ready"' in x) for out in outs
    ]
    updates = [e["update_s"] for e in events if e["event"] == "progress"][1:]
    return {"n": n, "ready_s": max(readies) - began, "update_ms": 1e3 * statistics.median(updates)}


def commit_member(mib: int, commits: int, folder: Path) -> None:
    """One member of the commit bench (run by `commit_run`): a JSON line per commit."""
    import numpy as np
    from jax.experimental import multihost_utils

    from jobwarden import files
    from jobwarden.hashing import leaves_digest
    from jobwarden.sdk.distributed import Membership

    member = Membership.from_environ()
    member.join()
    state = np.random.default_rng(0).standard_normal(mib * 2**18, dtype=np.float32)
    for k in range(commits):
        if member.group:  # start every commit together, as after one update
            multihost_utils.sync_global_devices(f"commit {k}")
        began = time.perf_counter()
        digest = leaves_digest([("params", state)])
        hashed = time.perf_counter()
        member.agree(k, digest)
        agreed = time.perf_counter()
        if member.writes:
            files.commit(folder / f"ckpt-{k}", [memoryview(state).cast("B")])
        done = time.perf_counter()
        times = {"hash": hashed - began, "gather": agreed - hashed, "write": done - agreed}
        print(json.dumps({"member": member.index, **times, "total": done - began}), flush=True)


def commit_run(n: int, mib: int, commits: int, base: Path) -> dict[str, float]:
    """Median times of one commit by N members (member 0's view: it writes the file)."""
    folder = base / f"commit{n}"
    folder.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    for i in range(n):
        env = {"JOBWARDEN_PROCESS_ID": str(i), "JOBWARDEN_PROCESSES": str(n)}
        env["JOBWARDEN_COORDINATOR"] = f"127.0.0.1:{port}"
        argv = [sys.executable, __file__, "--commit-member", str(folder)]
        argv += ["--commit-mib", str(mib), "--commits", str(commits)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, env={**os.environ, **env}))
    outs = [p.communicate(timeout=600)[0].decode() for p in procs]
    rows = [json.loads(x) for x in outs[0].splitlines() if x.startswith("{")]
    return {
        "n": n,
        "mib": mib,
        **{
            f"{k}_ms": 1e3 * statistics.median(r[k] for r in rows) for k in rows[0] if k != "member"
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--commit-mib", type=int, default=64)
    parser.add_argument("--commits", type=int, default=5)
    parser.add_argument("--commit-member", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.commit_member is not None:
        commit_member(args.commit_mib, args.commits, args.commit_member)
        return
    rows, commit_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2, 4):
            rows.append(run(n, args.steps, Path(tmp)))
        for n in (1, 2, 4):
            commit_rows.append(commit_run(n, args.commit_mib, args.commits, Path(tmp)))
    print(f"{'N':>3} {'all ready (s)':>14} {'update (ms)':>12}")
    for row in rows:
        print(f"{row['n']:>3} {row['ready_s']:>14.2f} {row['update_ms']:>12.3f}")
    print(f"\ncommit of one {args.commit_mib} MiB step (member 0, medians of {args.commits})")
    print(f"{'N':>3} {'hash (ms)':>10} {'gather (ms)':>12} {'write (ms)':>11} {'total (ms)':>11}")
    for row in commit_rows:
        print(
            f"{row['n']:>3} {row['hash_ms']:>10.1f} {row['gather_ms']:>12.1f} "
            f"{row['write_ms']:>11.1f} {row['total_ms']:>11.1f}"
        )
    out = Path(__file__).parent / "results" / "multiprocess.json"
    out.parent.mkdir(exist_ok=True)
    found = [
        *(context(f"{r['n']} processes: all ready", r["ready_s"], ".2f", " s") for r in rows),
        *(context(f"{r['n']} processes: update", r["update_ms"], ".3f", " ms") for r in rows),
        *(
            context(
                f"{r['n']} processes: commit of {args.commit_mib} MiB", r["total_ms"], ".1f", " ms"
            )
            for r in commit_rows
        ),
    ]
    record = {"startup_and_update": rows, "commit": commit_rows, "figures": records(found)}
    out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
