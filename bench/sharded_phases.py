"""Where a sharded commit's time goes: each phase of `ShardCommitter.commit`, per member.

N members as in `bench/sharded.py` commit the same laid-out state ``--repeat`` times (after
one that warms up and is not kept) with the real committer, whose phases are timed by
wrapping what it calls: the shard written and checksummed (`write_shard_file` less its
fsyncs and rename), the shard's fsync, its rename and the directory's fsync, the gather of
the members' reports, member 0's record (written durably), the removal of the dropped
records, the second gather, and each member's removal of its own shard files (on a thread
of its own, after the commit has returned: waited for before the next commit, untimed).
Prints one row per member, medians in milliseconds, and the load average.

    .venv/bin/python bench/sharded_phases.py [--mib 256] [--members 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

PHASES = (
    "write+checksum",
    "fsync shard",
    "rename",
    "fsync dir",
    "gather reports",
    "record",
    "drop records",
    "gather: record durable",
    "remove own shards",
    "commit",
)


def member(index: int, members: int, port: int, *, mib: int, repeat: int, folder: Path) -> None:
    """One member: commit ``repeat + 1`` times, its phases timed; one JSON line."""
    from sharded_member import Bench, Sharded

    from jobwarden.shards import commit, files

    spent: dict[str, float] = defaultdict(float)
    within = [""]  # the phase running: a sync or rename counts only inside the shard's write
    gathers = [0]

    def timed(owner: Any, name: str, label: Callable[..., str], inside: bool = False) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if inside and within[0] != "shard":
                return inner(*args, **kwargs)
            phase = label(*args)
            if not inside:
                within[0] = phase
            began = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[phase] += time.perf_counter() - began
                if not inside:
                    within[0] = ""

        setattr(owner, name, wrapper)

    def fsync_label(fd: int) -> str:
        return "fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync shard"

    def gather_label(*_: Any) -> str:
        gathers[0] += 1
        return "gather reports" if gathers[0] % 2 else "gather: record durable"

    timed(os, "fsync", fsync_label, inside=True)
    timed(os, "replace", lambda *_: "rename", inside=True)
    timed(files, "write_shard_file", lambda *_: "shard")
    timed(commit.Group, "exchange", gather_label)
    timed(files.ShardFiles, "write_record", lambda *_: "record")
    timed(files.ShardFiles, "retain_records", lambda *_: "drop records")
    timed(files.ShardFiles, "retain_shards", lambda *_: "remove own shards")
    bench = Bench(index, members, port, mib, folder)
    way = Sharded(bench)
    rows: list[dict[str, float]] = []
    for step in range(1, repeat + 2):
        work = way.prepare(step)
        spent.clear()
        gathers[0] = 0
        (spent["commit"],) = bench.timed(work, 1)
        way.committer.settle()  # the removal runs on its thread, outside the commit's time
        phases = dict(spent)
        syncs = sum(phases.get(p, 0.0) for p in ("fsync shard", "rename", "fsync dir"))
        phases["write+checksum"] = phases.pop("shard", 0.0) - syncs
        rows.append(phases)
    medians = {p: statistics.median(r.get(p, 0.0) for r in rows[1:]) * 1e3 for p in PHASES}
    sys.stdout.write(json.dumps({"member": index, **medians}) + "\n")
    import jax

    jax.distributed.shutdown()


def main() -> None:
    """Run the members, print their phases."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--member", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    if args.member is not None:
        sizes = {"mib": args.mib, "repeat": args.repeat, "folder": args.folder}
        member(args.member, args.members, args.port, **sizes)
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    load = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            subprocess.Popen(
                [
                    *(sys.executable, __file__, "--member", str(i), "--port", str(port)),
                    *("--members", str(args.members), "--mib", str(args.mib)),
                    *("--repeat", str(args.repeat), "--folder", tmp),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(args.members)
        ]
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    found = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    print(f"| {args.mib} MiB, N = {args.members}, ms | " + " | ".join(PHASES) + " |")
    print("|---" * (len(PHASES) + 1) + "|")
    for f in found:
        print(f"| member {f['member']} | " + " | ".join(f"{f[p]:.1f}" for p in PHASES) + " |")
    after = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nload average before {' '.join(load)}, after {' '.join(after)}")


if __name__ == "__main__":
    main()
