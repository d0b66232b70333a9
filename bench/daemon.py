"""Daemon benchmark: a real wardend on a temporary root, timed from its own records.

Every measure starts a real ``python -m jobwarden.daemon`` (``--rescan-interval 1``,
as the tests run it) and drives it the way users do, by dropping job files
Maildir-style (write in ``spool/tmp``, rename into ``spool/incoming``).  Times
come from the records the daemon writes anyway: the ISO ``timestamp`` of its
structlog lines in ``ROOT/wardend.log`` and ``ROOT/incidents.jsonl``, and the
wall-clock ``time`` of worker events in ``jobs/<id>/attempts/<n>/events.jsonl``.
All clocks are this machine's wall clock.  Samples run one at a time, so the
two cores are never shared by two measured jobs.

1. Intake: with ``--max-concurrent 1`` and a first job that stalls for 600 s
   right after ``ready`` (so no later job's worker ever starts), N small valid
   jobs are renamed into ``spool/incoming`` 20 ms apart; the latency is
   ``time.time()`` right after ``os.rename`` to the ``job.queued`` log line,
   which the daemon writes after ``state.json`` is persisted.  Two diagnostic
   rows write the files directly in ``spool/incoming`` instead (the watcher's
   close-after-write path), 0.6 s apart and then 20 ms apart, to tell the
   watcher's latency from the rescan's.
2. Worker exit to incident: jobs with ``[faults] crash_after = 1`` (SIGKILL right
   after the progress event of update 1) and ``max_restarts = 0``.  The bench
   opens a pidfd on the worker (pid from ``attempt.started``) and notes when it
   becomes readable (the real exit); "noticed" is the ``attempt.exited`` log
   line and "written" the ``incident.detected`` record of ``incidents.jsonl``.
   Rows: noticed -> written, exit -> written, last progress event -> written.
3. Stall overshoot: ``stall_at = 2``, ``stall_seconds = 30``, ``stall_timeout_s = 1``;
   the daemon records ``details.overshoot_s`` (timer lateness past the timeout)
   in the incident.  A cross-check uses the stack dump the daemon requests on
   detection (SIGUSR1): the mtime of the worker's ``stderr.log`` minus (the last
   ready/progress/checkpoint event's ``time`` + the timeout).  File times come
   from the kernel's coarse clock (one tick), so the check is only good to a tick.
4. Recovery: ``fail_after = 3`` with the default ``restart_backoff_s`` (0.5 s);
   recovery time is the failed attempt's last progress event to the first
   progress event of attempt 2, split into detection, backoff (``recovering``
   transition to ``attempt.started``), spawn to ``ready``, and the first update.
   Variants: one daemon on a pre-warmed ``--compile-cache``; a fresh daemon with
   an empty cache per job (attempt 1 fills it before attempt 2 starts); and a
   fresh daemon whose cache the bench empties during the backoff (a truly cold
   restart).  Side by side, a standalone ``python -m jobwarden.worker`` from
   process start to its first progress event, with an empty and a warm cache.

Run with ``make bench`` or ``.venv/bin/python bench/daemon.py`` (``--quick`` for
fewer samples, ``--samples N`` to use N samples for every measure, ``--only intake,crash``
to run some measures only, ``--keep`` to keep the temporary roots).  It prints a table and writes
``bench/results/daemon.json``.  The daemon and the records it writes are read through
bench/daemon_records.py (the package's harness, `jobwarden.control.harness`), the rows
and the table are bench/daemon_table.py's, and measure 4 is bench/daemon_recovery.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from daemon_records import (
    RESCAN_INTERVAL_S,
    SETTLED_STATES,
    Wardend,
    is_event,
    job_text,
    last_time,
    private_dir,
    read_events,
    running,
    stamp,
    transition_to,
    wait_exit,
)
from daemon_recovery import bench_recovery, bench_worker, worker_sample
from daemon_table import Measure, fmt, measure_figures, median, table
from figures import records

# What bench/recovery.py and bench/peers.py import from here (kept where they always were).
__all__ = [
    "Measure",
    "Wardend",
    "is_event",
    "job_text",
    "median",
    "private_dir",
    "read_events",
    "running",
    "stamp",
    "table",
]

RESULTS = Path(__file__).resolve().parent / "results" / "daemon.json"
DROP_SPACING_S = 0.02
ISOLATED_SPACING_S = 0.6
SETTLE_S = 1.5  # before each intake round: let events the watcher still holds drain
DEFAULT_BACKOFF_S = 0.5
ALIVE_EVENTS = ("ready", "progress", "checkpoint")
HOLD_JOB = {
    "faults": {"stall_at": 0, "stall_seconds": 600},
    "supervision": {"stall_timeout_s": 600, "startup_timeout_s": 600, "stop_grace_s": 1},
}
CRASH_JOB = {"faults": {"crash_after": 1}, "supervision": {"max_restarts": 0}}
MEASURES = ("worker", "intake", "crash", "stall", "recovery")
"""the measures, in the order they run (``--only`` picks some)"""
STALL_JOB = {
    "faults": {"stall_at": 2, "stall_seconds": 30},
    "supervision": {"stall_timeout_s": 1, "max_restarts": 0, "stop_grace_s": 1},
}


# ---- 1. intake


def intake_round(
    daemon: Wardend, label: str, submit: Callable[[str, str], float], n: int, spacing_s: float
) -> tuple[list[float], list[float], int]:
    """Submit ``n`` jobs ``spacing_s`` apart; latencies to job.queued, submitted -> queued,
    and how many never arrived."""
    time.sleep(SETTLE_S)
    sent: dict[str, float] = {}
    for i in range(n):
        job_id = f"intake-{label}-{i:04d}"
        sent[job_id] = submit(f"{job_id}.toml", job_text(job_id))
        time.sleep(spacing_s)
    queued: dict[str, float] = {}
    deadline = time.monotonic() + 30
    while len(queued) < n and time.monotonic() < deadline:
        time.sleep(0.05)
        daemon.log.poll()
        queued = {
            r["job"]: stamp(r)
            for r in daemon.log.records
            if r.get("event") == "job.queued" and r.get("job") in sent
        }
    persist = []
    for job_id, at in queued.items():
        state = json.loads((daemon.root / "jobs" / job_id / "state.json").read_text())
        persist.append(at - state["submitted"])
    return [at - sent[job_id] for job_id, at in queued.items()], persist, n - len(queued)


def bench_intake(base: Path, cache: Path, n: int) -> list[Measure]:
    """Rename -> job.queued, and the same through a direct write in incoming."""
    with running(base / "intake", cache, "--max-concurrent", "1") as daemon:
        daemon.drop("hold.toml", job_text("hold", HOLD_JOB))
        daemon.wait_for(daemon.log, transition_to("hold", "running"), 180)
        renamed, renamed_persist, renamed_missing = intake_round(
            daemon, "rename", daemon.drop_timed, n, DROP_SPACING_S
        )
        alone, _, alone_missing = intake_round(
            daemon, "alone", daemon.write_incoming, max(2, min(20, n // 10)), ISOLATED_SPACING_S
        )
        written, _, written_missing = intake_round(
            daemon, "write", daemon.write_incoming, n, DROP_SPACING_S
        )
    return [
        Measure(
            "intake: rename -> job.queued",
            renamed,
            target_s=0.015,
            note="time.time() after os.rename into spool/incoming to the job.queued log line",
            extra={
                "missing": renamed_missing,
                "submitted_to_queued_p50_s": median(renamed_persist),
                "rescan_interval_s": RESCAN_INTERVAL_S,
            },
        ),
        Measure(
            "intake diag: write in incoming, 20 ms apart",
            written,
            note="written directly in spool/incoming: the watcher's close-after-write path",
            extra={"missing": written_missing},
        ),
        Measure(
            "intake diag: write in incoming, 0.6 s apart",
            alone,
            note="the same, spaced past watchdog's 0.5 s hold of unpaired IN_MOVED_FROM events",
            extra={"missing": alone_missing},
        ),
    ]


# ---- 2. worker exit -> incident


def bench_crash(base: Path, cache: Path, n: int) -> list[Measure]:
    """crash_after = 1: exit, noticed (attempt.exited), written (incident.detected)."""
    noticed_written, exit_written, progress_written, exit_noticed = [], [], [], []
    with running(base / "crash", cache) as daemon:
        for i in range(n):
            job_id = f"crash-{i:03d}"
            daemon.drop(f"{job_id}.toml", job_text(job_id, CRASH_JOB))
            started = daemon.wait_for(daemon.log, is_event("attempt.started", job=job_id), 180)
            exited_at = wait_exit(started["pid"], 180)
            exited = daemon.wait_for(daemon.log, is_event("attempt.exited", job=job_id))
            incident = daemon.wait_for(daemon.incidents, is_event("incident.detected", job=job_id))
            daemon.wait_for(daemon.log, transition_to(job_id, *SETTLED_STATES))
            written = stamp(incident)
            last_progress = last_time(daemon.events(job_id, 1), ("progress",))
            noticed_written.append(written - stamp(exited))
            if last_progress is not None:
                progress_written.append(written - last_progress)
            if exited_at is not None:
                exit_written.append(written - exited_at)
                exit_noticed.append(stamp(exited) - exited_at)
    return [
        Measure(
            "crash: attempt.exited -> incident written",
            noticed_written,
            target_s=0.020,
            note="attempt.exited log line to the incident.detected record",
        ),
        Measure(
            "crash: worker exit (pidfd) -> incident written",
            exit_written,
            target_s=0.020,
            note="pidfd readable in the bench to the incident.detected record",
            extra={"exit_to_noticed_p50_s": median(exit_noticed)},
        ),
        Measure(
            "crash: last progress event -> incident written",
            progress_written,
            target_s=0.020,
            note="upper bound: includes the worker's own SIGKILL and exit",
        ),
    ]


# ---- 3. stall overshoot


def bench_stall(base: Path, cache: Path, n: int) -> list[Measure]:
    """stall_at = 2 under stall_timeout_s = 1: the daemon's recorded overshoot."""
    overshoot, end_to_end, gaps = [], [], []
    with running(base / "stall", cache) as daemon:
        for i in range(n):
            job_id = f"stall-{i:03d}"
            daemon.drop(f"{job_id}.toml", job_text(job_id, STALL_JOB))
            incident = daemon.wait_for(
                daemon.incidents, is_event("incident.detected", job=job_id), 180
            )
            daemon.wait_for(daemon.log, transition_to(job_id, *SETTLED_STATES))
            details = incident["details"]
            overshoot.append(details["overshoot_s"])
            gaps.append(details["gap_s"])
            alive = last_time(daemon.events(job_id, 1), ALIVE_EVENTS)
            dumped = (daemon.attempt_folder(job_id, 1) / "stderr.log").stat().st_mtime
            if alive is not None:
                end_to_end.append(dumped - alive - details["timeout_s"])
    return [
        Measure(
            "stall: overshoot past stall_timeout_s",
            overshoot,
            target_s=0.250,
            note="details.overshoot_s of the stall incident (loop timer lateness)",
            extra={"gap_s": gaps},
        ),
        Measure(
            "stall: last event -> stack dump - timeout (check)",
            end_to_end,
            note="stderr.log mtime (SIGUSR1 dump at detection) - last alive event time - timeout",
        ),
    ]


