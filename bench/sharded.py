"""Sharded state: its commit, restore and hash, against the same state replicated with
member 0 writing, and against Orbax's own sharded save and restore of the same arrays.

N members (N = 2, 4) joined by jax.distributed on loopback (gloo), one CPU device each,
hold one float32 matrix of ``--mib`` MiB split on its rows, and a small key each holds a
copy of.  In one run, on the same disk, each member times (`bench/sharded_member.py`):

- sharded: `ShardCommitter.commit` (its shard durable, the gather of the members'
  reports, member 0's record, retention of the older step) and `open_sharded` (member 0
  chooses the step, every member reads and checks its shard, places it, and the combined
  hash is proven against the record);
- replicated: the whole state in every member, committed as a replicated job commits
  (`Membership.agree`, then member 0's `Committer` writes the one file and removes the
  older one) and restored as one restores (member 0's `CheckpointStore.select`, then
  `Membership.share_start` gives every member the values);
- Orbax: `StandardCheckpointer.save` of the same `jax.Array`s until `wait_until_finished`
  (every member writes its shards; Orbax does not fsync, so the fsync of every file and
  folder it wrote is timed apart, and its retention is left out), and its `restore`
  onto the same sharding;
- the combined hash per update (`ShardedStateHasher`), against gathering the state whole
  into every member and hashing it (`StateHasher`).

Every repeat starts together; a repeat's time is its slowest member's (the job waits for
it), and the figure is the median of ``--repeat``; a ratio is taken within each repeat
(the two ways timed seconds apart) and its median given.  This machine is shared: the load
average is printed and recorded.  Writes bench/results/sharded.json.

    .venv/bin/python bench/sharded.py [--mib 256] [--repeat 5]
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
from typing import Any

from figures import Figure, context, records, verdict

MEASURES = (
    "sharded_commit",
    "sharded_restore",
    "replicated_commit",
    "replicated_restore",
    "orbax_save",
    "orbax_fsync",
    "orbax_restore",
    "hash_combined",
    "hash_gathered",
)
SIZES = (2, 4)
PAIRS = (
    ("sharded_commit", "replicated_commit"),
    ("sharded_commit", "orbax_save"),
    ("sharded_restore", "replicated_restore"),
    ("sharded_restore", "orbax_restore"),
    ("hash_combined", "hash_gathered"),
)
"""ratios taken within each repeat (seconds apart), then their median"""


def group(
    members: int, mib: int, repeat: int, folder: Path
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """In a job of ``members``: the median over repeats of each measure's slowest member and
    of each ratio of `PAIRS` (``"a/b"``), and the slowest member's seconds per repeat."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, __file__, "--member", str(i), str(members), str(port)),
                *("--mib", str(mib), "--repeat", str(repeat), "--folder", str(folder)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(members)
    ]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a member failed: exit statuses {[p.returncode for p in procs]}")
    found = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    slowest = {name: [max(f[name][r] for f in found) for r in range(repeat)] for name in MEASURES}
    medians = {name: statistics.median(seconds) for name, seconds in slowest.items()}
    for a, b in PAIRS:
        pairs = zip(slowest[a], slowest[b], strict=True)
        medians[f"{a}/{b}"] = statistics.median(x / y for x, y in pairs)
    return medians, slowest


def below(name: str, value: float, limit: float) -> Figure:
    """A ratio whose target is strictly below ``limit``."""
    return Figure(name, f"{value:.2f}", f"< {limit:.2f}", verdict(value < limit), value)


