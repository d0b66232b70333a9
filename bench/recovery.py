"""Recovery benchmark: a SIGKILLed linreg worker to its first resumed update, three ways.

Each sample is one job on a real wardend (the default ``[supervision]``),
``steps = 400`` with ``[faults] step_delay_s = 0.05`` in attempt 1 only (so the
first attempt is still running when it is killed).  The bench reads attempt 1's
events and SIGKILLs its worker right after the progress event of update
`KILL_AT` (for the spare variant: once ``spare.ready`` is also logged); the
recovery time is the kill's ``time.time()`` to the ``time`` of the next
attempt's first progress event.  Variants, sampled in turn (side by side in
one run):

- *old policy, no spare*: ``--no-warm-spare``, and the bench kills attempt 2 as
  well right after its first progress, so the next restart is the second in a
  row and waits ``restart_backoff_s`` (0.5 s) first, as the old policy's first
  restart did; measured from that second kill;
- *new policy, no spare*: ``--no-warm-spare``, the first restart is immediate;
- *new policy, warm spare*: the default daemon;
- *digits, no spare*: the SDK example of examples/digits (Flax NNX and
  optax) as a command job, ``steps = 400``, the same delay and kill, on a
  daemon with ``--spare-memory-mb 0`` (no spares of programs): a cold start,
  the interpreter, JAX, Flax and optax imported, the data loaded, the update
  compiled (from the shared compilation cache);
- *digits, spare*: the same on a default daemon, killed once the job's spare
  (the program waiting at ``run.restore``, its update compiled through
  ``warmup=``) is ready: the target, p50 at most `TARGET_S`.  Before the kill
  the idle spare's rss (its process tree, from ``status``) and CPU (psutil,
  over `IDLE_WINDOW_S`) are read: what a spare costs while it waits.

- *2-process digits, no spares / spares*: the digits program with ``[run]
  processes = 2`` (each member a replica; member 0 holds the lock), on the
  same two daemons; member 1 is SIGKILLed after update 40 (the spare variant
  once both members' spares are ready), the restart-all starts both members
  again. Measured from the kill to the first progress of *every* member of
  the next attempt, and to the last member's ``started`` (the rejoin: the
  coordinator joined). A member's spare waits as the run is entered, before
  ``jax.distributed`` is joined (it must come before any JAX computation), so
  it saves the interpreter, the imports and the data but not the model's
  construction and compilation.
- *2-process dp_mlp, no spares / group spare*: the built-in ``dp_mlp`` task in
  2 processes, member 1 SIGKILLed, to the first progress of every member
  (`recovery_groups`): cold on ``--no-warm-spare``, handed to the job's group
  spare (both members joined, data built, update compiled) on the default.
- *digits under supervisord*: the digits program standalone under supervisord
  with ``autorestart`` (`recovery_supervisord`), killed after update 40.

The breakdown (p50): kill to ``attempt.exited`` (detection), to
``attempt.started`` (incident, backoff), to the worker's ``started`` event
(process start or handoff, lock), to ``ready`` (restore), to the first progress.

Run ``.venv/bin/python bench/recovery.py [--samples N] [--variants a,b]``; it
prints a table and writes ``bench/results/recovery.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from daemon import (
    Measure,
    Wardend,
    is_event,
    job_text,
    median,
    private_dir,
    running,
    stamp,
    table,
)
from figures import Figure, at_most, context, records
from recovery_groups import FLAGS as DP_FLAGS
from recovery_groups import KILL_AT, handed_records, kill_member_1, sample_dp, settled
from recovery_groups import NAMES as DP_NAMES
from recovery_groups import TARGETS_S as DP_TARGETS_S
from recovery_supervisord import FLAGS as SV_FLAGS
from recovery_supervisord import NAMES as SV_NAMES
from recovery_supervisord import sample_supervisord

RESULTS = Path(__file__).resolve().parent / "results" / "recovery.json"
TARGET_S = 0.3
JOB = {"run": {"steps": 400}, "faults": {"step_delay_s": 0.05}}
DIGITS = Path(__file__).resolve().parent.parent / "examples" / "digits"
IDLE_WINDOW_S = 2.0
TARGETS_S = {"spare": TARGET_S, "digits-spare": TARGET_S, "pair-spare": 1.0, **DP_TARGETS_S}
"""The p50 targets: 0.3 s for one process, 1 s for every member of a 2-process job."""
Record = dict[str, Any]


def wait_progress(daemon: Wardend, job: str, attempt: int, at_least: int, timeout: float) -> Record:
    """The first progress event of ``attempt`` at step ``at_least`` or later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in daemon.events(job, attempt):
            if e.get("event") == "progress" and e["step"] >= at_least:
                return e
        time.sleep(0.002)
    raise TimeoutError(f"{job}: attempt {attempt} reached no step {at_least}")


