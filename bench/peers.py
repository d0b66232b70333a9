"""jobwarden against supervisord, in one run: the same worker, job and kills under each.

The worker is ``python -m jobwarden.worker --job FILE --checkpoint-dir DIR``,
which resumes by itself from the newest accepted checkpoint.  Under supervisord
(the ``bench`` extra) it is one ``[program]`` with ``autorestart=true`` and
``startsecs=0``; under wardend it is the same job file submitted to the spool
(default settings: the restart policy and the warm spare).  The job is linreg
with ``steps`` raised so it is still running when killed; the bench SIGKILLs the
worker (its pid from its ``started`` event) right after the progress event of
update `KILL_AT`, and times the kill's ``time.time()`` to the first progress
event of the next worker (the events' own ``time``).  Under wardend the bench
also waits, before that update, for a warm spare to be ready (recorded).

Reported: recovery p50 over ``--trials`` (default 5) each, the ratio, whether
each resumed run was verified (wardend's incident verdict; supervisord checks
nothing), and the wall time of one job killed after updates `THREE_KILLS`, from
start to its ``completed`` event.

Run ``.venv/bin/python bench/peers.py``; it prints a table and writes
``bench/results/peers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from daemon import Wardend, job_text, median, private_dir, running
from figures import Figure, at_most, context, records
from recovery import wait_spare
from supervisord import Stream, Supervisord

from jobwarden.worker.command import worker_argv

RESULTS = Path(__file__).resolve().parent / "results" / "peers.json"
KILL_AT = 1500
STEPS = 2500
THREE_KILLS = (1500, 3000, 4500)
THREE_STEPS = 6000
TARGET_RATIO = 0.25
Record = dict[str, Any]


def job_file(folder: Path, job: str, steps: int) -> Path:
    """A linreg job file with ``steps``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job}.toml"
    path.write_text(job_text(job, {"run": {"steps": steps}}))
    return path


def wardend_stream(daemon: Wardend, job: str) -> Stream:
    """Every attempt's events of ``job``."""
    return Stream(lambda: sorted((daemon.root / "jobs" / job / "attempts").glob("*/events.jsonl")))


def wardend_verdicts(daemon: Wardend, job: str) -> list[str]:
    """The final status of each incident of ``job``."""
    daemon.incidents.poll()
    final: dict[str, str] = {}
    for r in daemon.incidents.records:
        if r.get("job") == job and r.get("status"):
            final[r["incident"]] = r["status"]
    return list(final.values())


def wait_settled(daemon: Wardend, job: str) -> None:
    """Until the job rests."""
    daemon.wait_for(
        daemon.log,
        lambda r: (
            r.get("event") == "job.transition"
            and r.get("job") == job
            and r.get("to") in ("completed", "failed", "escalated")
        ),
        300,
    )


def run_wardend(base: Path, cache: Path, trials: int) -> Record:
    """Recovery trials and the three-kill job under one wardend."""
    recoveries: list[float] = []
    verdicts: list[list[str]] = []
    with running(base / "wardend", cache) as daemon:
        for i in range(-1, trials):
            job = f"peer-{i + 1:02d}" if i >= 0 else "warmup"
            daemon.drop(f"{job}.toml", job_file(base / "jobs", job, STEPS).read_text())
            stream = wardend_stream(daemon, job)
            killed = stream.kill_after(KILL_AT, lambda: wait_spare(daemon))
            resumed = stream.resumed_after(killed)
            wait_settled(daemon, job)
            if i >= 0:
                recoveries.append(resumed["time"] - killed)
                verdicts.append(wardend_verdicts(daemon, job))
        began = time.time()
        daemon.drop("three.toml", job_file(base / "jobs", "three", THREE_STEPS).read_text())
        stream = wardend_stream(daemon, "three")
        for step in THREE_KILLS:
            killed = stream.kill_after(step)
            stream.resumed_after(killed)
        done = stream.wait(lambda e: e.get("event") == "completed", 300)
        wait_settled(daemon, "three")
        three = {"wall_s": done["time"] - began, "verdicts": wardend_verdicts(daemon, "three")}
    return {"recovery_s": recoveries, "verdicts": verdicts, "three": three}


