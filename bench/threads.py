"""What exactness costs on a box's cores: one pinned thread, XLA's own threads, N pinned members.

jobwarden pins XLA's CPU backend to one thread for bit-exact replay
(docs/worker.md).  This bench measures, side by side in one run, the updates
per second of:

* ``pinned``: one process, XLA pinned to one thread (what an attached run gets);
* ``pinned, pool of P``: the same with XLA's CPU client pool at P threads
  (``NPROC=P``, ``--pools``, 1 unless told) instead of the pinned two: exact
  run after run too, with bits of their own (docs/worker.md); a pool of one
  is faster for short updates and slower for larger reductions, a larger
  pool may share those reductions among more of a big box's cores;
* ``free``: one process with XLA's default threads (``--threads T`` sets
  ``intra_op_parallelism_threads=T`` instead), which is not exact;
* ``ops 1 thread, T pool``: each op single-threaded (``--xla_cpu_multi_thread_eigen=false``)
  but a pool of T intra-op threads (T = ``--threads``, else the CPUs), the candidate
  for a configuration both multi-threaded and deterministic;
* ``members``: the ``dp_mlp`` task as ``processes = N`` pinned members of one
  job on this box (gloo on loopback), each computing its share of the batch,
  run by the worker as wardend would run it (mlp only; beside it the ``mlp``
  task through the worker in one process, the like-for-like baseline).

on the ``mlp`` task (``--width``, ``--batch``) and on the digits model of
examples/digits at two widths (``--hidden``).  Each configuration runs in a
fresh process (the XLA flags must be set before JAX starts), in rounds whose
order rotates, and the medians over rounds are reported with the ratio to
``pinned``.

Exactness is shown, not assumed: each single-process child runs the same
update from the same state ``--repeats`` times and counts the distinct
results (state hashes over every bit); a pinned run gives one, a free run may
give several.  The members' job is run twice and its final state hashes
compared (docs/multiprocess.md: equal for a given N).

    .venv/bin/python bench/threads.py [--rounds 3] [--processes 2] [--threads T] [--pools 1,8]

Prints a table and writes ``bench/results/threads.json``.  On a bigger box
raise ``--processes`` (and the batch, which N must divide) to see whether N
pinned members beat one free-threaded process there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import context, records

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
POOL = "pinned, pool of "


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration in this process: median update time and distinct repeat results."""
    from jobwarden.runtime import pin_environment

    if spec.get("nproc"):
        os.environ["NPROC"] = spec["nproc"]  # kept by the pins
    if spec["threads"] == "pinned":
        pin_environment()
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = spec["flags"]
    import jax

    from jobwarden import statetree
    from jobwarden.hashing import state_hash

    step, state = workload(spec)
    for _ in range(10):  # compile, warm
        state, loss = step(state)
    jax.block_until_ready(loss)
    times = []
    for _ in range(spec["updates"]):
        began = time.perf_counter()
        state, loss = step(state)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - began)
    results = set()
    for _ in range(spec["repeats"]):  # the same update from the same state, again and again
        after, _loss = step(state)
        results.add(state_hash(statetree.flatten(jax.block_until_ready(after)), 0)[0])
    return {"update_s": statistics.median(times), "distinct": len(results)}