def figures(mib: int, found: dict[int, dict[str, float]]) -> list[Figure]:
    """The figures beside the issue's targets, then the context."""
    out = []
    for n in SIZES:
        f = found[n]
        ratio = f["sharded_commit/replicated_commit"]
        if n == 2:
            out.append(
                Figure(
                    f"{mib} MiB sharded commit / replicated (member 0 writes), N = 2",
                    f"{ratio:.2f}",
                    "<= 1.00",
                    verdict(ratio <= 1.0),
                    ratio,
                )
            )
        else:
            out.append(context(f"{mib} MiB sharded commit / replicated, N = {n}", ratio, ".2f"))
        out.append(
            below(
                f"{mib} MiB sharded commit / Orbax save, N = {n}",
                f["sharded_commit/orbax_save"],
                1.0,
            )
        )
    for n in SIZES:
        f = found[n]
        out += [
            context(f"{mib} MiB sharded commit, N = {n}", f["sharded_commit"] * 1e3, ".0f", " ms"),
            context(
                f"{mib} MiB sharded restore, N = {n}", f["sharded_restore"] * 1e3, ".0f", " ms"
            ),
            context(f"{mib} MiB Orbax save, N = {n}", f["orbax_save"] * 1e3, ".0f", " ms"),
            context(
                f"{mib} MiB sharded restore / Orbax restore, N = {n}",
                f["sharded_restore/orbax_restore"],
                ".2f",
            ),
            context(
                f"{mib} MiB combined hash / gathered hash, N = {n}",
                f["hash_combined/hash_gathered"],
                ".2f",
            ),
        ]
    return out


def table(mib: int, found: dict[int, dict[str, float]]) -> str:
    """The figures as a Markdown table, milliseconds."""
    lines = [
        f"| {mib} MiB state | sharded | replicated, member 0 writes | Orbax | "
        "sharded / replicated | sharded / Orbax |",
        "|---|---|---|---|---|---|",
    ]
    for n in SIZES:
        f = found[n]
        rows = (
            ("commit", "sharded_commit", "replicated_commit", "orbax_save"),
            ("restore", "sharded_restore", "replicated_restore", "orbax_restore"),
        )
        for what, ours, theirs, orbax in rows:
            versus = f[f"{ours}/{theirs}"], f[f"{ours}/{orbax}"]
            lines.append(
                f"| {what}, N = {n} | {f[ours] * 1e3:.0f} ms | {f[theirs] * 1e3:.0f} ms | "
                f"{f[orbax] * 1e3:.0f} ms | {versus[0]:.2f} | {versus[1]:.2f} |"
            )
        lines.append(
            f"| Orbax's files fsynced after its save, N = {n} | | | "
            f"+{f['orbax_fsync'] * 1e3:.0f} ms | | |"
        )
    lines += ["", "| state hash per update | combined (sharded) | gathered, then hashed | ratio |"]
    lines.append("|---|---|---|---|")
    for n in SIZES:
        f = found[n]
        lines.append(
            f"| N = {n} | {f['hash_combined'] * 1e3:.1f} ms | {f['hash_gathered'] * 1e3:.1f} ms "
            f"| {f['hash_combined/hash_gathered']:.2f} |"
        )
    return "\n".join(lines)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    """Run both group sizes, print the table, write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--member", nargs=3, type=int)
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    if args.member:
        from sharded_member import member

        member(*args.member, mib=args.mib, repeat=args.repeat, folder=args.folder)
        return
    loads = [load_average()]
    found: dict[int, dict[str, float]] = {}
    slowest: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in SIZES:
            folder = Path(tmp) / f"n{n}"
            folder.mkdir(mode=0o700)
            found[n], slowest[n] = group(n, args.mib, args.repeat, folder)
            loads.append(load_average())
    print(table(args.mib, found))
    print(f"\nload average (1, 5, 15 min) before and after each N: {' | '.join(loads)}")
    out = Path(__file__).parent / "results" / "sharded.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "created": time.time(),
        "mib": args.mib,
        "repeat": args.repeat,
        "load_average": loads,
        "medians": {str(n): f for n, f in found.items()},
        "slowest_member_s": {str(n): f for n, f in slowest.items()},
        "figures": records(figures(args.mib, found)),
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out.parent.name}/{out.name}")


if __name__ == "__main__":
    main()
