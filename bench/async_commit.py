"""Asynchronous commit: what a commit costs the training, side by side in one run.

For each state size of the ``mlp`` task (Adam: params, mu and nu) it runs
four modes, each in a fresh child process (`bench/commit_loop.py`) running
the same loop on the same arrays: the task's jitted update with the worker's
single-threaded XLA pins, 40 updates, a commit after updates 10, 20 and 30:

* ``none``: no commit;
* ``sync``: jobwarden's commit on the training thread;
* ``async``: jobwarden's commit in the background (``[run] async_commit = true``);
* ``orbax``: Orbax's asynchronous ``CheckpointManager`` saving the same state.

The window runs from the first timed update until the last update is done
and the commit in flight is durable (jobwarden's ``settle``, Orbax's
``wait_until_finished``).  Rounds alternate the modes.  ``blocked`` is the
training thread's hold per commit (all of a synchronous commit; the host views
and any wait for the previous commit of an asynchronous one; Orbax's ``save``
call), ``commit`` a synchronous commit's ``seconds``.  The targets: async
blocked <= 0.1x the synchronous commit, async / none <= 1.10 at 512 MiB, and
async / none no worse than Orbax's asynchronous ratio measured in the same run.

``--commit-cpu N`` also times N background commits of the 512 MiB state
alone (nothing training): the commit thread's own CPU seconds and wall time.

Run with ``.venv/bin/python bench/async_commit.py`` (``--sizes 64`` for one
size, ``--repeats N`` for more rounds).  It prints a table and writes
``bench/results/async_commit.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from figures import Figure, at_most, context, records

from jobwarden.tasks.mlp import width_for_bytes

RESULTS = Path(__file__).parent / "results" / "async_commit.json"
LOOP = Path(__file__).parent / "commit_loop.py"
MODES = ("none", "sync", "async", "orbax")
EVERY = 10
BLOCK_TARGET = 0.1
WALL_TARGET = 1.10
WALL_TARGET_MIB = 512


def child(mode: str, width: int, folder: Path, *extra: str) -> dict[str, Any]:
    """One run of `bench/commit_loop.py` in a fresh process; its JSON line."""
    shutil.rmtree(folder, ignore_errors=True)
    argv = [sys.executable, str(LOOP), mode, "--width", str(width), "--folder", str(folder)]
    done = subprocess.run([*argv, *extra], stdout=subprocess.PIPE, check=True, text=True)
    shutil.rmtree(folder, ignore_errors=True)
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


def loadavg() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


def measure(size_mib: int, steps: int, repeats: int, base: Path) -> dict[str, Any]:
    """The four modes at one size, ``repeats`` rounds, alternating."""
    width = width_for_bytes(size_mib << 20)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    load = [loadavg()]
    for _ in range(repeats):
        for mode in MODES:
            runs[mode].append(child(mode, width, base / mode, "--steps", str(steps)))
            load.append(loadavg())
    window = {mode: statistics.median(r["window_s"] for r in runs[mode]) for mode in MODES}
    cpu = {mode: statistics.median(r["cpu_s"] for r in runs[mode]) for mode in MODES}
    blocked = {
        mode: statistics.median(s for r in runs[mode] for s in r["blocked_s"]) for mode in MODES[1:]
    }
    sync_commit = statistics.median(s for r in runs["sync"] for s in r["commit_s"])
    ratio = {mode: window[mode] / window["none"] for mode in MODES}
    fastest = {mode: min(r["window_s"] for r in runs[mode]) for mode in MODES}
    return {
        "size_mib": size_mib,
        "bytes": runs["none"][0]["bytes"],
        "width": width,
        "steps": steps,
        "repeats": repeats,
        "window_s": window,
        "cpu_s": cpu,
        "ratio": ratio,
        "cpu_ratio": {mode: cpu[mode] / cpu["none"] for mode in MODES},
        "fastest_ratio": {mode: fastest[mode] / fastest["none"] for mode in MODES},
        "blocked_s": blocked,
        "sync_commit_s": sync_commit,
        "async_write_s": statistics.median(s for r in runs["async"] for s in r["commit_s"]),
        "block_ratio": blocked["async"] / sync_commit,
        "loadavg": load,
        "runs": runs,
    }


def commit_cpu(count: int, base: Path) -> dict[str, Any]:
    """``count`` background commits of the 512 MiB state alone: medians of thread CPU and wall."""
    found = child(
        "commit_cpu", width_for_bytes(WALL_TARGET_MIB << 20), base / "cpu", "--repeats", str(count)
    )
    return {
        **found,
        "median_cpu_s": statistics.median(found["cpu_s"]),
        "median_wall_s": statistics.median(found["wall_s"]),
    }


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    """The summary's rows: the blocking, wall and Orbax targets at each size."""
    out = []
    for r in rows:
        size = f"mlp {r['size_mib']} MiB, commit every {EVERY}"
        ratio = r["ratio"]
        out.append(at_most(f"{size}: blocked / sync commit", r["block_ratio"], BLOCK_TARGET, ".3f"))
        if r["size_mib"] == WALL_TARGET_MIB:
            out.append(at_most(f"{size}: async wall / none", ratio["async"], WALL_TARGET, ".3f"))
        else:
            out.append(context(f"{size}: async wall / none", ratio["async"], ".3f"))
        out += [
            at_most(
                f"{size}: async / none vs orbax-async / none", ratio["async"], ratio["orbax"], ".3f"
            ),
            context(f"{size}: sync wall / none", ratio["sync"], ".3f"),
            context(f"{size}: async CPU / none", r["cpu_ratio"]["async"], ".3f"),
            context(f"{size}: orbax-async CPU / none", r["cpu_ratio"]["orbax"], ".3f"),
        ]
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The printed table."""
    head = (
        f"{'state':>8} {'none s':>7} {'sync s':>7} {'async s':>8} {'orbax s':>8} "
        f"{'sync/none':>9} {'async/none':>10} {'orbax/none':>10} {'commit s':>8} "
        f"{'blocked async':>13} {'blocked orbax':>13} {'load':>9}"
    )
    lines = [head]
    for r in rows:
        w, q, b = r["window_s"], r["ratio"], r["blocked_s"]
        load = f"{min(r['loadavg']):.1f}-{max(r['loadavg']):.1f}"
        lines.append(
            f"{r['size_mib']:>5} MiB {w['none']:>7.2f} {w['sync']:>7.2f} {w['async']:>8.2f} "
            f"{w['orbax']:>8.2f} {q['sync']:>9.3f} {q['async']:>10.3f} {q['orbax']:>10.3f} "
            f"{r['sync_commit_s']:>8.3f} {b['async']:>13.4f} {b['orbax']:>13.4f} {load:>9}"
        )
    lines.append("process CPU seconds of the window (medians), and their ratio to none:")
    for r in rows:
        c, q = r["cpu_s"], r["cpu_ratio"]
        lines.append(
            f"{r['size_mib']:>5} MiB "
            + " ".join(f"{mode} {c[mode]:.2f} s ({q[mode]:.3f})" for mode in MODES)
        )
    lines.append("fastest round's window over the fastest with none:")
    for r in rows:
        q = r["fastest_ratio"]
        lines.append(
            f"{r['size_mib']:>5} MiB "
            + " ".join(f"{mode}/none {q[mode]:.3f}" for mode in MODES[1:])
        )
    lines.append(
        f"targets: blocked/commit <= {BLOCK_TARGET}; async/none <= {WALL_TARGET} at "
        f"{WALL_TARGET_MIB} MiB and <= orbax/none (medians; commits after updates "
        f"{EVERY}, {2 * EVERY}, {3 * EVERY})"
    )
    return "\n".join(lines)


def main() -> None:
    """Measure, print, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,512", help="state sizes in MiB (default 64,512)")
    parser.add_argument("--steps", type=int, default=40, help="updates per run (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the four modes")
    parser.add_argument("--commit-cpu", type=int, default=0, help="background commits alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobwarden-bench-") as temp:
        base = Path(temp)
        rows = [
            measure(int(size), args.steps, args.repeats, base) for size in args.sizes.split(",")
        ]
        alone = commit_cpu(args.commit_cpu, base) if args.commit_cpu else None
    print(table(rows))
    if alone is not None:
        print(
            f"{args.commit_cpu} background commits of {alone['bytes'] >> 20} MiB alone: median "
            f"{alone['median_cpu_s']:.3f} s CPU on the commit thread, "
            f"{alone['median_wall_s']:.3f} s wall"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    record = {
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "rows": rows,
        "commit_alone": alone,
        "figures": records(figures(rows)),
    }
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
