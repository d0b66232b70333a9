"""Section 6, long_run: many jobs through one daemon; rss, descriptors and ``status``
latency after the first jobs and after the last."""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from pathlib import Path

from jobwarden.control.harness import job_text

from .common import SETTLED_STATES, Record, Section, mb, ms, percentile
from .evidence import References, final_of
from .wardend import Wardend, running, status_latencies, timed_status


def daemon_figures(daemon: Wardend, probes: int, job: str) -> Record:
    """The daemon's rss and fds, and ``status`` / ``status JOB`` latencies, now."""
    process = daemon.process()
    kinds: Counter[str] = Counter()
    for name in os.listdir(f"/proc/{daemon.pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{daemon.pid}/fd/{name}")
            kinds[Path(target).name if target.startswith("/") else target.split(":")[0]] += 1
    table = status_latencies(daemon.socket, probes)
    single = status_latencies(daemon.socket, probes, job)
    return {
        "rss": process.memory_info().rss,
        "fds": process.num_fds(),
        "fds_by_target": dict(kinds.most_common(8)),
        "status_p50_s": percentile(table, 50),
        "status_p99_s": percentile(table, 99),
        "status_job_p50_s": percentile(single, 50),
        "status_job_p99_s": percentile(single, 99),
    }


def long_run(
    base: Path,
    cache: Path,
    references: References,
    *,
    jobs: int = 1000,
    workers: int = 1000,
    concurrency: int = 2,
    probes: int = 300,
    p99_bound_s: float = 0.005,
    queue: int = 20,
) -> Section:
    """Many jobs through one daemon: rss, fds and status latency before and after.


    ``workers`` of the jobs run a worker to completion; the others name the checkpoint of
    a held job and are refused by the duplicate-writer check without a worker.
    """
    section = Section("long_run")
    refused = jobs - workers
    section.sizes = {"jobs": jobs, "with a worker": workers, "refused (duplicate writer)": refused}
    every = jobs / max(workers, 1)
    real = {round(i * every) for i in range(workers)}
    plan = [(f"lr-{i:04d}", i in real) for i in range(jobs)]
    steps = 2
    during: list[float] = []
    hold = job_text(
        "hold",
        "shared",
        faults={"stall_at": 0, "stall_seconds": 3600},
        supervision={"stall_timeout_s": 3600, "startup_timeout_s": 600, "stop_grace_s": 1},
    )
    outcomes: dict[str, Record] = {}
    slots = concurrency + (1 if refused else 0)  # the held job takes one
    with running(base / "root", cache, "--max-concurrent", str(slots)) as d:
        if refused:
            d.drop("hold.toml", hold)
            d.wait("hold", frozenset({"running"}), timeout=180)
        settled: set[str] = set()
        dropped = 0
        before: Record | None = None
        last_probe = time.monotonic()
        began = time.monotonic()
        while len(settled) < jobs:
            while dropped < jobs and dropped - len(settled) < queue:
                job_id, runs = plan[dropped]
                text = job_text(
                    job_id,
                    None if runs else "shared",
                    train={"seed": dropped % 5},
                    run={"steps": steps},
                )
                d.drop(f"{job_id}.toml", text)
                dropped += 1
            table = d.ask("status", timeout=30)["jobs"]
            for row in table:
                if row["id"] not in settled | {"hold"} and row["state"] in SETTLED_STATES:
                    settled.add(row["id"])
                    outcomes[row["id"]] = row
            if before is None and len(settled) >= min(10, jobs // 4):
                before = daemon_figures(d, probes, plan[0][0])
                before["jobs_known"] = len(table)
            if time.monotonic() - last_probe > 0.5:
                during.append(timed_status(d.socket))
                last_probe = time.monotonic()
            if time.monotonic() - began > 3600 * 3:
                break
            time.sleep(0.05)
        duration = time.monotonic() - began
        after = daemon_figures(d, probes, plan[0][0])
        after["jobs_known"] = len(d.ask("status")["jobs"])
    assert before is not None
    lost = [j for j, _ in plan if j not in outcomes]
    wrong = [
        j
        for j, runs in plan
        if j in outcomes and outcomes[j]["state"] != ("completed" if runs else "escalated")
    ]
    equal = 0
    for index, (job_id, runs) in enumerate(plan):
        if runs and outcomes.get(job_id, {}).get("state") == "completed":
            final = final_of(base / "root" / "checkpoints" / job_id)
            equal += bool(final and final.equals(references.get(index % 5, steps)))
    f = section.figures
    f.update(
        {
            "duration_s": round(duration, 1),
            "before": before,
            "after": after,
            "status_during_p99_s": percentile(during, 99),
            "lost": len(lost),
            "wrong_outcome": wrong[:20],
            "finals_equal": equal,
            "rss_growth_per_job": (after["rss"] - before["rss"]) / max(jobs - 10, 1),
        }
    )
    section.row("jobs settled as expected", f"{jobs - len(lost) - len(wrong)} of {jobs}", "all")
    section.row("jobs lost", len(lost), "0")
    section.row("final states equal to the reference", f"{equal} of {workers}", "all")
    section.row("jobs known before / after", f"{before['jobs_known']} / {after['jobs_known']}")
    section.row("daemon rss before / after", f"{mb(before['rss'])} / {mb(after['rss'])}")
    section.row(
        "daemon fds before / after (most held after)",
        f"{before['fds']} / {after['fds']} ("
        + ", ".join(f"{k} {v}" for k, v in list(after["fds_by_target"].items())[:3])
        + ")",
        "after <= before + 5",
    )
    section.row(
        "status p50 / p99 before", f"{ms(before['status_p50_s'])} / {ms(before['status_p99_s'])}"
    )
    section.row(
        "status p50 / p99 after",
        f"{ms(after['status_p50_s'])} / {ms(after['status_p99_s'])}",
        f"p99 <= {ms(p99_bound_s)}",
    )
    section.row(
        "status JOB p50 before / after",
        f"{ms(before['status_job_p50_s'])} / {ms(after['status_job_p50_s'])}",
        "after <= 3 x before (or 1 ms)",
    )
    section.row(
        "status JOB p99 before / after",
        f"{ms(before['status_job_p99_s'])} / {ms(after['status_job_p99_s'])}",
    )
    section.row("status p99 during the run", ms(f["status_during_p99_s"]))
    section.row("run time", f"{duration:.0f} s")
    section.check("jobs lost == 0", not lost)
    section.check("every job settled as expected", not wrong)
    section.check("finals equal", equal == workers)
    section.check("descriptors not leaked", after["fds"] <= before["fds"] + 5)
    section.check("status p99 after", after["status_p99_s"] <= p99_bound_s)
    section.check(
        "status JOB independent of table size",
        after["status_job_p50_s"] <= max(3 * before["status_job_p50_s"], 0.001),
    )
    return section
