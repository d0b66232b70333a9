"""The drills a daemon must refuse: a duplicate writer and an incompatible checkpoint.

Each checks that the refusal names its cause, escalates instead of falling back, and leaves
the live job's checkpoints byte-identical.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from jobwarden.control.drill.context import Drill, final_check
from jobwarden.control.drill.daemon import SETTLED_STATES
from jobwarden.control.drill.verdict import Check, Outcome
from jobwarden.errors import WriterLockedError

# How long the duplicate-writer drill's primary would hold still if never stopped: far beyond
# the refusals' few seconds, since the drill stops it as soon as they are in.
HOLD_S = 300
STOP_GRACE_S = 0.5


def duplicate_writer(drill: Drill) -> Outcome:
    """A second job and a hand-started worker on a live job's checkpoint are both refused.

    The primary holds still (an injected stall, far longer than the drill needs) right after
    committing, so that its checkpoints cannot change while the others try to write; once
    both are refused, the drill stops it over the control socket and resumes it.
    """
    primary, second = drill.job_id("primary"), drill.job_id("second")
    drill.submit(
        primary,
        faults={"stall_at": drill.points.pause_at, "stall_seconds": HOLD_S},
        supervision={"stall_timeout_s": 2 * HOLD_S, "stop_grace_s": STOP_GRACE_S},
    )
    ck = drill.checkpoint_dir(primary)
    drill.wait_for_event(primary, "stall_injected")
    before = _snapshot(ck)
    drill.submit(second, primary)
    second_status = drill.wait(second, timeout=30)
    started = drill.job.hand_started(primary, ck, drill.out)
    hand = subprocess.run(
        started.argv,
        cwd=started.cwd,
        env=started.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    hand_events = [json.loads(line) for line in hand.stdout.splitlines() if line.startswith("{")]
    hand_failure: dict[str, Any] = next((e for e in hand_events if e.get("event") == "failed"), {})
    after = _snapshot(ck)
    primary_pid = drill.handle.ask("status", job=primary)["pid"]
    if primary_pid is None:  # a launcher that runs it elsewhere (Slurm): its own event says
        begun = [e for e in drill.events(primary) if e.kind == "started"]
        primary_pid = begun[-1]["pid"] if begun else None
    # The worker sleeps in its injected stall and cannot act on SIGTERM there, so the
    # daemon's SIGKILL ends it after the grace; it committed before holding, losing nothing.
    drill.handle.ask("stop", job=primary)
    stopped = drill.wait(primary, ("preempted", *SETTLED_STATES), timeout=60)
    drill.handle.ask("resume", job=primary)
    drill.wait(primary)
    reference, _ = drill.reference()
    second_incidents = drill.keep_incidents(second)
    drill.keep_incidents(primary)
    refusal = next((i for i in second_incidents if i["kind"] == "duplicate_writer"), None)
    drill.write(
        "refusals.json",
        {
            "second_job": refusal,
            "hand_started_worker": {
                "exit_status": hand.returncode,
                "failed_event": hand_failure,
                "stderr": hand.stderr[-2000:],
            },
        },
    )
    report = drill.verify(reference, primary)
    rows = drill.comparison(reference, primary, first_attempt=1)
    drill.plot(rows, "duplicate-writer: the primary against the reference")
    drill.timeline(primary, second)
    drill.accepted_checkpoint(primary)
    checks = [
        Check(
            "a second job on the live job's checkpoint is refused",
            second_status["state"] == "escalated"
            and refusal is not None
            and second_status["attempt"] == 0,
            {
                "state": second_status["state"],
                "attempts_started": second_status["attempt"],
                "incident": refusal["id"] if refusal else None,
            },
        ),
        Check(
            "a worker started by hand on that directory exits with the lock error",
            hand.returncode == WriterLockedError.exit_status
            and hand_failure.get("code") == WriterLockedError.code
            and hand_failure.get("holder_pid") == primary_pid,
            {
                "exit_status": hand.returncode,
                "code": hand_failure.get("code"),
                "holder_pid": hand_failure.get("holder_pid"),
                "primary_pid": primary_pid,
            },
        ),
        Check(
            "the primary's checkpoints are byte-identical before and after",
            before == after and bool(before),
            {
                "files": sorted(before),
                "changed": sorted(
                    k for k in set(before) | set(after) if before.get(k) != after.get(k)
                ),
            },
        ),
        Check(
            "the primary's continuation is exact",
            report.proven,
            {
                "failed_verify_checks": [c.name for c in report.checks if not c.ok],
                "stopped_as": stopped["state"],
                "restored_steps": report.restored_steps,
            },
        ),
        final_check(drill.events(reference), drill.events(primary)),
    ]
    return checks, {
        "job": primary,
        "second_job": second,
        "reference": reference,
        "all_hashes_equal": report.proven,
        "runbook": drill.runbook(refusal or {}),
    }


def incompatible(drill: Drill) -> Outcome:
    """A resume with a changed training field (the learning rate when the job has one; for a
    command job, whose fields are its program's, its runtime's XLA flags) is refused naming
    the field with both values; escalated, no fallback."""
    change = drill.job.change
    if change is None:
        return [Check("the job has a training field to change", False, {})], {}
    first, retry = drill.job_id("original"), drill.job_id(f"changed-{_short(change.field)}")
    drill.submit(
        first, faults={"fail_after": drill.points.fail_after}, supervision={"max_restarts": 0}
    )
    drill.wait(first)
    ck = drill.checkpoint_dir(first)
    before = _snapshot(ck)
    drill.submit(retry, first, **change.changes)
    status = drill.wait(retry)
    after = _snapshot(ck)
    reference, _ = drill.reference()
    events = drill.events(retry)
    failure = next((e for e in events if e.kind == "failed"), None)
    incidents = drill.keep_incidents(retry)
    drill.keep_incidents(first)
    incident = next((i for i in incidents if i["kind"] == "incompatible_checkpoint"), None)
    drill.write("refusals.json", {"failed_event": dict(failure.fields) if failure else None})
    drill.timeline(first, retry)
    drill.accepted_checkpoint(retry)
    rows = drill.comparison(reference, first, first_attempt=1)
    drill.verify(reference, first)  # the original run's first divergence, if any
    drill.plot(rows, "incompatible: the original run before its failure")
    fields = (failure.get("fields") or {}) if failure else {}
    checks = [
        Check(
            f"the resume with {change.what} is refused as incompatible ({change.code}), "
            f"naming {change.field} with both values",
            failure is not None and failure["code"] == change.code and change.named_in(fields),
            {
                "code": failure["code"] if failure else None,
                "fields": fields,
                "message": failure["message"] if failure else None,
            },
        ),
        Check(
            "the job is escalated",
            status["state"] == "escalated" and incident is not None,
            {"state": status["state"], "incident": incident["id"] if incident else None},
        ),
        Check(
            "no fallback: nothing restored, nothing quarantined, no update run",
            not any(e.kind in ("restored", "progress") for e in events)
            and not (ck / "quarantine").exists()
            and before == after,
            {"attempts": status["attempt"], "checkpoints_unchanged": before == after},
        ),
        Check(
            "the original run matched the reference until it failed",
            bool(rows) and all(r["equal"] for r in rows),
            {"compared": len(rows)},
        ),
    ]
    return checks, {
        "job": retry,
        "reference": reference,
        "runbook": drill.runbook(incident or {}),
    }


def _short(field: str) -> str:
    """A changed field's name as part of a job id's role, at most 8 characters (so that the
    longest id fits in 64): ``learning_rate`` becomes ``lr``, ``xla_flags`` ``xla-flag``."""
    return "lr" if field == "learning_rate" else re.sub(r"[^A-Za-z0-9.]", "-", field)[:8]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name.startswith("ckpt-")
    }
