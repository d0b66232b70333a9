"""Section settled: jobs whose recovery is cut short, by a cancel or a stop at a random
instant of it (right after its start, while it imports JAX, among others), some stopped
then resumed to completion, and jobs killed at random; once each job rests, the incidents
still ``open`` on it.

Every job is a small linreg job committing every update.  Its first attempt crashes,
either by an injected fault (``fail_after``: the recovery is then quick once imported) or
by a SIGKILL the section sends at a random instant of a slow first attempt (``step_delay_s``
on every attempt).  The recovery attempt is then cancelled, stopped (the job rests
preempted), stopped and resumed, or left to complete, one ending in turn; a third of the
cuts come as soon as the recovery's worker exists, the rest at a uniform instant of an
attempt's measured life.  At the end every job's incidents are read over the control socket
(``incidents JOB``) and from their files.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from jobwarden.control.harness import job_text
from jobwarden.protocol import ControlError

from .common import SETTLED_STATES, Record, Section
from .evidence import event_kinds, incident_records
from .wardend import Wardend, running
from .worker_kills import attempt_life, exited, is_worker

RESTING = frozenset({*SETTLED_STATES, "preempted"})
"""Where a job rests: settled, or preempted (a stop's end), where its incidents must be
concluded as well."""
CRASHES = ("fault", "kill")
ENDINGS = ("cancel", "stop", "resume", "none")
STEPS = 40
SLOW: Record = {"step_delay_s": 0.02}
"""The faults of a slow model, whose attempts last long enough to be killed at random."""


def settled_job(job_id: str, crash: str, seed: int) -> str:
    """A linreg job whose first attempt crashes by a fault, or is slow enough to be killed."""
    faults = {"fail_after": STEPS // 2} if crash == "fault" else {**SLOW, "every_attempt": True}
    return job_text(
        job_id,
        train={"seed": seed},
        run={"steps": STEPS, "checkpoint_every": 1},
        faults=faults,
        supervision={"max_restarts": 3, "stop_grace_s": 5},
    )


def wait_status(
    daemon: Wardend, job: str, ok: Callable[[Record], bool], timeout: float = 300
) -> Record | None:
    """Poll ``status JOB`` until ``ok(status)`` holds (that status), or the job rests or time
    runs out (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = daemon.status(job)
        if status is not None:
            if ok(status):
                return status
            if status["state"] in RESTING:
                return None
        time.sleep(0.01)
    return None


def kill_first_attempt(daemon: Wardend, job: str, delay: float) -> str:
    """SIGKILL the job's first worker ``delay`` s after it shows; where the kill landed."""
    status = wait_status(daemon, job, lambda s: s["attempt"] == 1 and s["pid"] is not None)
    if status is None or not is_worker(status["pid"]):
        return "missed (attempt 1 ended first)"
    pidfd = os.pidfd_open(status["pid"])
    try:
        if exited(pidfd, delay):
            return "missed (attempt 1 ended first)"
        kinds = event_kinds(daemon.attempt_folder(job, 1) / "events.jsonl")
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        exited(pidfd, 10)
    finally:
        os.close(pidfd)
    return "killed while training" if "ready" in kinds else "killed while importing"


def cut_recovery(daemon: Wardend, job: str, ending: str, delay: float) -> str:
    """Wait for the recovery's worker, then (after ``delay`` s) cancel or stop it; where the
    command landed in the recovery."""
    status = wait_status(
        daemon,
        job,
        lambda s: s["state"] == "recovering" and s["attempt"] >= 2 and s["pid"] is not None,
    )
    if status is None:
        return "missed (no recovery seen)"
    if ending == "none":
        return "left to complete"
    time.sleep(delay)
    kinds = event_kinds(daemon.attempt_folder(job, status["attempt"]) / "events.jsonl")
    where = "while training" if "ready" in kinds else "while importing"
    try:
        if ending == "cancel":
            daemon.ask("cancel", jobs=[job])
        else:
            daemon.ask("stop", job=job)
    except ControlError as error:
        return f"missed ({error.code})"
    if "completed" in kinds:
        where = "after completed"
    if ending == "resume":
        rested = daemon.wait(job, RESTING)
        if rested["state"] == "preempted":
            daemon.ask("resume", job=job)
    return f"{ending} {where}"


def rng_of(job: str, seed: int = 0) -> random.Random:
    """The job's own random draws, the same whatever thread runs it."""
    return random.Random(f"{seed}-{job}")


def settled(
    folder: Path,
    cache: Path,
    *,
    jobs: int = 48,
    concurrency: int = 2,
    at_start_every: int = 3,
    seed: int = 0,
) -> Section:
    """Recoveries cancelled or stopped at random instants, jobs killed at random: incidents
    still open once each job rests."""
    section = Section("settled")
    section.sizes = {"jobs": jobs, "steps/job": STEPS, "concurrent": concurrency}
    lock = threading.Lock()
    plan = [(f"se-{i:03d}", CRASHES[i % 2], ENDINGS[(i // 2) % len(ENDINGS)]) for i in range(jobs)]
    landed: dict[str, list[str]] = {}
    errors: list[str] = []
    pending = list(reversed(plan))
    with running(
        folder / "root", cache, "--max-concurrent", str(concurrency), "--no-warm-spare"
    ) as daemon:
        run = {"steps": STEPS, "checkpoint_every": 1}
        windows = {  # an attempt's life: a fault's recovery is fast, a killed job's slow
            "fault": attempt_life(daemon, "warmup-fast", job_text("warmup-fast", run=run)),
            "kill": attempt_life(
                daemon, "warmup-slow", job_text("warmup-slow", run=run, faults=SLOW)
            ),
        }

        def work() -> None:
            while True:
                with lock:
                    if not pending:
                        return
                    job, crash, ending = pending.pop()
                index, draw = int(job.split("-")[1]), rng_of(job, seed)
                at_start = index % at_start_every == 0
                try:
                    daemon.drop(f"{job}.toml", settled_job(job, crash, index % 5))
                    notes = []
                    if crash == "kill":
                        delay = draw.uniform(0, windows[crash] * 0.8)
                        notes.append(kill_first_attempt(daemon, job, delay))
                    cut = 0.0 if at_start else draw.uniform(0, windows[crash])
                    notes.append(cut_recovery(daemon, job, ending, cut))
                    landed[job] = notes
                    daemon.wait(job, RESTING if ending == "stop" else SETTLED_STATES)
                except Exception as error:  # noqa: BLE001 - reported as a failed check
                    errors.append(f"{job}: {error!r:.300}")

        threads = [threading.Thread(target=work) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        states: dict[str, str] = {}
        incidents: dict[str, list[Record]] = {}
        for job, _, _ in plan:
            status = daemon.status(job)
            states[job] = "unknown" if status is None else str(status["state"])
            incidents[job] = list(daemon.ask("incidents", job=job))
        on_disk = {job: incident_records(daemon.root, job) for job, _, _ in plan}
    resting = [job for job, state in states.items() if state in RESTING]
    unsettled = [job for job, state in states.items() if state not in RESTING]
    still_open = sorted(
        str(i.get("id")) for job in resting for i in incidents[job] if i.get("status") == "open"
    )
    open_on_disk = sorted(
        str(i.get("id")) for job in resting for i in on_disk[job] if i.get("status") == "open"
    )
    where = Counter(note for notes in landed.values() for note in notes)
    verdicts = Counter(f"{i.get('kind')} {i.get('status')}" for v in incidents.values() for i in v)
    f = section.figures
    f.update(
        {
            "attempt_life_s": {k: round(v, 3) for k, v in windows.items()},
            "where": dict(where),
            "states": dict(Counter(states.values())),
            "incidents": sum(len(v) for v in incidents.values()),
            "incident_statuses": dict(verdicts),
            "open_on_settled": len(still_open),
            "open_on_settled_ids": still_open[:40],
            "open_on_disk": len(open_on_disk),
            "unsettled": unsettled,
            "errors": errors,
        }
    )
    section.row("jobs at rest", f"{len(resting)} of {jobs}", "all")
    section.row("  states", ", ".join(f"{k} {n}" for k, n in sorted(f["states"].items())))
    for note, count in sorted(where.items()):
        section.row(f"  {note}", count)
    section.row("incidents", ", ".join(f"{k} {n}" for k, n in sorted(verdicts.items())))
    section.row(
        "incidents open on jobs at rest (control socket / files)",
        f"{len(still_open)} / {len(open_on_disk)}",
        "0",
    )
    section.check("open incidents on settled jobs == 0", not still_open and not open_on_disk)
    section.check("all settled", not unsettled and not errors)
    return section
