"""Section 1, worker_kills: SIGKILL workers at random instants and inside their
checkpoint commits (the method is in bench/reliability.py's docstring)."""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

from jobwarden.control.harness import job_text

from .common import CKPT_NAME, LIVE_STATES, SETTLED_STATES, Record, Section, jobs_rows
from .evidence import (
    References,
    event_kinds,
    final_of,
    incident_records,
    open_incidents,
    pending_files,
    pending_inodes,
    read_json,
)
from .wardend import Wardend, running

WORKER_KILL_STEPS = 60


def worker_kill_job(job_id: str, seed: int, restarts: int) -> str:
    """A small linreg job that commits every update and stays slow on every attempt."""
    return job_text(
        job_id,
        train={"seed": seed},
        run={"steps": WORKER_KILL_STEPS, "checkpoint_every": 1},
        faults={"step_delay_s": 0.01, "every_attempt": True},
        supervision={"max_restarts": restarts, "restart_backoff_s": 0.0},
    )


def is_worker(pid: int) -> bool:
    """Whether ``pid`` runs ``jobwarden.worker``."""
    try:
        return "jobwarden.worker" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def exited(pidfd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for the process behind ``pidfd`` to exit; whether it did."""
    ready, _, _ = select.select([pidfd], [], [], max(0.0, timeout))
    return bool(ready)


def wait_for_pending(directory: Path, pidfd: int, timeout: float) -> bool:
    """Poll ``directory`` until a pending checkpoint file shows (True) or the process exits or
    time runs out (False).  A busy poll: a commit of this state lasts about a millisecond."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            if any(e.name.endswith(".pending") and CKPT_NAME.match(e.name) for e in entries):
                return True
        if exited(pidfd, 0):
            return False
    return False


class KillPlan:
    """Shared counters of the kill threads: how many kills landed, which to target."""

    def __init__(self, target: int, targeted_every: int, seed: int) -> None:
        self.target = target
        self.targeted_every = targeted_every
        self.seed = seed
        self.lock = threading.Lock()
        self.sent = 0
        self.jobs = 0

    def next_job(self) -> int | None:
        """A new job index while kills are still wanted."""
        with self.lock:
            if self.sent >= self.target:
                return None
            self.jobs += 1
            return self.jobs - 1

    def refund(self) -> None:
        """A kill that was not sent (its attempt ended first) does not count."""
        with self.lock:
            self.sent -= 1

    def next_kill(self) -> tuple[int, bool] | None:
        """The next kill's index and whether it waits for a pending file; None when done."""
        with self.lock:
            if self.sent >= self.target:
                return None
            self.sent += 1
            index = self.sent - 1
            return index, index % self.targeted_every == self.targeted_every - 1


def kill_one_job(
    daemon: Wardend, job_id: str, kills_per_job: int, window_s: float, plan: KillPlan
) -> list[Record]:
    """Kill the job's worker ``kills_per_job`` times (fewer if it completes first)."""
    rng = random.Random(f"{plan.seed}-{job_id}")
    checkpoints = daemon.root / "checkpoints" / job_id
    records: list[Record] = []
    killed: set[int] = set()
    while len(records) < kills_per_job:
        status = daemon.status(job_id)
        if status is None or status["state"] not in LIVE_STATES:
            if status is not None and status["state"] in SETTLED_STATES:
                break
            time.sleep(0.01)
            continue
        attempt, pid = status["attempt"], status["pid"]
        if pid is None or attempt in killed or not is_worker(pid):
            time.sleep(0.01)
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        # Pending files an earlier killed attempt left, not yet quarantined by this one.
        stale = pending_inodes(checkpoints)
        try:
            turn = plan.next_kill()
            if turn is None:
                break
            index, targeted = turn
            began = time.monotonic()
            if targeted:
                alive = wait_for_pending(checkpoints, pidfd, window_s * 2)
                alive = alive and not exited(pidfd, 0)
            else:
                alive = not exited(pidfd, rng.uniform(0, window_s))
            delay = time.monotonic() - began
            if alive:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                exited(pidfd, 10)  # the signal is asynchronous: look once the process is gone
            else:
                plan.refund()
            pending = pending_files(checkpoints)
            own = sorted(name for name, inode in pending_inodes(checkpoints) - stale)
        finally:
            os.close(pidfd)
        killed.add(attempt)
        records.append(
            {
                "index": index,
                "job": job_id,
                "attempt": attempt,
                "pid": pid,
                "targeted": targeted,
                "delay_s": round(delay, 4),
                "sent": alive,
                "pending_after": pending,
                "own_pending_after": own,
            }
        )
    return records


def classify_kill(root: Path, kill: Record) -> str:
    """Where a kill landed, from the killed attempt's own records."""
    folder = root / "jobs" / kill["job"] / "attempts" / str(kill["attempt"])
    ended = read_json(folder / "exit.json") or {}
    if not kill["sent"] or ended.get("signal") != "SIGKILL":
        return "not sent (the attempt ended first)"
    if kill["own_pending_after"]:
        return "in a checkpoint commit"
    if any(not CKPT_NAME.match(name) for name in kill["pending_after"]):
        return "in the writer record's commit (start-up)"
    kinds = event_kinds(folder / "events.jsonl")
    if "completed" in kinds:
        return "after completed, before exit"
    if "ready" not in kinds:
        return "start-up (before ready)"
    return "between commits"


def in_commit(kill: Record) -> bool:
    """Whether a kill left a pending checkpoint file behind."""
    return bool(kill["sent"] and kill["own_pending_after"])


def attempt_life(daemon: Wardend, job_id: str, text: str) -> float:
    """Seconds from an attempt's pid showing in ``status`` to the job's completion."""
    daemon.drop(f"{job_id}.toml", text)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = daemon.status(job_id)
        if status is not None and status["pid"] is not None:
            break
        time.sleep(0.005)
    began = time.monotonic()
    daemon.wait(job_id)
    return time.monotonic() - began


def worker_kills(
    base: Path,
    cache: Path,
    references: References,
    *,
    kills: int = 200,
    kills_per_job: int = 4,
    concurrency: int = 2,
    targeted_every: int = 4,
    seed: int = 0,
) -> Section:
    """SIGKILL workers at random instants (and in commits) over many small jobs."""
    section = Section("worker_kills")
    section.sizes = {
        "kills": kills,
        "kills/job": kills_per_job,
        "steps/job": WORKER_KILL_STEPS,
        "concurrent": concurrency,
    }
    plan = KillPlan(kills, targeted_every, seed)
    restarts = kills_per_job + 5
    results: list[Record] = []
    submitted: list[tuple[str, int]] = []
    errors: list[str] = []
    with running(base / "worker-kills", cache, "--max-concurrent", str(concurrency)) as daemon:
        window = attempt_life(daemon, "warmup", worker_kill_job("warmup", 3, 0))
        section.figures["attempt_life_s"] = round(window, 3)

        def work() -> None:
            try:
                while (index := plan.next_job()) is not None:
                    job_id, job_seed = f"wk-{index:04d}", index % 5
                    submitted.append((job_id, job_seed))
                    daemon.drop(f"{job_id}.toml", worker_kill_job(job_id, job_seed, restarts))
                    results.extend(kill_one_job(daemon, job_id, kills_per_job, window, plan))
                    daemon.wait(job_id)
            except Exception as error:  # noqa: BLE001 - reported as a failed check
                errors.append(repr(error))

        for _ in range(6):  # a kill sent just as its attempt ended does not count: top up
            threads = [threading.Thread(target=work) for _ in range(concurrency)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            where = Counter(classify_kill(daemon.root, k) for k in results)
            short = kills - sum(n for k, n in where.items() if not k.startswith("not sent"))
            if short <= 0 or errors:
                break
            plan.target += short
        section.figures.update(settle_jobs(daemon, submitted, references, WORKER_KILL_STEPS))
        quarantined = sum(
            1
            for j, _ in submitted
            for path in (daemon.root / "checkpoints" / j / "quarantine").glob("*.pending*")
            if not path.name.endswith(".reason.json")
        )
        still_open = open_incidents(daemon.root, [j for j, _ in submitted])
        verdicts = Counter(
            str(i.get("verdict") or i.get("status"))
            for j, _ in submitted
            for i in incident_records(daemon.root, j)
        )
    landed = sum(n for k, n in where.items() if not k.startswith("not sent"))
    targeted = [k for k in results if k["targeted"]]
    f = section.figures
    f.update(
        {
            "kills_sent": sum(k["sent"] for k in results),
            "kills_landed": landed,
            "where": dict(where),
            "targeted_kills": len(targeted),
            "targeted_in_commit": sum(in_commit(k) for k in targeted),
            "random_in_commit": sum(in_commit(k) for k in results if not k["targeted"]),
            "pending_files_quarantined": quarantined,
            "incident_verdicts": dict(verdicts),
            "incidents_left_open": still_open,
            "errors": errors,
        }
    )
    section.details["kills"] = results
    section.row("kills landed (SIGKILL seen in exit.json)", landed, f">= {kills}")
    for kind, count in sorted(where.items()):
        section.row(f"  {kind}", count)
    section.row(
        "  in a checkpoint commit: random / targeted",
        f"{f['random_in_commit']} / {f['targeted_in_commit']} of {len(targeted)}",
    )
    section.row("pending files quarantined on resume", quarantined)
    section.row("incident verdicts", ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))
    jobs_rows(section, f)
    section.row("incidents still open after their job completed", len(still_open), "0")
    section.check("kills landed >= target", landed >= kills)
    section.check("some kills in a commit", f["random_in_commit"] + f["targeted_in_commit"] > 0)
    section.check("no harness error", not errors)
    return section


def settle_jobs(
    daemon: Wardend, jobs: list[tuple[str, int]], references: References, steps: int
) -> Record:
    """Wait for every job; count completed, lost, and finals equal to the reference."""
    states: Counter[str] = Counter()
    equal, unequal, lost = 0, [], []
    for job_id, seed in jobs:
        status = daemon.status(job_id)
        if status is None:
            lost.append(job_id)
            continue
        status = daemon.wait(job_id)
        states[status["state"]] += 1
        if status["state"] != "completed":
            continue
        final = final_of(daemon.root / "checkpoints" / status["checkpoint"])
        if final is not None and final.equals(references.get(seed, steps)):
            equal += 1
        else:
            unequal.append(job_id)
    return {
        "jobs": len(jobs),
        "completed": states["completed"],
        "states": dict(states),
        "lost": len(lost),
        "lost_jobs": lost,
        "finals_equal": equal,
        "finals_unequal": unequal,
    }