def kill_after(daemon: Wardend, job: str, attempt: int, step: int) -> float:
    """SIGKILL ``attempt``'s worker right after its progress of ``step``; the kill's time."""
    wait_progress(daemon, job, attempt, step, 120)
    started = next(e for e in daemon.events(job, attempt) if e.get("event") == "started")
    os.kill(started["pid"], signal.SIGKILL)
    return time.time()


def wait_spare(daemon: Wardend, timeout: float = 120) -> None:
    """Until a spare is ready and not yet handed out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        daemon.log.poll()
        count = {"spare.ready": 0, "spare.handed": 0}
        for r in daemon.log.records:
            if r.get("event") in count:
                count[r["event"]] += 1
        if count["spare.ready"] > count["spare.handed"]:
            return
        time.sleep(0.01)
    raise TimeoutError("no spare ready")


def wait_program_spare(daemon: Wardend, job: str, timeout: float = 120, count: int = 1) -> Record:
    """Until ``count`` of ``job``'s spares are ready; the first one's ``spare.ready`` record."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        daemon.log.poll()
        ready = [
            r for r in daemon.log.records if r.get("event") == "spare.ready" and r.get("job") == job
        ]
        if len(ready) >= count:
            return ready[0]
        time.sleep(0.01)
    raise TimeoutError(f"{job}: no spare ready")


def idle_cost(daemon: Wardend, job: str, pid: int) -> Record:
    """The waiting spare's rss (``status``) and its CPU share over `IDLE_WINDOW_S`."""
    proc = psutil.Process(pid)
    before = proc.cpu_times()
    time.sleep(IDLE_WINDOW_S)
    after = proc.cpu_times()
    used = (after.user + after.system) - (before.user + before.system)
    spare = daemon.ask("status", job=job).get("spare") or {}
    return {"idle_rss_mb": spare.get("rss_mb"), "idle_cpu_percent": 100 * used / IDLE_WINDOW_S}


def sample_pair(daemon: Wardend, job: str, variant: str) -> Record:
    """One 2-process digits job: member 1 killed after `KILL_AT`, every member's recovery."""
    daemon.drop(f"{job}.toml", digits_text(job, processes=2))
    if variant == "pair-spare":
        for _ in range(2):
            wait_program_spare(daemon, job, count=2)
    killed, firsts, joined = kill_member_1(daemon, job, time.monotonic() + 120)
    daemon.wait_for(daemon.log, settled(job), 120)
    handed = handed_records(daemon, job)
    return {
        "job": job,
        "recovery_s": max(firsts) - killed,
        "rejoin_s": max(joined) - killed,
        "spare": sum(h.get("attempt") == 2 for h in handed) == 2,
    }


def digits_text(job_id: str, processes: int = 1) -> str:
    """The digits example as a command job, with `JOB`'s sections."""
    lines = [
        f'id = "{job_id}"',
        f"command = {json.dumps([sys.executable, str(DIGITS / 'train.py')])}",
        f"workdir = {json.dumps(str(DIGITS))}",
        "sdk = true",
        "[run]",
        "steps = 400",
        "checkpoint_every = 10",
        f"processes = {processes}",
        "[faults]",
        "step_delay_s = 0.05",
        "[supervision]",
        "stall_timeout_s = 60",
    ]
    return "\n".join(lines) + "\n"


def sample(daemon: Wardend, job: str, variant: str) -> Record:
    """One job of ``variant``: its kill(s) and the timeline of the measured recovery."""
    digits = variant.startswith("digits")
    daemon.drop(f"{job}.toml", digits_text(job) if digits else job_text(job, JOB))
    cost: Record = {}
    if variant == "spare":
        wait_spare(daemon)
    if variant == "digits-spare":
        cost = idle_cost(daemon, job, wait_program_spare(daemon, job)["pid"])
    killed = kill_after(daemon, job, 1, KILL_AT)
    measured = 2
    if variant == "old":
        wait_progress(daemon, job, 2, 1, 120)
        killed = kill_after(daemon, job, 2, 1)
        measured = 3
    first = wait_progress(daemon, job, measured, 1, 120)
    exited = daemon.wait_for(daemon.log, is_event("attempt.exited", job=job, attempt=measured - 1))
    started = daemon.wait_for(daemon.log, is_event("attempt.started", job=job, attempt=measured))
    daemon.wait_for(daemon.log, settled(job), 120)
    resumed = daemon.events(job, measured)
    kinds = {e["event"]: e["time"] for e in reversed(resumed)}
    handed = handed_records(daemon, job)
    return {
        "job": job,
        "recovery_s": first["time"] - killed,
        "detect_s": stamp(exited) - killed,
        "to_attempt_started_s": stamp(started) - stamp(exited),
        "to_worker_started_s": kinds["started"] - stamp(started),
        "restore_s": kinds["ready"] - kinds["started"],
        "ready_to_progress_s": first["time"] - kinds["ready"],
        "spare": any(h.get("attempt") == measured for h in handed),
        **cost,
    }


