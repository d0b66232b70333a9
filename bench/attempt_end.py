"""The time from a crash to the end of its attempt, as the local launcher follows it.

Each round spawns a leader that writes the time on stdout and exits 1 at once
(``--stray`` also leaves a grandchild in a session of its own that keeps
stdout open), follows it with `LocalAttempt.follow` and measures from the
leader's last timestamp to the return of ``follow``: the moment the supervisor
decides the attempt's outcome and may start the next.  Prints the median and
p95 in milliseconds and the strays still alive afterwards.
Usage: python bench/attempt_end.py [--rounds 40] [--stray]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from jobwarden.daemon.launch.base import LaunchSpec
from jobwarden.daemon.launch.local import LocalLauncher

LEADER = """
import os, sys, time
if {stray} and os.fork() == 0:
    os.setsid()
    time.sleep(3)
    os._exit(0)
print(time.time(), flush=True)
sys.exit(1)
"""


async def one(folder: Path, stray: bool) -> tuple[float, int]:
    """One crash: milliseconds from the leader's last word to the attempt's end; strays left."""
    code = LEADER.format(stray=stray)
    spec = LaunchSpec("bench", 1, folder, [sys.executable, "-c", code], {})
    attempt = await LocalLauncher().spawn(spec, "stderr.log")
    said: list[float] = []
    await attempt.follow(lambda e: None, lambda m: said.append(float(m.line)))
    ended = time.time()
    left = [p for p in psutil.process_iter(["environ"]) if _names(p, folder)]
    for proc in left:
        proc.kill()
    return (ended - said[0]) * 1000, len(left)


def _names(proc: psutil.Process, folder: Path) -> bool:
    environ = proc.info.get("environ") or {}
    return bool(environ.get("JOBWARDEN_ATTEMPT_FOLDER") == str(folder))


def main() -> None:
    """Run the rounds and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--stray", action="store_true")
    args = parser.parse_args()
    times, strays = [], 0
    with tempfile.TemporaryDirectory() as base:
        for n in range(args.rounds):
            ms, left = asyncio.run(one(Path(base) / str(n), args.stray))
            times.append(ms)
            strays += left
    times.sort()
    p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
    print(
        f"crash to attempt end: median {statistics.median(times):.1f} ms, p95 {p95:.1f} ms, "
        f"max {times[-1]:.1f} ms over {args.rounds}; strays left {strays}"
    )


if __name__ == "__main__":
    main()