def run_supervisord(base: Path, cache: Path, trials: int) -> Record:
    """Recovery trials and the three-kill job, each under its own supervisord."""
    recoveries = []
    for i in range(trials):
        folder = base / f"supervisord-{i:02d}"
        job = job_file(folder, f"peer-{i:02d}", STEPS)
        sup = Supervisord(folder, worker_argv(job, folder / "checkpoints", cache))
        try:
            killed = sup.stream.kill_after(KILL_AT)
            recoveries.append(sup.stream.resumed_after(killed)["time"] - killed)
        finally:
            sup.stop()
    folder = base / "supervisord-three"
    job = job_file(folder, "three", THREE_STEPS)
    sup = Supervisord(folder, worker_argv(job, folder / "checkpoints", cache))
    try:
        for step in THREE_KILLS:
            killed = sup.stream.kill_after(step)
            sup.stream.resumed_after(killed)
        done = sup.stream.wait(lambda e: e.get("event") == "completed", 300)
        three = {"wall_s": done["time"] - sup.began, "verdicts": ["none: no check"] * 3}
    finally:
        sup.stop()
    return {"recovery_s": recoveries, "verdicts": [["none: no check"]] * trials, "three": three}


def main(argv: list[str] | None = None) -> int:
    """Both supervisors, the table, the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="jw-peers-"))
    try:
        cache = private_dir(base / "cache")
        ours = run_wardend(base, cache, args.trials)
        theirs = run_supervisord(base, cache, args.trials)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    p50_ours, p50_theirs = median(ours["recovery_s"]), median(theirs["recovery_s"])
    assert p50_ours is not None
    assert p50_theirs is not None
    ratio = p50_ours / p50_theirs
    verified = sum(v == ["verified"] for v in ours["verdicts"])
    rows = [
        ("measure", "wardend", "supervisord", "target", "result"),
        (
            f"recovery p50, SIGKILL after update {KILL_AT} -> first resumed progress",
            f"{p50_ours:.3f} s",
            f"{p50_theirs:.3f} s",
            "",
            "",
        ),
        (
            "ratio wardend / supervisord",
            f"{ratio:.3f}",
            "",
            f"<= {TARGET_RATIO}",
            "PASS" if ratio <= TARGET_RATIO else "FAIL",
        ),
        (
            "resumed runs verified",
            f"{verified}/{len(ours['verdicts'])}",
            "0 (never checked)",
            "",
            "",
        ),
        (
            f"wall time, {THREE_STEPS} updates, 3 kills",
            f"{ours['three']['wall_s']:.2f} s",
            f"{theirs['three']['wall_s']:.2f} s",
            "",
            "",
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if n == 0:
            print("-" * (sum(widths) + 8))
    result = {
        "benchmark": "peers",
        "created": time.time(),
        "trials": args.trials,
        "kill_at": KILL_AT,
        "steps": STEPS,
        "wardend": ours,
        "supervisord": theirs,
        "recovery_p50_s": {"wardend": p50_ours, "supervisord": p50_theirs},
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "verdict": "PASS" if ratio <= TARGET_RATIO else "FAIL",
        "figures": records(
            [
                at_most("recovery p50, wardend / supervisord", ratio, TARGET_RATIO, ".3f"),
                context("recovery p50, wardend", p50_ours, ".3f", " s"),
                context("recovery p50, supervisord", p50_theirs, ".3f", " s"),
                Figure(
                    "resumed runs verified, wardend / supervisord",
                    f"{verified} of {len(ours['verdicts'])} / none",
                ),
                context(
                    f"wall time, {THREE_STEPS} updates and 3 kills, wardend",
                    ours["three"]["wall_s"],
                    ".2f",
                    " s",
                ),
                context(
                    f"wall time, {THREE_STEPS} updates and 3 kills, supervisord",
                    theirs["three"]["wall_s"],
                    ".2f",
                    " s",
                ),
            ]
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
