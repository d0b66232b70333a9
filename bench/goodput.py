"""Goodput soak: a job SIGKILLed every S seconds under a real wardend, and where the time went.

A ``linreg`` job whose every update takes ``--update-s`` (``[faults]
step_delay_s``, every attempt) runs for about ``--minutes`` under
``[faults] crash_every_s = S`` (default 30): each attempt is SIGKILLed S
seconds after it is entered, wherever it is (mid-update, mid-commit).  The
daemon restarts it (the first restart of a streak is immediate, and an
attempt that ran ``restart_reset_after_s`` resets the streak), it resumes
from the newest checkpoint, replays and verifies.  Side by side, the same job
runs uninterrupted as a standalone worker without the delay, for its final
state hash.

Reported: the goodput and the badput by cause as the daemon computes it
(``wardenctl status JOB``), the number of attempts, and whether the final
state equals the uninterrupted run's.  Target: goodput >= 95 % over a
10-minute job with ``crash_every_s = 30``, final state equal.

Run with ``.venv/bin/python bench/goodput.py`` (``--minutes 2 --crash-every 15``
for a short look).  It prints a table and writes ``bench/results/goodput.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from figures import Figure, at_least, context, records, verdict

from jobwarden.control import harness
from jobwarden.worker.command import worker_argv

RESULTS = Path(__file__).parent / "results" / "goodput.json"
TARGET = 0.95


class SoakDaemon(harness.Wardend):
    """The soak's wardend: asked for the job's status once a second, so that a ten-minute
    soak's own polling does not load the machine whose goodput it measures."""

    start_timeout_s = 30.0
    poll_s = 1.0


def job_text(steps: int, every: int, faults: dict[str, Any] | None) -> str:
    """The soak's job file (faults None: the uninterrupted reference)."""
    run = {"steps": steps, "checkpoint_every": every, "keep_checkpoints": 2}
    if not faults:
        return harness.job_text("soak", run=run)
    return harness.job_text("soak", run=run, faults=faults)  # default supervision


def reference_hash(base: Path, steps: int, every: int, cache: Path) -> str:
    """The uninterrupted run's final state hash."""
    spec = base / "reference.toml"
    spec.write_text(job_text(steps, every, None))
    out = subprocess.run(
        worker_argv(spec, base / "reference-ck", cache),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    digest: str = next(e["state_hash"] for e in events if e["event"] == "completed")
    return digest


def soak(base: Path, text: str, cache: Path, timeout: float) -> dict[str, Any]:
    """Run the job under a fresh wardend until it settles; its detail status and incidents."""
    daemon = SoakDaemon(
        base / "root",
        cache,
        rescan_interval=None,
        stderr=base / "wardend.stderr",
        append_stderr=False,
    )
    try:
        daemon.start()
        daemon.drop("soak.toml", text)
        try:
            status = daemon.wait("soak", timeout=timeout)
        except TimeoutError:  # reported as it stands, short of the target
            status = daemon.status("soak") or {}
        incidents = daemon.ask("incidents", job="soak")
        final = daemon.events("soak", status["attempt"])
    finally:
        daemon.stop(timeout=60)
    done = [e for e in final if e["event"] == "completed"]
    return {
        "status": status,
        "incidents": incidents,
        "final_hash": done[0]["state_hash"] if done else None,
    }


def main() -> None:
    """Soak, print, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the job's work")
    parser.add_argument("--crash-every", type=float, default=30.0, help="crash_every_s")
    parser.add_argument("--update-s", type=float, default=0.1, help="seconds per update")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="updates per commit")
    args = parser.parse_args()
    steps = round(args.minutes * 60 / args.update_s)
    every = args.checkpoint_every
    faults = {
        "crash_every_s": args.crash_every,
        "step_delay_s": args.update_s,
        "every_attempt": True,
    }
    with tempfile.TemporaryDirectory(prefix="jobwarden-bench-") as temp:
        base = Path(temp)
        cache = base / "cache"
        expected = reference_hash(base, steps, every, cache)
        found = soak(base, job_text(steps, every, faults), cache, timeout=args.minutes * 180 + 120)
    status = found["status"]
    share = status["goodput"]
    equal = found["final_hash"] == expected
    crashes = [i for i in found["incidents"] if i["kind"] == "crash"]
    verified = sum(1 for i in crashes if i["status"] == "verified")
    print(f"job: linreg, {steps} updates of {args.update_s} s, commit every {every}, ")
    print(f"     crash_every_s = {args.crash_every:g}; state {status['state']}")
    print(f"attempts {status['attempt']}, crashes {len(crashes)} ({verified} verified)")
    print(f"final state equal to the uninterrupted run's: {'yes' if equal else 'NO'}")
    print(f"{'bucket':<14}{'seconds':>10}{'share':>9}")
    wall = share["wall_s"]
    print(f"{'productive':<14}{share['productive_s']:>10.2f}{share['productive_s'] / wall:>9.2%}")
    for name, seconds in share["badput_s"].items():
        print(f"{name:<14}{seconds:>10.2f}{seconds / wall:>9.2%}")
    outcome = "PASS" if share["goodput"] >= TARGET and equal else "FAIL"
    print(f"goodput {share['goodput']:.2%} of {wall:.1f} s (target >= {TARGET:.0%}): {outcome}")
    per_crash = [sum(i.get("cost_s", {}).values()) for i in crashes]
    if per_crash:
        print(f"median cost of a crash: {sorted(per_crash)[len(per_crash) // 2]:.2f} s")
    RESULTS.parent.mkdir(exist_ok=True)
    record = {
        "steps": steps,
        "update_s": args.update_s,
        "checkpoint_every": every,
        "crash_every_s": args.crash_every,
        "attempts": status["attempt"],
        "crashes": len(crashes),
        "verified": verified,
        "final_state_equal": equal,
        "goodput": share,
        "crash_costs_s": [i.get("cost_s", {}) for i in crashes],
        "target": TARGET,
        "pass": outcome == "PASS",
        "figures": records(
            [
                at_least(
                    f"linreg {args.minutes:g} min, crash_every_s = {args.crash_every:g}: goodput",
                    share["goodput"] * 100,
                    TARGET * 100,
                    ".2f",
                    " %",
                ),
                Figure(
                    "the same: final state equal to an uninterrupted run's",
                    "yes" if equal else "no",
                    "yes",
                    verdict(equal),
                ),
                context(f"the same: crashes, {verified} verified", len(crashes), "d"),
            ]
        ),
    }
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
