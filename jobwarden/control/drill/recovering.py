"""The drills a daemon must recover from: a crash, a stall, a damaged newest checkpoint.

Each faults a job, lets the daemon recover it, and checks that the continuation restored the
expected checkpoint and replayed every update after it bit for bit.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from jobwarden.checkpoint.lock import read_generation
from jobwarden.control.drill.context import Drill, final_check
from jobwarden.control.drill.members import (
    aimed,
    crash_checks,
    drilled,
    member_checks,
    member_events,
    stall_checks,
)
from jobwarden.control.drill.verdict import Check, Outcome

# The stall drill's timeout (a user's slower job gets a longer one, `_stall_timeout`), and how
# long its injected hang lasts at least: far past any timeout.
STALL_TIMEOUT_S = 2.0
STALL_HOLD_S = 60.0
STALL_OVERSHOOT_S = 0.25
# The corrupt drill's restart backoff, the daemon's default: the drill does not wait it out
# (it damages the file as soon as it is committed) and checks it was in time.
CORRUPT_BACKOFF_S = 0.5


def _continuation_checks(
    drill: Drill, reference: str, job: str, expected_restore: int, incident: dict[str, Any]
) -> tuple[list[Check], dict[str, Any]]:
    """The checks every recovering drill shares: restore point, replay, equality, completion.

    Also keeps the evidence they share: the accepted checkpoint and the timeline.
    """
    events = drill.events(job)
    restored = [e for e in events if e.kind == "restored"]
    report = drill.verify(reference, job)
    rows = drill.comparison(reference, job)
    status = drill.handle.ask("status", job=job)
    steps = list(range(expected_restore + 1, drill.points.steps + 1))
    first_attempt = next((c for c in report.checks if c.name == "attempt 1: state hashes"), None)
    checks = [
        Check(
            "the first attempt matched the reference until its fault (the run is deterministic)",
            first_attempt is not None and first_attempt.ok,
            {
                "detail": first_attempt.detail if first_attempt else "no updates logged",
                "first_divergence": report.first_divergence,
            },
        ),
        Check(
            "recovery restored the expected checkpoint",
            bool(restored) and restored[-1]["step"] == expected_restore,
            {
                "restored_step": restored[-1]["step"] if restored else None,
                "expected": expected_restore,
            },
        ),
        Check(
            "replayed the updates after it",
            report.replayed_steps == steps,
            {"replayed_steps": report.replayed_steps, "expected": steps},
        ),
        Check(
            "every resumed update's full state equals the reference's",
            report.proven and bool(rows) and all(r["equal"] for r in rows),
            {
                "compared": len(rows),
                "first_divergence": report.first_divergence,
                "failed_verify_checks": [c.name for c in report.checks if not c.ok],
            },
        ),
        final_check(drill.events(reference), events),
        Check(
            "job completed",
            status["state"] == "completed",
            {"state": status["state"], "reason": status["reason"]},
        ),
    ]
    per_member, members = member_checks(drill, reference, job, expected_restore, incident)
    checks += per_member
    drill.plot(rows, f"{drill.out.name}: resumed steps")
    drill.accepted_checkpoint(job)
    drill.timeline(job)
    summary = {
        "restored_step": restored[-1]["step"] if restored else None,
        "replayed_steps": report.replayed_steps,
        "all_hashes_equal": bool(rows) and all(r["equal"] for r in rows),
        "job": job,
        "reference": reference,
        "runbook": drill.runbook(incident),
        "processes": drill.job.processes,
        **({"members": members} if members else {}),
    }
    return checks, summary


def _daemon_verified(incidents: list[dict[str, Any]], kind: str) -> tuple[Check, dict[str, Any]]:
    incident = next((i for i in incidents if i["kind"] == kind), None)
    verification = (incident or {}).get("verification") or {}
    check = Check(
        f"the daemon opened a {kind} incident and verified the replay against the "
        "failed attempt's log",
        incident is not None and incident["status"] == "verified",
        {
            "incident": incident["id"] if incident else None,
            "status": incident["status"] if incident else None,
            "checks": len(verification.get("checks", [])),
            "mismatch": verification.get("verdict") == "mismatch",
        },
    )
    return check, incident or {}


def _stall_timeout(drill: Drill) -> float:
    """The stall drill's timeout: the job file's own when it sets one; for the default job,
    `STALL_TIMEOUT_S`; for a user's job, that or three times the slowest update of the
    reference run, whichever is longer, so that a slow update (one that compiles, say) is
    not taken for the stall."""
    if drill.job.stall_timeout_s is not None:
        return drill.job.stall_timeout_s
    if drill.job.is_default:
        return STALL_TIMEOUT_S
    reference, _ = drill.reference()
    updates = [e.get("update_s") for e in drill.events(reference) if e.kind == "progress"]
    slowest = max((u for u in updates if isinstance(u, int | float)), default=0.0)
    return max(STALL_TIMEOUT_S, math.ceil(slowest * 3 * 2) / 2)


def crash(drill: Drill) -> Outcome:
    """The failure after update N, the committed checkpoint chosen, every replayed hash."""
    points = drill.points
    job = drill.job_id("crash")
    drill.submit(job, faults=aimed(drill, {"fail_after": points.fail_after}))
    drill.wait(job)
    reference, ref_status = drill.reference()
    first = member_events(drill, job, drilled(drill), last_attempt=1)
    failure = next((e for e in first if e.kind == "failed"), None)
    incidents = drill.keep_incidents(job)
    verified, incident = _daemon_verified(incidents, "crash")
    checks = [
        Check(
            "reference completed",
            ref_status["state"] == "completed",
            {"state": ref_status["state"]},
        ),
        Check(
            "the injected failure came after the named update",
            failure is not None and failure.get("step") == points.fail_after,
            {
                "failed_after": failure.get("step") if failure else None,
                "code": failure.get("code") if failure else None,
            },
        ),
        *crash_checks(drill, job),
        verified,
    ]
    more, summary = _continuation_checks(
        drill, reference, job, points.restore_point(points.fail_after), incident
    )
    drill.write("refusals.json", [])
    return checks + more, summary


def stall(drill: Drill) -> Outcome:
    """A hang before update stall_at+1: detected in time, stack dumped, resumed, verified."""
    points = drill.points
    timeout = _stall_timeout(drill)
    job = drill.job_id("stall")
    drill.submit(
        job,
        faults=aimed(
            drill, {"stall_at": points.stall_at, "stall_seconds": max(STALL_HOLD_S, 10 * timeout)}
        ),
        supervision={"stall_timeout_s": timeout},
    )
    drill.wait(job)
    reference, _ = drill.reference()
    incidents = drill.keep_incidents(job)
    verified, incident = _daemon_verified(incidents, "stall")
    details = incident.get("details", {})
    gap = details.get("gap_s")
    dump = details.get("stack_dump") or ""
    checks = [
        Check(
            "stall detected within the timeout",
            gap is not None and timeout <= gap <= timeout + STALL_OVERSHOOT_S,
            {
                "gap_s": gap,
                "timeout_s": timeout,
                "overshoot_ms": round((gap - timeout) * 1000, 1) if gap else None,
                "last_progress_step": (details.get("last_progress") or {}).get("step"),
            },
        ),
        Check(
            "a stack dump of every worker thread was taken",
            "Thread 0x" in dump or "Current thread" in dump,
            {
                "stack_dump_file": incident.get("evidence", {}).get("stack dump"),
                "lines": len(dump.splitlines()),
                "psutil_status": details.get("psutil_status"),
                "cpu_during_gap": details.get("cpu_during_gap"),
            },
        ),
        *stall_checks(drill, job, incident),
        verified,
    ]
    more, summary = _continuation_checks(
        drill, reference, job, points.restore_point(points.stall_at), incident
    )
    drill.write("refusals.json", [])
    return checks + more, {**summary, "detected_gap_s": gap}


def corrupt(drill: Drill) -> Outcome:
    """The newest checkpoint damaged on disk: refused by checksum, quarantined, older one used.

    The first attempt commits its newest checkpoint and then only runs on to its failure:
    it never touches that file again, and the recovery attempt cannot begin before it has
    failed and its worker has taken the directory's writer lock.  So the file is damaged as
    soon as its commit is reported, and a check confirms that no other worker had taken the
    lock by then.
    """
    points = drill.points
    fail_after = points.corrupt_after
    job = drill.job_id("corrupt")
    drill.submit(
        job,
        faults={"fail_after": fail_after},
        supervision={"restart_backoff_s": CORRUPT_BACKOFF_S},
    )
    ck = drill.checkpoint_dir(job)
    committed = drill.wait_for_event(job, "checkpoint", step=points.restore_point(fail_after))
    newest = sorted(ck.glob("ckpt-*.safetensors"))[-1]
    damaged = bytearray(newest.read_bytes())
    damaged[-1] ^= 0xFF
    newest.write_bytes(bytes(damaged))
    reaction_s = time.time() - committed["time"]
    # A worker chooses its checkpoint holding the directory's writer lock, and each taking of
    # the lock bumps the generation: still the first attempt's, no recovery has chosen yet.
    first = next(e for e in drill.attempt_events(job, 1) if e.kind == "ready")["generation"]
    generation = read_generation(ck)
    drill.wait(job)
    reference, _ = drill.reference()
    kept = ck / "quarantine" / newest.name
    reason_file = ck / "quarantine" / f"{newest.name}.reason.json"
    reason = json.loads(reason_file.read_text()) if reason_file.exists() else {}
    restored = [e for e in drill.events(job) if e.kind == "restored"]
    skipped = restored[-1]["skipped"] if restored else []
    incidents = drill.keep_incidents(job)
    verified, incident = _daemon_verified(incidents, "crash")
    drill.write("refusals.json", {"quarantine_reason": reason, "skipped": skipped})
    checks = [
        Check(
            "the newest checkpoint was damaged before the recovery attempt could read it",
            generation == first and Path(committed["file"]).name == newest.name,
            {
                "committed": committed["file"],
                "damaged_s_after_commit": round(reaction_s, 3),
                "writer_generation": generation,
                "first_attempt_generation": first,
            },
        ),
        Check(
            "the damaged newest checkpoint is refused with the checksum error",
            any(s["file"] == newest.name and s["code"] == "checkpoint.checksum" for s in skipped),
            {"damaged": newest.name, "skipped": skipped},
        ),
        Check(
            "it is preserved byte-for-byte in quarantine",
            kept.exists() and kept.read_bytes() == bytes(damaged),
            {"quarantined_to": str(kept), "reason": reason.get("code")},
        ),
        Check(
            "the fallback is recorded in the incident",
            any(name.startswith("quarantined") for name in incident.get("evidence", {})),
            {"evidence": incident.get("evidence")},
        ),
        verified,
    ]
    older = points.restore_point(fail_after) - points.checkpoint_every
    more, summary = _continuation_checks(drill, reference, job, older, incident)
    return checks + more, {**summary, "damaged": newest.name}
