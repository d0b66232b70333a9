"""Daemon benchmark, measure 4: recovery, and the standalone worker side by side.

See bench/daemon.py, which runs it, for the method.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from daemon_records import (
    SETTLED_STATES,
    Record,
    Wardend,
    clear_folder,
    count_files,
    first_time,
    is_event,
    job_text,
    last_time,
    need,
    private_dir,
    read_events,
    running,
    stamp,
    transition_to,
)
from daemon_table import Measure, median

from jobwarden.worker.command import worker_argv

RECOVERY_JOB = {"faults": {"fail_after": 3}}


def recovery_sample(daemon: Wardend, job_id: str, empty_cache: bool) -> Record:
    """One fail_after = 3 job: the timeline of its failure and first resumed update."""
    daemon.drop(f"{job_id}.toml", job_text(job_id, RECOVERY_JOB))
    recovering = daemon.wait_for(daemon.log, transition_to(job_id, "recovering"), 180)
    entries = count_files(daemon.cache)
    cleared_at = None
    if empty_cache:
        clear_folder(daemon.cache)
        cleared_at = time.time()
    started = daemon.wait_for(daemon.log, is_event("attempt.started", job=job_id, attempt=2))
    done = daemon.wait_for(daemon.log, transition_to(job_id, *SETTLED_STATES), 180)
    exited = daemon.wait_for(daemon.log, is_event("attempt.exited", job=job_id, attempt=1))
    opened = daemon.wait_for(daemon.incidents, is_event("incident.opened", job=job_id))
    goodput = daemon.wait_for(daemon.incidents, is_event("incident.goodput", job=job_id), 5)
    failed, resumed = daemon.events(job_id, 1), daemon.events(job_id, 2)
    last_progress = need(last_time(failed, ("progress",)), job_id, "progress")
    failed_at = need(first_time(failed, "failed"), job_id, "failed")
    first_progress = need(first_time(resumed, "progress"), job_id, "resumed progress")
    ready = need(first_time(resumed, "ready"), job_id, "resumed ready")
    imported = need(first_time(resumed, "started"), job_id, "resumed started")
    return {
        "job": job_id,
        "final_state": done["to"],
        "recovery_s": first_progress - last_progress,
        "detect_s": stamp(exited) - last_progress,
        "worker_teardown_s": stamp(exited) - failed_at,
        "incident_s": stamp(recovering) - stamp(exited),
        "backoff_configured_s": opened["details"].get("backoff_s"),
        "backoff_s": stamp(started) - stamp(recovering),
        "spawn_to_ready_s": ready - stamp(started),
        "spawn_to_started_s": imported - stamp(started),
        "ready_to_progress_s": first_progress - ready,
        "daemon_time_lost_s": goodput.get("time_lost_s"),
        "cache_files_at_failure": entries,
        "cache_files_at_end": count_files(daemon.cache),
        "cache_cleared_before_spawn": None if cleared_at is None else cleared_at < stamp(started),
    }


def recovery_measure(name: str, samples: list[Record], note: str) -> Measure:
    """A recovery row with its breakdown medians."""
    keys = (
        "detect_s",
        "worker_teardown_s",
        "incident_s",
        "backoff_s",
        "spawn_to_ready_s",
        "spawn_to_started_s",
        "ready_to_progress_s",
        "daemon_time_lost_s",
    )
    return Measure(
        name,
        [s["recovery_s"] for s in samples],
        unit="s",
        target_on="p50",
        note=note,
        extra={
            "breakdown_p50_s": {
                k: median([s[k] for s in samples if s[k] is not None]) for k in keys
            },
            "runs": samples,
        },
    )


def bench_recovery(base: Path, warm_cache: Path, n: int) -> list[Measure]:
    """fail_after = 3 on a warm cache, a fresh cache per job, and a cache emptied in the backoff."""
    with running(base / "recovery-warm", warm_cache) as daemon:
        warm = [recovery_sample(daemon, f"warm-{i:02d}", False) for i in range(n)]
    fresh: list[Record] = []
    cold: list[Record] = []
    for i in range(n):
        for label, runs, empty in (("fresh", fresh, False), ("cold", cold, True)):
            cache = private_dir(base / f"cache-{label}-{i:02d}")
            with running(base / f"recovery-{label}-{i:02d}", cache) as daemon:
                runs.append(recovery_sample(daemon, f"{label}-{i:02d}", empty))
    return [
        recovery_measure(
            "recovery: warm cache",
            warm,
            "last progress of attempt 1 -> first progress of attempt 2, pre-warmed cache",
        ),
        recovery_measure(
            "recovery: fresh cache dir per job",
            fresh,
            "empty cache at daemon start; attempt 1 fills it before attempt 2",
        ),
        recovery_measure(
            "recovery: cache emptied during backoff",
            cold,
            "the bench empties the cache after the recovering transition: a cold restart",
        ),
    ]


def worker_sample(base: Path, name: str, cache: Path) -> Record:
    """A standalone worker from process start to its first progress event."""
    folder = base / name
    folder.mkdir(parents=True)
    job_file = folder / "job.toml"
    job_file.write_text(job_text(name))
    argv = worker_argv(job_file, folder / "checkpoints", cache)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JOBWARDEN_SUPERVISOR_PID", "JOBWARDEN_COMPILE_CACHE")
    }
    with (folder / "events.jsonl").open("wb") as out, (folder / "stderr.log").open("wb") as err:
        began = time.time()
        status = subprocess.run(argv, stdout=out, stderr=err, env=env, timeout=300, check=False)
    events = read_events(folder / "events.jsonl")
    progress, ready, started = (first_time(events, k) for k in ("progress", "ready", "started"))
    if status.returncode != 0 or progress is None or ready is None or started is None:
        raise RuntimeError(f"worker {name} exited with {status.returncode}")
    return {
        "to_first_progress_s": progress - began,
        "to_started_s": started - began,
        "to_ready_s": ready - began,
    }


def bench_worker(base: Path, warm_cache: Path, n: int) -> list[Measure]:
    """The standalone worker's start, an empty cache and a warm one alternating."""
    empty, warm = [], []
    for i in range(n):
        empty.append(
            worker_sample(base, f"worker-empty-{i:02d}", private_dir(base / f"cache-empty-{i:02d}"))
        )
        warm.append(worker_sample(base, f"worker-warm-{i:02d}", warm_cache))
    rows = []
    for label, runs in (("empty", empty), ("warm", warm)):
        rows.append(
            Measure(
                f"worker start -> first progress, {label} cache",
                [r["to_first_progress_s"] for r in runs],
                unit="s",
                target_on="p50",
                note="python -m jobwarden.worker, from before spawn to its first progress event",
                extra={
                    "to_started_p50_s": median([r["to_started_s"] for r in runs]),
                    "to_ready_p50_s": median([r["to_ready_s"] for r in runs]),
                },
            )
        )
    return rows
