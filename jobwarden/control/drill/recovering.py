"""The drills a daemon must recover from: a crash, a stall, a damaged newest checkpoint.

Each faults a job, lets the daemon recover it, and checks that the continuation restored the
expected checkpoint and replayed every update after it bit for bit.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jobwarden.checkpoint.lock import read_generation
from jobwarden.control.drill.context import Drill, arrays_equal, final_file, job_text
from jobwarden.control.drill.verdict import Check, Outcome

STALL_TIMEOUT_S = 2.0
STALL_OVERSHOOT_S = 0.25
# The corrupt drill's restart backoff, the daemon's default: the drill does not wait it out
# (it damages the file as soon as it is committed) and checks it was in time.
CORRUPT_BACKOFF_S = 0.5


def _restore_point(step: int, every: int) -> int:
    return (step // every) * every


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
    ref_final = final_file(drill.events(reference))
    job_final = final_file(events)
    steps = list(range(expected_restore + 1, drill.params.steps + 1))
    checks = [
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
        Check(
            "final checkpoints are equal",
            arrays_equal(ref_final, job_final),
            {"reference": str(ref_final), "resumed": str(job_final)},
        ),
        Check(
            "job completed",
            status["state"] == "completed",
            {"state": status["state"], "reason": status["reason"]},
        ),
    ]
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


def crash(drill: Drill) -> Outcome:
    """The failure after update N, the committed checkpoint chosen, every replayed hash."""
    params = drill.params
    job = drill.job_id("crash")
    drill.handle.submit(
        f"{job}.toml", job_text(params, job, job, faults={"fail_after": params.fail_after})
    )
    drill.handle.wait(job)
    reference, ref_status = drill.reference()
    failure = next((e for e in drill.attempt_events(job, 1) if e.kind == "failed"), None)
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
            failure is not None and failure.get("step") == params.fail_after,
            {
                "failed_after": failure.get("step") if failure else None,
                "code": failure.get("code") if failure else None,
            },
        ),
        verified,
    ]
    more, summary = _continuation_checks(
        drill, reference, job, _restore_point(params.fail_after, params.checkpoint_every), incident
    )
    drill.write("refusals.json", [])
    return checks + more, summary


def stall(drill: Drill) -> Outcome:
    """A hang before update stall_at+1: detected in time, stack dumped, resumed, verified."""
    params = drill.params
    job = drill.job_id("stall")
    drill.handle.submit(
        f"{job}.toml",
        job_text(
            params,
            job,
            job,
            faults={"stall_at": params.stall_at, "stall_seconds": 60},
            supervision={"stall_timeout_s": STALL_TIMEOUT_S},
        ),
    )
    drill.handle.wait(job)
    reference, _ = drill.reference()
    incidents = drill.keep_incidents(job)
    verified, incident = _daemon_verified(incidents, "stall")
    details = incident.get("details", {})
    gap = details.get("gap_s")
    dump = details.get("stack_dump") or ""
    checks = [
        Check(
            "stall detected within the timeout",
            gap is not None and STALL_TIMEOUT_S <= gap <= STALL_TIMEOUT_S + STALL_OVERSHOOT_S,
            {
                "gap_s": gap,
                "timeout_s": STALL_TIMEOUT_S,
                "overshoot_ms": round((gap - STALL_TIMEOUT_S) * 1000, 1) if gap else None,
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
        verified,
    ]
    more, summary = _continuation_checks(
        drill, reference, job, _restore_point(params.stall_at, params.checkpoint_every), incident
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
    params = drill.params
    every = params.checkpoint_every
    fail_after = params.fail_after if params.fail_after >= 2 * every else 2 * every + 1
    job = drill.job_id("corrupt")
    drill.handle.submit(
        f"{job}.toml",
        job_text(
            params,
            job,
            job,
            faults={"fail_after": fail_after},
            supervision={"restart_backoff_s": CORRUPT_BACKOFF_S},
        ),
    )
    ck = drill.checkpoint_dir(job)
    committed = drill.wait_for_event(job, "checkpoint", step=_restore_point(fail_after, every))
    newest = sorted(ck.glob("ckpt-*.safetensors"))[-1]
    damaged = bytearray(newest.read_bytes())
    damaged[-1] ^= 0xFF
    newest.write_bytes(bytes(damaged))
    reaction_s = time.time() - committed["time"]
    # A worker chooses its checkpoint holding the directory's writer lock, and each taking of
    # the lock bumps the generation: still the first attempt's, no recovery has chosen yet.
    first = next(e for e in drill.attempt_events(job, 1) if e.kind == "ready")["generation"]
    generation = read_generation(ck)
    drill.handle.wait(job)
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
    older = _restore_point(fail_after, every) - every
    more, summary = _continuation_checks(drill, reference, job, older, incident)
    return checks + more, {**summary, "damaged": newest.name}
