"""The time from a crash to the end of its attempt, as the local launcher follows it.

Each round spawns a leader that writes the time on stdout and exits 1 at once
(``--stray`` also leaves a grandchild in a session of its own that keeps
stdout open), follows it with `LocalAttempt.follow` and measures from the
leader's last timestamp to the return of ``follow``: the moment the supervisor
decides the attempt's outcome and may start the next.  Prints the median and
p95 in milliseconds and the strays still alive afterwards.  ``--daemon``
measures through a real wardend instead: each round a plain command job whose
program notes the time and exits 1, restarted once at once; from attempt 1's
last word to attempt 2's first.
Usage: python bench/attempt_end.py [--rounds 40] [--stray] [--daemon]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from jobwarden.control.harness import Wardend
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


PROGRAM = """
import json, os, sys, time
from pathlib import Path
run = json.loads(Path(os.environ["JOBWARDEN_RUN_FILE"]).read_text())
with (Path(run["checkpoint_dir"]) / "times").open("a") as out:
    out.write(f"{time.time()}\\n")
if {stray} and os.fork() == 0:
    os.setsid()
    time.sleep(3)
    os._exit(0)
sys.exit(1)
"""

JOB = """id = "{id}"
command = [{python}, {program}]
sdk = false
[supervision]
max_restarts = 1
"""


def through_daemon(base: Path, rounds: int, stray: bool) -> list[float]:
    """Milliseconds from attempt 1's last word to attempt 2's first, one job per round."""
    program = base / "program.py"
    program.write_text(PROGRAM.replace("{stray}", str(stray)))
    times = []
    with Wardend(base / "root") as daemon:
        for n in range(rounds):
            quoted = [json.dumps(str(x)) for x in (sys.executable, program)]
            daemon.drop(f"j{n}.toml", JOB.format(id=f"j{n}", python=quoted[0], program=quoted[1]))
            daemon.wait(f"j{n}", timeout=60)
            (said,) = (daemon.root / "checkpoints").glob(f"j{n}*/times")
            first, second = (float(t) for t in said.read_text().split())
            times.append((second - first) * 1000)
    return times


def _names(proc: psutil.Process, folder: Path) -> bool:
    environ = proc.info.get("environ") or {}
    return bool(environ.get("JOBWARDEN_ATTEMPT_FOLDER") == str(folder))


def main() -> None:
    """Run the rounds and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--stray", action="store_true")
    parser.add_argument("--daemon", action="store_true")
    args = parser.parse_args()
    times, strays = [], 0
    with tempfile.TemporaryDirectory() as base:
        if args.daemon:
            times = through_daemon(Path(base), args.rounds, args.stray)
        for n in range(0 if args.daemon else args.rounds):
            ms, left = asyncio.run(one(Path(base) / str(n), args.stray))
            times.append(ms)
            strays += left
    times.sort()
    p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
    print(
        f"crash to {'next attempt' if args.daemon else 'attempt end'}: "
        f"median {statistics.median(times):.1f} ms, p95 {p95:.1f} ms, "
        f"max {times[-1]:.1f} ms over {args.rounds}"
        + ("" if args.daemon else f"; strays left {strays}")
    )


if __name__ == "__main__":
    main()
