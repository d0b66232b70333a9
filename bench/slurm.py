"""Slurm against the local launcher: submission to first progress, and crash recovery.

On this box's single-node Slurm (tests/slurm/cluster.py brings it up, as the
tests do), a real wardend runs the lesson's linreg job with ``fail_after = 3``
under each launcher, ``--repeats`` times, in the same run.  From the daemon's
log and the attempts' evidence it takes, per run:

* ``first progress``: the job file's drop to attempt 1's first ``progress``;
* ``queue``: sbatch's return to the job leaving the queue (Slurm only);
* ``step launch``: leaving the queue (local: the spawn) to the worker's
  ``started`` event, i.e. srun, slurmstepd and the interpreter;
* ``JAX start``: ``started`` to the first ``progress`` (import, restore, compile);
* ``recovery``: attempt 1's ``failed`` event to attempt 2's first ``progress``.

    .venv/bin/python bench/slurm.py [--repeats 3]

Prints a table (medians) and writes ``bench/results/slurm.json``.  Runs as root
(slurmd); installs Slurm's Debian packages when they are missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import context, records

from tests.daemon import Daemon, linreg_job
from tests.slurm.cluster import Cluster, ensure_installed

RESULTS = Path(__file__).resolve().parent / "results" / "slurm.json"


def events(folder: Path) -> list[dict[str, Any]]:
    """One attempt's parsed events."""
    return [json.loads(x) for x in (folder / "events.jsonl").read_text().splitlines() if x]


def first(found: list[dict[str, Any]], kind: str) -> float:
    """The time of the first event of ``kind``."""
    return float(next(e["time"] for e in found if e["event"] == kind))


def log_time(root: Path, event: str, attempt: int) -> float | None:
    """The wall time of the daemon's log line ``event`` about ``attempt``'s Slurm job."""
    folder = root / "jobs" / "b" / "attempts" / str(attempt) / "slurm.json"
    if not folder.exists():
        return None
    slurm_job = json.loads(folder.read_text())["slurm_job"]
    for line in (root / "wardend.log").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == event and record.get("slurm_job") == slurm_job:
            return float(record["time"])
    return None


def one_run(base: Path, cache: Path, launcher: str) -> dict[str, float]:
    """One crash-and-recover run of the job under ``launcher``."""
    with Daemon(base / "root", cache, "--launcher", launcher) as daemon:
        dropped = time.time()
        daemon.drop("b.toml", linreg_job("b", faults={"fail_after": 3}))
        status = daemon.wait("b", timeout=180)
    assert status["state"] == "completed", status
    attempts = base / "root" / "jobs" / "b" / "attempts"
    one, two = events(attempts / "1"), events(attempts / "2")
    started = log_time(base / "root", "slurm.started", 1)
    submitted = log_time(base / "root", "slurm.submitted", 1)
    row = {
        "first_progress_s": first(one, "progress") - dropped,
        "step_launch_s": first(one, "started") - (started or dropped),
        "jax_start_s": first(one, "progress") - first(one, "started"),
        "recovery_s": first(two, "progress") - first(one, "failed"),
    }
    if started is not None and submitted is not None:
        row["queue_s"] = started - submitted
    return row


def main() -> int:
    """Run both launchers, print the medians, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    ensure_installed(work / "install.lock")
    cluster = Cluster().start()
    runs: dict[str, list[dict[str, float]]] = {"local": [], "slurm": []}
    try:
        import os

        os.environ["SLURM_CONF"] = str(cluster.conf)
        cache = work / "cache"
        for n in range(args.repeats):
            for launcher in ("local", "slurm"):
                runs[launcher].append(one_run(work / f"{launcher}-{n}", cache, launcher))
    finally:
        cluster.stop()
    keys = ["first_progress_s", "queue_s", "step_launch_s", "jax_start_s", "recovery_s"]
    medians = {
        name: {k: round(statistics.median(r[k] for r in rows), 3) for k in keys if k in rows[0]}
        for name, rows in runs.items()
    }
    print(f"{'launcher':10}" + "".join(f"{k.removesuffix('_s'):>16}" for k in keys))
    for name, row in medians.items():
        print(f"{name:10}" + "".join(f"{row.get(k, float('nan')):>16.3f}" for k in keys))
    extra = medians["slurm"]["recovery_s"] - medians["local"]["recovery_s"]
    print(
        f"Slurm adds {extra:.3f} s to a recovery (median of {args.repeats}); "
        f"cluster bring-up {cluster.started_s:.2f} s"
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "repeats": args.repeats,
                "medians_s": medians,
                "runs": runs,
                "bring_up_s": round(cluster.started_s, 3),
                "figures": records(
                    [
                        *(
                            context(
                                f"recovery, {name} launcher, median", row["recovery_s"], ".3f", " s"
                            )
                            for name, row in medians.items()
                        ),
                        context("Slurm's added recovery time", extra, ".3f", " s"),
                    ]
                ),
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
