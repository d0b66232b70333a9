"""The 2-process ``dp_mlp`` variants of the recovery benchmark (`recovery.py`).

Each sample is one job on a real wardend: the built-in ``dp_mlp`` task with
``[run] processes = 2``, ``steps = 1000``, a checkpoint every 10 updates and
``[faults] step_delay_s = 0.05`` in attempt 1 only.  Member 1 is SIGKILLed once
both members have reported update `KILL_AT` (in the spare variant once the
job's group spare is also ready: two members joined to ``jax.distributed`` on a
coordinator of their own, the data built and the update compiled); the
restart-all starts both members again.  Measured from the kill's ``time.time()``
to the first progress of *every* member of the next attempt, and to the last
member's ``started`` (the rejoin).

- *dp, no spares*: ``--no-warm-spare``: both members start cold (interpreter,
  ``import jax``, the join, the data, the compilation from the shared cache);
- *dp, group spare*: the default daemon; the restart-all is handed to the group.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from daemon import Wardend, job_text, read_events
from daemon_records import first_time, is_event, stamp

KILL_AT = 40
STEPS = 1000
"""Enough updates of attempt 1 (50 s at the delay) for the group to get ready first."""
Record = dict[str, Any]
NAMES = {
    "dp-cold": "recovery: 2-process dp_mlp, every member, no spares",
    "dp-spare": "recovery: 2-process dp_mlp, every member, group spare (default)",
}
FLAGS: dict[str, tuple[str, ...]] = {"dp-cold": ("--no-warm-spare",), "dp-spare": ()}
TARGETS_S = {"dp-spare": 1.0}


def dp_text(job_id: str) -> str:
    """A 2-process dp_mlp job file, attempt 1 slowed down."""
    run = {"steps": STEPS, "checkpoint_every": 10, "processes": 2}
    faults = {"step_delay_s": 0.05}
    return job_text(job_id, {"run": run, "faults": faults}).replace(
        'task = "linreg"', 'task = "dp_mlp"'
    )


def member_events(daemon: Wardend, job: str, attempt: int) -> list[list[Record]]:
    """Each member's events of ``attempt`` (events.jsonl, events.1.jsonl)."""
    folder = daemon.attempt_folder(job, attempt)
    return [read_events(folder / name) for name in ("events.jsonl", "events.1.jsonl")]


def kill_member_1(
    daemon: Wardend, job: str, deadline: float
) -> tuple[float, list[float], list[float]]:
    """Once every member of attempt 1 is past update `KILL_AT`, SIGKILL member 1; then wait
    for attempt 2's first progress in every member.  Returns the kill's time and, per
    member, attempt 2's first ``progress`` and ``started`` times."""
    while time.monotonic() < deadline:
        events = member_events(daemon, job, 1)
        steps = [
            max((e["step"] for e in m if e.get("event") == "progress"), default=0) for m in events
        ]
        if min(steps) >= KILL_AT:
            break
        time.sleep(0.002)
    pid = next(e["pid"] for e in member_events(daemon, job, 1)[1] if e.get("event") == "started")
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    firsts: list[float] = []
    joined: list[float] = []
    while time.monotonic() < deadline and len(firsts) < 2:
        events = member_events(daemon, job, 2)
        firsts = [t for m in events if (t := first_time(m, "progress")) is not None]
        joined = [t for m in events if (t := first_time(m, "started")) is not None]
        time.sleep(0.002)
    if len(firsts) < 2:
        raise TimeoutError(f"{job}: attempt 2 did not progress in every member")
    return killed, firsts, joined


def wait_group(daemon: Wardend, job: str, timeout: float) -> Record:
    """The job's group spare's ``spare.ready`` record, once logged."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        daemon.log.poll()
        for r in daemon.log.records:
            if r.get("event") == "spare.ready" and r.get("job") == job and r.get("group"):
                return r
        time.sleep(0.01)
    raise TimeoutError(f"{job}: no group spare ready")


def sample_dp(daemon: Wardend, job: str, variant: str) -> Record:
    """One 2-process dp_mlp job: member 1 killed after `KILL_AT`, every member's recovery."""
    daemon.drop(f"{job}.toml", dp_text(job))
    deadline = time.monotonic() + 180
    if variant == "dp-spare":
        wait_group(daemon, job, 180)
    killed, firsts, joined = kill_member_1(daemon, job, deadline)
    exited = daemon.wait_for(daemon.log, is_event("attempt.exited", job=job, attempt=1))
    started = daemon.wait_for(daemon.log, is_event("attempt.started", job=job, attempt=2))
    daemon.wait_for(daemon.log, settled(job), 180)
    handed = handed_records(daemon, job)
    return {
        "job": job,
        "recovery_s": max(firsts) - killed,
        "rejoin_s": max(joined) - killed,
        "detect_s": stamp(exited) - killed,
        "to_attempt_started_s": stamp(started) - stamp(exited),
        "to_members_started_s": max(joined) - stamp(started),
        "started_to_progress_s": max(firsts) - max(joined),
        "spare": sum(h.get("attempt") == 2 for h in handed) == 2,
    }


def handed_records(daemon: Wardend, job: str) -> list[Record]:
    """The daemon's ``spare.handed`` records of ``job`` so far."""
    records = daemon.log.records
    return [r for r in records if r.get("event") == "spare.handed" and r.get("job") == job]


def settled(job: str) -> Any:
    """A predicate for the job's transition into a resting state."""
    return lambda r: (
        r.get("event") == "job.transition"
        and r.get("job") == job
        and r.get("to") in ("completed", "failed", "escalated")
    )
