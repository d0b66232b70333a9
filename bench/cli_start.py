"""The command-line client's start: ``wardenctl status`` against ``supervisorctl status``.

Starts a real wardend on a temporary root with one job known (a short linreg
job, run to completion), and a real supervisord with one program (``sleep``),
each on its own Unix socket.  Then, ``--samples`` rounds, each running once,
in a shuffled order, as whole processes of this interpreter's virtualenv:

* ``wardenctl status`` (the console script, as a user types it);
* ``supervisorctl status`` (supervisor's console script, one program known);
* ``wardenctl version`` (the same start, no table);
* ``python -c pass`` (the interpreter's own start, the floor).

The ratio is taken round by round (``wardenctl`` over ``supervisorctl`` of the
same round) and its median reported beside the medians of each command, so
that load shared by both in a round cancels.  Target: ``wardenctl status`` at
most 0.5x ``supervisorctl status``.  ``python -X importtime -m
jobwarden.control.cli status`` shows what a command's start imports.  Prints a
table and writes ``bench/results/cli_start.json``.

    .venv/bin/python bench/cli_start.py [--samples N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures import at_most, context, records

from jobwarden.control import harness

TARGET_RATIO = 0.5
SUPERVISOR_CONF = """\
[unix_http_server]
file = {folder}/supervisor.sock

[supervisord]
logfile = {folder}/supervisord.log
pidfile = {folder}/supervisord.pid
nodaemon = true

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl = unix://{folder}/supervisor.sock

[program:sleeper]
command = sleep 3600
"""


def script(name: str) -> str:
    """A console script of this interpreter's virtualenv."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise SystemExit(f"no {name} beside {sys.executable}: pip install -e '.[bench]'")
    return str(path)


def start_supervisord(folder: Path) -> subprocess.Popen[bytes]:
    """supervisord with one program, answering on its socket, its program running."""
    conf = folder / "supervisord.conf"
    conf.write_text(SUPERVISOR_CONF.format(folder=folder))
    process = subprocess.Popen(
        [script("supervisord"), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = subprocess.run(
            [script("supervisorctl"), "-c", str(conf), "status"],
            capture_output=True,
            check=False,
        )
        if b"RUNNING" in done.stdout:
            return process
        time.sleep(0.2)
    process.kill()
    raise SystemExit("supervisord did not start its program in 30 s")


def installed_env(tree: Path | None = None) -> dict[str, str]:
    """This environment with byte-code caches written and read, as an installed package has
    them (supervisor's were compiled at install): a start that compiles its sources each
    time would measure the compiler, not the imports.  ``tree``: import jobwarden from
    there (another checkout, for a before-and-after in one run)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Seconds one whole process takes, its output read and dropped."""
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False, timeout=60, env=env)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{argv} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return elapsed


Commands = dict[str, tuple[list[str], dict[str, str]]]


def rounds(commands: Commands, samples: int) -> dict[str, list[float]]:
    """Each command once per round, in a shuffled order; name -> seconds, round by round."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for argv, env in commands.values():  # warm the page cache, write the byte-code caches
        timed(argv, env)
    shuffler = random.Random(0)
    for _ in range(samples):
        names = list(commands)
        shuffler.shuffle(names)
        for name in names:
            times[name].append(timed(*commands[name]))
    return times


def main() -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="TREE",
        help="also time wardenctl status importing jobwarden from TREE (an older checkout)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "cli_start.json"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="jobwarden-bench-cli-"))
    daemon = harness.Wardend(base / "root", None, rescan_interval=None)
    supervisord = None
    try:
        daemon.start(timeout=30)
        daemon.drop("one.toml", harness.job_text("one", run={"steps": 5}))
        daemon.wait("one", timeout=120)
        supervisord = start_supervisord(base)
        wardenctl = [script("wardenctl"), "--socket", str(daemon.socket)]
        env = installed_env()
        supervisorctl = [script("supervisorctl"), "-c", str(base / "supervisord.conf")]
        commands: Commands = {
            "wardenctl status": ([*wardenctl, "status"], env),
            "supervisorctl status": ([*supervisorctl, "status"], env),
            "wardenctl version": ([*wardenctl, "version"], env),
            "python -c pass": ([sys.executable, "-c", "pass"], env),
        }
        if args.compare is not None:
            commands["wardenctl status, TREE"] = (
                [*wardenctl, "status"],
                installed_env(args.compare),
            )
        times = rounds(commands, args.samples)
    finally:
        if supervisord is not None:
            supervisord.terminate()
            supervisord.wait(timeout=30)
        daemon.stop(timeout=60)
        shutil.rmtree(base, ignore_errors=True)
    ratios = [
        ours / theirs
        for ours, theirs in zip(
            times["wardenctl status"], times["supervisorctl status"], strict=True
        )
    ]
    ratio = statistics.median(ratios)
    print(
        f"whole-process start, {args.samples} rounds, each command once per round in a "
        "shuffled order; one job known to wardend, one program to supervisord"
    )
    print(f"{'command':<26}{'median ms':>10}{'min ms':>9}{'max ms':>9}")
    rows: list[dict[str, Any]] = []
    for name, found in times.items():
        row = {
            "command": name,
            "samples": len(found),
            "median_ms": statistics.median(found) * 1000,
            "min_ms": min(found) * 1000,
            "max_ms": max(found) * 1000,
        }
        rows.append(row)
        print(f"{name:<26}{row['median_ms']:>10.1f}{row['min_ms']:>9.1f}{row['max_ms']:>9.1f}")
    print(
        f"wardenctl status / supervisorctl status, median of the rounds' ratios: {ratio:.2f} "
        f"(target <= {TARGET_RATIO:g}: {'PASS' if ratio <= TARGET_RATIO else 'FAIL'})"
    )
    medians = {row["command"]: row["median_ms"] for row in rows}
    figures = [
        at_most("wardenctl status / supervisorctl status", ratio, TARGET_RATIO, ".2f", "x"),
        context("wardenctl status, median", medians["wardenctl status"], ".0f", " ms"),
        context("supervisorctl status, median", medians["supervisorctl status"], ".0f", " ms"),
        context("python -c pass, median", medians["python -c pass"], ".0f", " ms"),
    ]
    if args.compare is not None:
        figures.append(
            context(
                "wardenctl status, TREE, median", medians["wardenctl status, TREE"], ".0f", " ms"
            )
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "samples": args.samples,
        "ratio_median": ratio,
        "rows": rows,
        "figures": records(figures),
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
