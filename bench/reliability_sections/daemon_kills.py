"""Section 2, daemon_kills: SIGKILL the daemon at random instants, in intake and in state
writes, while requests arrive, and restart it on the same root."""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from jobwarden.control.harness import job_text

from .common import Record, Section, jobs_rows
from .evidence import References, final_of, open_incidents, pending_files, rejections
from .wardend import Wardend

DAEMON_KILL_STEPS = 16


DEEP_JSON = "[" * 5000 + "]" * 5000


def daemon_kill_job(job_id: str, seed: int) -> str:
    """A small job that runs across several daemon lives."""
    return job_text(
        job_id,
        train={"seed": seed},
        run={"steps": DAEMON_KILL_STEPS, "checkpoint_every": 2},
        faults={"step_delay_s": 0.03, "every_attempt": True},
        supervision={"max_restarts": 1000, "restart_backoff_s": 0.0},
    )


@dataclass
class Dropped:
    """One request the benchmark dropped, and what it must become."""

    name: str
    data: bytes
    job: str | None  # the job it must become, or None: a rejection
    seed: int = 3


def hostile_request(index: int, taken_id: str | None) -> tuple[str, bytes]:
    """An invalid request of one of several kinds (name, bytes)."""
    kinds: list[tuple[str, str]] = [
        ("toml", 'id = "x\ntask = linreg\n'),
        ("toml", f'id = "bad-{index}"\ntask = "nope"\n'),
        ("json", '{"id": "nested", "task": "linreg", "train": ' + DEEP_JSON + "}"),
        ("json", '{"id": "nan", "task": "linreg", "train": {"learning_rate": NaN}}'),
        ("toml", f'id = "unk-{index}"\ntask = "linreg"\n[run]\nsteps = 4\nstepz = 1\n'),
        ("toml", f'id = "{taken_id or "dup"}"\ntask = "linreg"\n'),
    ]
    suffix, text = kinds[index % len(kinds)]
    return f"bad-{index:04d}.{suffix}", text.encode()


def kill_instant(root: Path, mode: str, rng: random.Random) -> bool:
    """Wait for the instant to kill at; whether the awaited condition was seen."""
    if mode == "random":
        time.sleep(rng.uniform(0, 1.5))
        return True
    deadline = time.monotonic() + 3
    jobs = root / "jobs"
    while time.monotonic() < deadline:
        if mode == "intake":
            with contextlib.suppress(FileNotFoundError):
                if any(n.startswith("+intake-") for n in os.listdir(jobs)):
                    return True
                if os.listdir(root / "spool" / "claimed"):
                    return True
        else:
            with contextlib.suppress(FileNotFoundError):
                if any(pending_files(jobs / name) for name in os.listdir(jobs)):
                    return True
    return False


def at_kill(root: Path) -> Record:
    """What the root shows right after a kill: requests in intake, state writes pending."""
    jobs = root / "jobs"
    names = os.listdir(jobs)
    staging = [n for n in names if n.startswith("+intake-")]
    pending = [f"{n}/{name}" for n in names for name in pending_files(jobs / n)]
    return {
        "incoming": len(os.listdir(root / "spool" / "incoming")),
        "claimed": len(os.listdir(root / "spool" / "claimed")),
        "staging": staging,
        "state_pending": pending,
    }