# ---- main


def filesystem_of(path: Path) -> str:
    """The filesystem type holding ``path``, from /proc/mounts."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (/proc/loadavg), or "unknown"."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Run every measure, print the table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--samples", type=int, help="samples for every measure")
    parser.add_argument("--keep", action="store_true", help="keep the temporary roots")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON results file")
    parser.add_argument(
        "--only",
        help=f"comma-separated measures to run, of {', '.join(MEASURES)} (default: all)",
    )
    args = parser.parse_args(argv)
    only = set(MEASURES) if args.only is None else set(args.only.split(","))
    if not only <= set(MEASURES):
        parser.error(f"--only: unknown measure(s) {', '.join(sorted(only - set(MEASURES)))}")
    counts = (
        {"intake": 50, "crash": 5, "stall": 3, "recovery": 2, "worker": 2}
        if args.quick
        else {"intake": 200, "crash": 20, "stall": 10, "recovery": 5, "worker": 5}
    )
    if args.samples is not None:
        counts = dict.fromkeys(counts, args.samples)
    base = Path(tempfile.mkdtemp(prefix="jw-bench-"))
    measures: list[Measure] = []
    began, load_before = time.monotonic(), loadavg()
    try:
        warm_cache = private_dir(base / "cache-warm")
        print("warming the compilation cache ...", flush=True)
        worker_sample(base, "prewarm", warm_cache)
        steps: list[tuple[str, str, Callable[[], list[Measure]]]] = [
            (
                "worker",
                "standalone worker start",
                lambda: bench_worker(base, warm_cache, counts["worker"]),
            ),
            ("intake", "intake", lambda: bench_intake(base, warm_cache, counts["intake"])),
            (
                "crash",
                "worker exit -> incident",
                lambda: bench_crash(base, warm_cache, counts["crash"]),
            ),
            ("stall", "stall overshoot", lambda: bench_stall(base, warm_cache, counts["stall"])),
            ("recovery", "recovery", lambda: bench_recovery(base, warm_cache, counts["recovery"])),
        ]
        for key, title, step in steps:
            if key not in only:
                continue
            print(f"{title} ...", flush=True)
            measures += step()
    finally:
        fs = filesystem_of(base)
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(table(measures))
    print()
    print(f"recovery breakdown, p50 in s (restart_backoff_s = {DEFAULT_BACKOFF_S} s, the default):")
    for m in measures:
        late = [
            r["job"] for r in m.extra.get("runs", []) if r["cache_cleared_before_spawn"] is False
        ]
        if late:
            print(f"  warning: cache emptied only after attempt 2 started in {', '.join(late)}")
        breakdown = m.extra.get("breakdown_p50_s")
        if breakdown:
            print(f"  {m.name.removeprefix('recovery: ')}:")
            print(
                "    " + "  ".join(f"{k.removesuffix('_s')} {fmt(v)}" for k, v in breakdown.items())
            )
    print(f"roots on {fs}; rescan interval {RESCAN_INTERVAL_S:g} s; load average {loadavg()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "daemon",
        "created": time.time(),
        "duration_s": time.monotonic() - began,
        "counts": {k: v for k, v in counts.items() if k in only},
        "loadavg": {"before": load_before, "after": loadavg()},
        "platform": {
            "python": platform.python_version(),
            "jax": metadata.version("jax"),
            "cpus": os.cpu_count(),
            "filesystem": fs,
        },
        "measures": [m.as_record() for m in measures],
        "figures": records(measure_figures(measures)),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