def workload(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The jitted update and initial state of ``spec``'s workload."""
    import jax

    if spec["workload"] == "mlp":
        from jobwarden.tasks.mlp import MLP, MLPTrain

        task = MLP(MLPTrain(width=spec["size"], batch_size=spec["batch"]))
        data = task.data()
        return jax.jit(task.update(data)), task.init_state(data)
    from dataclasses import replace

    sys.path.insert(0, str(EXAMPLES / "digits"))
    import model

    config = replace(model.Config(), hidden=spec["size"])
    trainer = model.Trainer(config, model.load(config))
    trainer.compile(trainer.init_state)
    return trainer.step, trainer.init_state


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """`child` in a fresh interpreter (XLA's flags are read once, as JAX starts)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "NPROC")}
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
        env=env,
    )
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


JOB = """id = "threads"
task = "{task}"
[train]
width = {width}
batch_size = {batch}
[run]
steps = {steps}
checkpoint_every = {steps}
processes = {n}
"""


def run_job(  # noqa: PLR0917 - a bench helper, called once
    task: str, n: int, width: int, batch: int, steps: int, base: Path
) -> dict[str, Any]:
    """One job of ``n`` pinned members run by the worker: member 0's median update (the
    members wait for each other in the gradient reduction) and the final state hash."""
    folder = Path(tempfile.mkdtemp(dir=base))
    job = folder / "job.toml"
    job.write_text(JOB.format(task=task, width=width, batch=batch, steps=steps, n=n))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    for index in range(n):
        env = {**os.environ, "JOBWARDEN_PROCESS_ID": str(index), "JOBWARDEN_PROCESSES": str(n)}
        env["JOBWARDEN_COORDINATOR"] = f"127.0.0.1:{port}"
        argv = [sys.executable, "-m", "jobwarden.worker", "--job", str(job)]
        argv += ["--checkpoint-dir", str(folder / "ck")]
        # Member 0's events are read; the others' are dropped, so that no member blocks on
        # a full pipe while member 0 waits for it in the reduction.
        out = subprocess.PIPE if index == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    events = [json.loads(x) for x in outs[0].decode().splitlines() if x.startswith("{")]
    updates = [e["update_s"] for e in events if e["event"] == "progress"][10:]
    final = next((e["state_hash"] for e in events if e["event"] == "completed"), None)
    return {"update_s": statistics.median(updates), "final": final}


def main() -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=200, help="timed updates per run")
    parser.add_argument("--repeats", type=int, default=20, help="repeats of one update")
    parser.add_argument("--processes", type=int, default=2, help="N pinned members")
    parser.add_argument("--threads", type=int, help="XLA's threads when free (default: XLA's)")
    parser.add_argument("--pools", default="1", help="pinned runs' other pool sizes (NPROC)")
    parser.add_argument("--width", type=int, default=256, help="the mlp task's width")
    parser.add_argument("--batch", type=int, default=1024, help="the mlp task's batch (N | it)")
    parser.add_argument("--hidden", default="1024,2048", help="the digits model's widths")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results/threads.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    free = f"free ({args.threads} threads)" if args.threads else "free (XLA's threads)"
    pool = args.threads or os.cpu_count() or 1
    split = f"ops 1 thread, {pool} pool"
    flags = {
        free: f"intra_op_parallelism_threads={args.threads}" if args.threads else "",
        split: f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={pool}",
    }
    loads = [("mlp", args.width)] + [("digits", int(h)) for h in args.hidden.split(",")]
    times: dict[tuple[str, int, str], list[float]] = {}
    distinct: dict[tuple[str, int, str], list[int]] = {}
    finals: dict[str, list[str | None]] = {}
    n = args.processes
    base = Path(tempfile.mkdtemp(prefix="jobwarden-bench-threads-"))
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    pools = [f"{POOL}{size}" for size in args.pools.split(",") if size]
    configs = [(w, s, c) for w, s in loads for c in ("pinned", *pools, free, split)]
    configs += [("mlp", args.width, "worker, 1 process"), ("mlp", args.width, f"{n} members")]
    for number in range(args.rounds):
        shift = number % len(configs)
        for workload_name, size, config in configs[shift:] + configs[:shift]:
            key = (workload_name, size, config)
            print(f"round {number + 1}: {workload_name} {size} {config}", file=sys.stderr)
            if config.startswith("worker") or config.endswith("members"):
                members = 1 if config.startswith("worker") else n
                task = "mlp" if members == 1 else "dp_mlp"
                steps = args.updates + 10
                found = run_job(task, members, args.width, args.batch, steps, base)
                finals.setdefault(config, []).append(found["final"])
            else:
                spec = {
                    "workload": workload_name,
                    "size": size,
                    "batch": args.batch,
                    "threads": "pinned" if config.startswith("pinned") else "free",
                    "nproc": config.removeprefix(POOL) if config.startswith(POOL) else None,
                    "flags": flags.get(config, ""),
                    "updates": args.updates,
                    "repeats": args.repeats,
                }
                found = run_child(spec)
                distinct.setdefault(key, []).append(found["distinct"])
            times.setdefault(key, []).append(found["update_s"])
    print(
        f"updates per second, medians of {args.rounds} rounds (each configuration a fresh "
        f"process, the order rotating); load average after {os.getloadavg()[0]:.1f}"
    )
    print(f"{'workload':<16}{'configuration':<24}{'ms/update':>10}{'updates/s':>11}"
          f"{'vs pinned':>10}  exact?")  # fmt: skip
    rows = []
    for workload_name, size, config in configs:
        key = (workload_name, size, config)
        median = statistics.median(times[key])
        pinned = statistics.median(times[workload_name, size, "pinned"])
        if key in distinct:
            worst = max(distinct[key])
            exact = f"{worst} distinct of {args.repeats} repeats"
        else:
            hashes = set(finals[config])
            exact = f"{len(hashes)} final hash(es) in {len(finals[config])} runs"
        row = {
            "workload": f"{workload_name} {size}",
            "configuration": config,
            "update_ms": median * 1e3,
            "updates_per_s": 1 / median,
            "speed_vs_pinned": pinned / median,
            "exactness": exact,
            "rounds_s": times[key],
        }
        rows.append(row)
        print(
            f"{row['workload']:<16}{config:<24}{row['update_ms']:>10.2f}"
            f"{row['updates_per_s']:>11.0f}{row['speed_vs_pinned']:>9.2f}x  {exact}"
        )
    alone = statistics.median(times["mlp", args.width, "worker, 1 process"])
    together = statistics.median(times["mlp", args.width, f"{n} members"])
    print(f"{n} pinned members vs one pinned process, both through the worker: "
          f"{alone / together:.2f}x the updates per second")  # fmt: skip
    figures = [
        context(f"mlp {args.width}, {n} members vs 1 process (worker)", alone / together,
                ".2f", "x"),
    ]  # fmt: skip
    figures += [
        context(f"{r['workload']}, {r['configuration']}, speed vs pinned", r["speed_vs_pinned"],
                ".2f", "x")
        for r in rows
        if r["configuration"] != "pinned"
    ]  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "processes": n,
        "threads": args.threads,
        "cpus": os.cpu_count(),
        "members_vs_one_process": alone / together,
        "rows": rows,
        "figures": records(figures),
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(base, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