NAMES = {
    "old": "recovery: old policy (0.5 s backoff first), no spare",
    "cold": "recovery: new policy (first restart at once), no spare",
    "spare": "recovery: new policy + warm spare (default)",
    "digits-cold": "recovery: digits example (SDK, Flax), no spare",
    "digits-spare": "recovery: digits example (SDK, Flax), spare (default)",
    "pair-cold": "recovery: 2-process digits, every member, no spares",
    "pair-spare": "recovery: 2-process digits, every member, a spare each (default)",
    **DP_NAMES,
    **SV_NAMES,
}
FLAGS = {
    "old": ("--no-warm-spare",),
    "cold": ("--no-warm-spare",),
    "spare": (),
    "digits-cold": ("--spare-memory-mb", "0"),
    "digits-spare": (),
    "pair-cold": ("--spare-memory-mb", "0"),
    "pair-spare": (),
    **DP_FLAGS,
    **SV_FLAGS,
}


def sampler(variant: str) -> Any:
    """The function that samples ``variant``."""
    if variant.startswith("dp"):
        return sample_dp
    if variant == "digits-supervisord":
        return sample_supervisord
    return sample_pair if variant.startswith("pair") else sample


def main(argv: list[str] | None = None) -> int:
    """Sample the three variants in turn, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--variants", default=",".join(NAMES), help="comma-separated")
    args = parser.parse_args(argv)
    chosen = [v for v in NAMES if v in args.variants.split(",")]
    base = Path(tempfile.mkdtemp(prefix="jw-recovery-"))
    runs: dict[str, list[Record]] = {v: [] for v in chosen}
    try:
        cache = private_dir(base / "cache")
        with contextlib.ExitStack() as stack:
            daemons = {v: stack.enter_context(running(base / v, cache, *FLAGS[v])) for v in chosen}
            for v, d in daemons.items():  # warm the compile cache and start the spare
                sampler(v)(d, f"warmup-{v}", v)
            for i in range(args.samples):
                for v, d in daemons.items():
                    one = sampler(v)
                    runs[v].append(one(d, f"{v}-{i:02d}", v))
                    print(f"{v} {i}: {runs[v][-1]['recovery_s']:.3f} s", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    measures = []
    for v in chosen:
        name, rows = NAMES[v], runs[v]
        keys = [k for k in rows[0] if k.endswith("_s") and k != "recovery_s"]
        costs = {k: median([r[k] for r in rows]) for k in rows[0] if k.startswith("idle_")}
        measures.append(
            Measure(
                name,
                [r["recovery_s"] for r in rows],
                unit="s",
                target_s=TARGETS_S.get(v),
                target_on="p50",
                note="SIGKILL after update 40 -> first progress of the next attempt",
                extra={
                    "breakdown_p50_s": {k: median([r[k] for r in rows]) for k in keys},
                    "handed_to_spare": sum(r["spare"] for r in rows),
                    **({"idle_spare_p50": costs} if costs else {}),
                    "runs": rows,
                },
            )
        )
    print()
    print(table(measures))
    p50 = {v: m.stat("p50") or 0.0 for v, m in zip(chosen, measures, strict=True)}
    ratios = {}
    for over, under in (
        ("spare", "old"),
        ("digits-spare", "digits-cold"),
        ("pair-spare", "pair-cold"),
        ("dp-spare", "dp-cold"),
        ("digits-spare", "digits-supervisord"),
    ):
        if over in p50 and under in p50:
            ratios[f"{over}/{under}"] = p50[over] / p50[under]
            print(f"\nratio {over}/{under} p50: {ratios[f'{over}/{under}']:.3f}")
    idle = runs.get("digits-spare", [])
    if idle:
        rss = median([r["idle_rss_mb"] for r in idle if r.get("idle_rss_mb")])
        cpu = median([r["idle_cpu_percent"] for r in idle])
        print(f"idle digits spare: rss {rss:.0f} MB, cpu {cpu:.2f} % (p50)")
    for m in measures:
        print(f"  {m.name}: handed to a spare {m.extra['handed_to_spare']}/{len(m.samples)}")
        print("    " + "  ".join(f"{k} {v:.3f}" for k, v in m.extra["breakdown_p50_s"].items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "recovery",
        "created": time.time(),
        "samples": args.samples,
        "cpus": os.cpu_count(),
        "ratios_p50": ratios,
        "measures": [m.as_record() for m in measures],
        "figures": records(figures(measures)),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {os.path.relpath(args.out)}")
    return 0


def figures(measures: list[Measure]) -> list[Figure]:
    """The summary's rows: the spare's p50 against its target, the others beside it."""
    out = []
    for m in measures:
        p50 = m.stat("p50")
        assert p50 is not None
        name = f"{m.name.removeprefix('recovery: ')}, SIGKILL to first resumed progress, p50"
        label = name if "digits" in m.name or "dp_mlp" in m.name else f"linreg, {name}"
        if m.target_s is not None:
            out.append(at_most(label, p50, m.target_s, ".3f", " s"))
        else:
            out.append(context(label, p50, ".3f", " s"))
    return out


if __name__ == "__main__":
    sys.exit(main())
