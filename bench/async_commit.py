"""Asynchronous commit: how long training waits for a commit, side by side in one run.

For each state size of the ``mlp`` task (Adam: params, mu and nu) it runs
the real worker three times, one after the other on the same machine:

* ``none``: no checkpoint inside the window (``checkpoint_every`` past the end);
* ``sync``: a commit every 10 updates on the training thread;
* ``async``: the same commits with ``[run] async_commit = true``.

Each run does ``--steps`` updates; the window is from ``ready`` to the last
update's ``progress`` event, so it holds the commits at 10, 20, 30 (the final
commit, after the window, is the same in all three).  ``blocked`` is each
commit's ``blocked_s`` (the training thread's wait: all of a synchronous
commit, the host copy and any wait for the previous commit of an
asynchronous one), ``commit`` a synchronous commit's ``seconds``.  The
targets: async blocked <= 0.1x the synchronous commit time, and the async
window <= 1.05x the window with no checkpoints.

Run with ``.venv/bin/python bench/async_commit.py`` (``--sizes 64`` for one
size, ``--repeats N`` for more rounds, alternating the modes).  It prints a
table and writes ``bench/results/async_commit.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from figures import Figure, at_most, context, records

from jobwarden.tasks.mlp import width_for_bytes
from jobwarden.worker.command import worker_argv

RESULTS = Path(__file__).parent / "results" / "async_commit.json"
MODES = ("none", "sync", "async")
EVERY = 10
BLOCK_TARGET = 0.1
WALL_TARGET = 1.05


def job_text(mode: str, width: int, steps: int) -> str:
    """The job file of one run."""
    every = EVERY if mode != "none" else 10 * steps
    return "\n".join(
        [
            'id = "bench"',
            'task = "mlp"',
            "[train]",
            f"width = {width}",
            "[run]",
            f"steps = {steps}",
            f"checkpoint_every = {every}",
            "keep_checkpoints = 2",
            f"hash_every = {EVERY}",
            f"async_commit = {'true' if mode == 'async' else 'false'}",
            "",
        ]
    )


def run_once(base: Path, mode: str, width: int, steps: int, cache: Path) -> dict[str, Any]:
    """One worker run; its window, commits and blocking."""
    folder = base / mode
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    spec = folder / "job.toml"
    spec.write_text(job_text(mode, width, steps))
    with (folder / "events.jsonl").open("wb") as out:
        subprocess.run(worker_argv(spec, folder / "ck", cache), stdout=out, check=True)
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    ready = next(e["time"] for e in events if e["event"] == "ready")
    last = next(e["time"] for e in events if e["event"] == "progress" and e["step"] == steps)
    commits = [e for e in events if e["event"] == "checkpoint" and e["step"] < steps]
    size = next(e["bytes"] for e in events if e["event"] == "checkpoint")
    shutil.rmtree(folder / "ck", ignore_errors=True)
    return {
        "window_s": last - ready,
        "commit_s": [e["seconds"] for e in commits],
        "blocked_s": [e["blocked_s"] for e in commits],
        "bytes": size,
    }


def measure(size_mib: int, steps: int, repeats: int, cache: Path, base: Path) -> dict[str, Any]:
    """The three modes at one size, ``repeats`` rounds, alternating."""
    width = width_for_bytes(size_mib << 20)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for _ in range(repeats):
        for mode in MODES:
            runs[mode].append(run_once(base, mode, width, steps, cache))
    window = {mode: statistics.median(r["window_s"] for r in runs[mode]) for mode in MODES}
    sync_commit = statistics.median(s for r in runs["sync"] for s in r["commit_s"])
    async_blocked = statistics.median(s for r in runs["async"] for s in r["blocked_s"])
    async_commit = statistics.median(s for r in runs["async"] for s in r["commit_s"])
    block_ratio = async_blocked / sync_commit
    wall_ratio = window["async"] / window["none"]
    return {
        "size_mib": size_mib,
        "bytes": runs["sync"][0]["bytes"],
        "width": width,
        "steps": steps,
        "window_s": window,
        "sync_commit_s": sync_commit,
        "async_blocked_s": async_blocked,
        "async_write_s": async_commit,
        "block_ratio": block_ratio,
        "sync_wall_ratio": window["sync"] / window["none"],
        "async_wall_ratio": wall_ratio,
        "block_pass": block_ratio <= BLOCK_TARGET,
        "wall_pass": wall_ratio <= WALL_TARGET,
        "runs": runs,
    }


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    """The summary's rows: both targets at each size."""
    out = []
    for r in rows:
        size = f"mlp {r['size_mib']} MiB, commit every {EVERY}"
        out += [
            at_most(f"{size}: blocked / sync commit", r["block_ratio"], BLOCK_TARGET, ".3f"),
            at_most(f"{size}: async wall / none", r["async_wall_ratio"], WALL_TARGET, ".3f"),
            context(f"{size}: sync wall / none", r["sync_wall_ratio"], ".3f"),
        ]
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The printed table."""
    head = (
        f"{'state':>8} {'none s':>8} {'sync s':>8} {'async s':>8} {'commit s':>9} "
        f"{'blocked s':>10} {'blocked/commit':>15} {'async/none':>11}"
    )
    lines = [head]
    for r in rows:
        w = r["window_s"]
        block = f"{r['block_ratio']:.3f} {'PASS' if r['block_pass'] else 'FAIL'}"
        wall = f"{r['async_wall_ratio']:.3f} {'PASS' if r['wall_pass'] else 'FAIL'}"
        lines.append(
            f"{r['size_mib']:>5} MiB {w['none']:>8.2f} {w['sync']:>8.2f} {w['async']:>8.2f} "
            f"{r['sync_commit_s']:>9.3f} {r['async_blocked_s']:>10.4f} {block:>15} {wall:>11}"
        )
    lines.append(
        f"targets: blocked/commit <= {BLOCK_TARGET}, async/none <= {WALL_TARGET} "
        f"(windows: ready to the last update, commits every {EVERY} updates)"
    )
    return "\n".join(lines)


def main() -> None:
    """Measure, print, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,512", help="state sizes in MiB (default 64,512)")
    parser.add_argument("--steps", type=int, default=40, help="updates per run (default 40)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the three modes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jobwarden-bench-") as temp:
        base = Path(temp)
        cache = base / "cache"
        rows = [
            measure(int(size), args.steps, args.repeats, cache, base)
            for size in args.sizes.split(",")
        ]
    print(table(rows))
    RESULTS.parent.mkdir(exist_ok=True)
    record = {
        "cpus": _cpus(),
        "python": platform.python_version(),
        "rows": rows,
        "figures": records(figures(rows)),
    }
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