def daemon_kills(
    base: Path,
    cache: Path,
    references: References,
    *,
    kills: int = 50,
    per_cycle: int = 3,
    seed: int = 1,
) -> Section:
    """SIGKILL the daemon at random instants, in intake and in state writes; restart it."""
    section = Section("daemon_kills")
    section.sizes = {"kills": kills, "requests/life": f"1-{per_cycle}", "steps/job": 16}
    rng = random.Random(seed)
    root = base / "root"
    daemon = Wardend(root, cache, "--max-concurrent", "2")
    dropped: list[Dropped] = []
    instants: list[Record] = []
    modes = ("random", "intake", "state")
    try:
        for cycle in range(kills):
            daemon.start()
            mode = modes[cycle % len(modes)]
            for _ in range(rng.randint(1, per_cycle)):
                index = len(dropped)
                if rng.random() < 0.7:
                    job_id, job_seed = f"dk-{index:04d}", index % 5
                    item = Dropped(
                        f"{job_id}.toml",
                        daemon_kill_job(job_id, job_seed).encode(),
                        job_id,
                        job_seed,
                    )
                else:
                    taken = next((d.job for d in reversed(dropped) if d.job), None)
                    name, data = hostile_request(index, taken)
                    item = Dropped(name, data, None)
                dropped.append(item)
                daemon.drop(item.name, item.data)
            seen = kill_instant(root, mode, rng)
            daemon.kill()
            instants.append({"cycle": cycle, "mode": mode, "seen": seen, **at_kill(root)})
        daemon.start()
        deadline = time.monotonic() + 120 + 15 * len(dropped)
        for item in dropped:
            if item.job is not None:
                while daemon.status(item.job) is None and time.monotonic() < deadline:
                    if item.name in rejections(root):
                        break
                    time.sleep(0.1)
                if daemon.status(item.job) is not None:
                    daemon.wait(item.job, timeout=max(1, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            outcome = rejections(root)
            if all(d.name in outcome for d in dropped if d.job is None):
                break
            time.sleep(0.2)
        status = {d.job: daemon.status(d.job) for d in dropped if d.job}
    finally:
        daemon.stop()
    outcome = rejections(root)
    still_open = open_incidents(root, [d.job for d in dropped if d.job])
    lost, doubled, wrong, unequal, altered = [], [], [], [], []
    states: Counter[str] = Counter()
    equal = 0
    for item in dropped:
        rejected = outcome.get(item.name, [])
        if item.job is None:
            if not rejected:
                lost.append(item.name)
            elif len(rejected) > 1:
                doubled.append(item.name)
            elif not rejected[0]["kept"] or not rejected[0].get("problems"):
                wrong.append(item.name)
            continue
        record = status.get(item.job)
        if record is None:
            (wrong if rejected else lost).append(item.name)
            continue
        if rejected:
            doubled.append(item.name)
        states[record["state"]] += 1
        kept = daemon.job_folder(item.job) / "request.toml"
        if not kept.is_file() or kept.read_bytes() != item.data:
            altered.append(item.name)
        final = final_of(root / "checkpoints" / item.job)
        if record["state"] == "completed" and final is not None:
            if final.equals(references.get(item.seed, DAEMON_KILL_STEPS)):
                equal += 1
            else:
                unequal.append(item.job)
    jobs = [d for d in dropped if d.job]
    f = section.figures
    f.update(
        {
            "daemon_lives": daemon.starts,
            "requests": len(dropped),
            "jobs": len(jobs),
            "rejections_expected": len(dropped) - len(jobs),
            "completed": states["completed"],
            "states": dict(states),
            "lost": len(lost),
            "lost_requests": lost,
            "doubled": doubled,
            "wrong_outcome": wrong,
            "request_not_kept_verbatim": altered,
            "finals_equal": equal,
            "finals_unequal": unequal,
            "kills_in_intake": sum(bool(i["claimed"] or i["staging"]) for i in instants),
            "kills_in_state_write": sum(bool(i["state_pending"]) for i in instants),
            "kills_with_requests_unclaimed": sum(bool(i["incoming"]) for i in instants),
            "incidents_left_open": still_open,
        }
    )
    section.details["instants"] = instants
    section.row("daemon SIGKILLs", kills, f">= {kills}")
    section.row("  during intake (claimed/ or +intake-* present)", f["kills_in_intake"])
    section.row("  during a state write (*.pending under jobs/)", f["kills_in_state_write"])
    section.row("  with requests still in incoming/", f["kills_with_requests_unclaimed"])
    section.row(
        "requests dropped (jobs / invalid)",
        f"{len(dropped)} ({len(jobs)} / {len(dropped) - len(jobs)})",
    )
    bad = [d.name for d in dropped if d.job is None]
    filed = sum(1 for n in bad if n not in lost and n not in wrong and n not in doubled)
    section.row("rejections with their error file", f"{filed} of {len(bad)}", "all")
    section.row("requests doubled / wrong outcome", f"{len(doubled)} / {len(wrong)}", "0 / 0")
    jobs_rows(section, f)
    section.row("incidents still open after their job completed", len(still_open), "0")
    section.check("requests lost == 0", not lost)
    section.check("no request doubled or misfiled", not doubled and not wrong)
    section.check("kept requests verbatim", not altered)
    section.check(
        "kills during intake and state writes",
        f["kills_in_intake"] > 0 and f["kills_in_state_write"] > 0,
    )
    return section
