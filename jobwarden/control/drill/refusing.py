"""The drills a daemon must refuse: a duplicate writer and an incompatible checkpoint.

Each checks that the refusal names its cause, escalates instead of falling back, and leaves
the live job's checkpoints byte-identical.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from jobwarden.control.drill.context import Drill, arrays_equal, final_file, job_text
from jobwarden.control.drill.daemon import SETTLED_STATES
from jobwarden.control.drill.verdict import Check, Outcome
from jobwarden.errors import WriterLockedError
from jobwarden.worker.command import worker_argv

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
    params = drill.params
    primary, second = drill.job_id("primary"), drill.job_id("second")
    pause = max(1, params.checkpoint_every)
    drill.handle.submit(
        f"{primary}.toml",
        job_text(
            params,
            primary,
            primary,
            faults={"stall_at": pause, "stall_seconds": HOLD_S},
            supervision={"stall_timeout_s": 2 * HOLD_S, "stop_grace_s": STOP_GRACE_S},
        ),
    )
    ck = drill.checkpoint_dir(primary)
    drill.wait_for_event(primary, "stall_injected")
    before = _snapshot(ck)
    drill.handle.submit(f"{second}.toml", job_text(params, second, primary))
    second_status = drill.handle.wait(second, timeout=30)
    hand_file = drill.out / "hand-started-job.toml"
    hand_file.write_text(job_text(params, primary, primary))
    hand = subprocess.run(
        worker_argv(hand_file, ck),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    hand_events = [json.loads(line) for line in hand.stdout.splitlines() if line.startswith("{")]
    hand_failure: dict[str, Any] = next((e for e in hand_events if e.get("event") == "failed"), {})
    after = _snapshot(ck)
    primary_pid = drill.handle.ask("status", job=primary)["pid"]
    # The worker sleeps in its injected stall and cannot act on SIGTERM there, so the
    # daemon's SIGKILL ends it after the grace; it committed before holding, losing nothing.
    drill.handle.ask("stop", job=primary)
    stopped = drill.handle.wait(primary, ("preempted", *SETTLED_STATES), timeout=60)
    drill.handle.ask("resume", job=primary)
    drill.handle.wait(primary)
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
        Check(
            "final checkpoints are equal",
            arrays_equal(final_file(drill.events(reference)), final_file(drill.events(primary))),
            {},
        ),
    ]
    return checks, {
        "job": primary,
        "second_job": second,
        "reference": reference,
        "all_hashes_equal": report.proven,
        "runbook": drill.runbook(refusal or {}),
    }


def incompatible(drill: Drill) -> Outcome:
    """A resume with a changed learning rate is refused naming the field; escalated, no fallback."""
    params = drill.params
    first, retry = drill.job_id("original"), drill.job_id("changed-lr")
    drill.handle.submit(
        f"{first}.toml",
        job_text(
            params,
            first,
            first,
            faults={"fail_after": params.fail_after},
            supervision={"max_restarts": 0},
        ),
    )
    drill.handle.wait(first)
    ck = drill.checkpoint_dir(first)
    before = _snapshot(ck)
    drill.handle.submit(
        f"{retry}.toml", job_text(params, retry, first, train={"learning_rate": 0.05})
    )
    status = drill.handle.wait(retry)
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
    drill.plot(rows, "incompatible: the original run before its failure")
    fields = (failure.get("fields") or {}) if failure else {}
    checks = [
        Check(
            "the resume is refused as incompatible, naming learning_rate with both values",
            failure is not None
            and failure["code"] == "checkpoint.config"
            and fields.get("learning_rate") == [0.04, 0.05],
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


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name.startswith("ckpt-")
    }
