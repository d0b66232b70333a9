"""The five drills: crash, stall, duplicate writer, corrupt and incompatible checkpoints.

Each returns its checks and a summary; `Drill` keeps the evidence beside them.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from jobwarden.control.drill.context import (
    Check,
    Drill,
    arrays_equal,
    final_file,
    job_text,
)
from jobwarden.errors import WriterLockedError
from jobwarden.events import Event
from jobwarden.worker.command import worker_argv

Outcome = tuple[list[Check], dict[str, Any]]
STALL_TIMEOUT_S = 2.0
STALL_OVERSHOOT_S = 0.25


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
        "runbook": _runbook(drill, incident),
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
    reference, ref_status = drill.reference()
    job = drill.job_id("crash")
    drill.handle.submit(
        f"{job}.toml", job_text(params, job, job, faults={"fail_after": params.fail_after})
    )
    drill.handle.wait(job)
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
    reference, _ = drill.reference()
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


def duplicate_writer(drill: Drill) -> Outcome:
    """A second job and a hand-started worker on a live job's checkpoint are both refused."""
    params = drill.params
    reference, _ = drill.reference()
    primary, second = drill.job_id("primary"), drill.job_id("second")
    pause = max(1, params.checkpoint_every)
    drill.handle.submit(
        f"{primary}.toml",
        job_text(
            params,
            primary,
            primary,
            faults={"stall_at": pause, "stall_seconds": 8},
            supervision={"stall_timeout_s": 60},
        ),
    )
    ck = drill.checkpoint_dir(primary)
    _wait_for_event(drill, primary, "stall_injected")
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
    drill.handle.wait(primary)
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
            {"failed_verify_checks": [c.name for c in report.checks if not c.ok]},
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
        "runbook": str(drill.out / f"runbook-{refusal['id']}.md") if refusal else None,
    }


def corrupt(drill: Drill) -> Outcome:
    """The newest checkpoint damaged on disk: refused by checksum, quarantined, older one used."""
    params = drill.params
    every = params.checkpoint_every
    fail_after = params.fail_after if params.fail_after >= 2 * every else 2 * every + 1
    reference, _ = drill.reference()
    job = drill.job_id("corrupt")
    drill.handle.submit(
        f"{job}.toml",
        job_text(
            params,
            job,
            job,
            faults={"fail_after": fail_after},
            supervision={"restart_backoff_s": 3.0},
        ),
    )
    drill.handle.wait(job, ("recovering",), timeout=120)
    ck = drill.checkpoint_dir(job)
    newest = sorted(ck.glob("ckpt-*.safetensors"))[-1]
    damaged = bytearray(newest.read_bytes())
    damaged[-1] ^= 0xFF
    newest.write_bytes(bytes(damaged))
    drill.handle.wait(job)
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


def incompatible(drill: Drill) -> Outcome:
    """A resume with a changed learning rate is refused naming the field; escalated, no fallback."""
    params = drill.params
    reference, _ = drill.reference()
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
        "runbook": _runbook(drill, incident or {}),
    }


def _runbook(drill: Drill, incident: dict[str, Any]) -> str | None:
    return str(drill.out / f"runbook-{incident['id']}.md") if incident.get("id") else None


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name.startswith("ckpt-")
    }


def _wait_for_event(drill: Drill, job: str, kind: str, timeout: float = 120) -> Event:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in drill.attempt_events(job, 1):
            if event.kind == kind:
                return event
        time.sleep(0.05)
    raise TimeoutError(f"job {job} emitted no {kind} event within {timeout} s")


DRILLS = {
    "crash": crash,
    "stall": stall,
    "duplicate-writer": duplicate_writer,
    "corrupt": corrupt,
    "incompatible": incompatible,
}
