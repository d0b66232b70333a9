"""Diagnosis: how an attempt's failure reads, and the evidence it leaves.

Functions of the attempt's evidence that build incidents; what *kind* of
failure it was, and what follows, is the policy's (`daemon.policy`).  The texts
name what the job runs (its task, or its command); a plain program's are in
`daemon.plain`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jobwarden.checkpoint.store import CheckpointStore
from jobwarden.daemon.incidents import members
from jobwarden.daemon.incidents.records import Incident
from jobwarden.daemon.launch.base import ExitInfo
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.supervise import budget, plain
from jobwarden.daemon.supervise.attempt import Attempt
from jobwarden.daemon.supervise.phases import awaited
from jobwarden.daemon.supervise.policy import Fail
from jobwarden.daemon.supervise.stallevidence import STALL_KILL_GRACE_S
from jobwarden.daemon.supervise.verification import ReplayVerifier
from jobwarden.errors import IncidentKind
from jobwarden.events import Event
from jobwarden.jobfolder import EVENTS_FILE, OUTPUT_FILE, member_file
from jobwarden.jobfolder import STDERR_FILE as STDERR
from jobwarden.proof.replay import ReplayPlan
from jobwarden.states import JobState

K = IncidentKind


INJECTED_AS = {
    K.CRASH: ("fail_after", "crash_after", "crash_in_commit", "crash_every_s"),
    K.STALL: ("stall_at",),
}
"""The drill faults that cause each kind of failure."""


def escalation_reason(attempt: Attempt, kind: IncidentKind) -> str:
    """Why an escalated failure needs a person, in one sentence."""
    failure = attempt.failure
    message = failure["message"] if failure is not None else "no failure event"
    if kind is K.INVALID_REQUEST and attempt.last_event is None:  # no SDK, as policy says
        stray = attempt.malformed.seen if attempt.malformed is not None else 0
        return (
            f"its stdout carried no jobwarden event ({stray} lines that are no events) and "
            "it exited 0: the program does not use jobwarden.sdk. Set `sdk = false` in its "
            "job file (docs/jobfile.md) and submit it again (`wardenctl submit --replace`)."
        )
    return {
        K.INCOMPATIBLE_CHECKPOINT: f"the checkpoint is incompatible ({message}).",
        K.CORRUPT_CHECKPOINT: f"no usable checkpoint is left ({message}).",
        K.DUPLICATE_WRITER: f"another process writes this checkpoint directory ({message}).",
    }.get(kind, f"{message}.")


def start_fresh(job_id: str) -> str:
    """How a person starts a job again from a changed job file, once they have decided."""
    return (
        f"To start fresh instead (a changed job file, a new checkpoint name): "
        f"`wardenctl remove {job_id}` (the job folder is archived whole), then "
        f"`wardenctl submit FILE`; or `wardenctl submit --replace FILE` in one step."
    )


def escalated_text(attempt: Attempt, kind: IncidentKind) -> str:
    """The outcome of an escalated failure."""
    return (
        f"Escalated: {escalation_reason(attempt, kind)} No fallback, no relaxed checks, "
        "no restart; a person decides, then `wardenctl resume` to retry as it is. "
        + start_fresh(attempt.record.id)
    )


def failed_text(record: JobRecord, outcome: Fail) -> str:
    """The outcome of a failure with the restart budget spent, and what spent it."""
    sup = record.job.supervision
    if outcome.loop is not None:
        return (
            f"Failed: {outcome.loop.verdict()}; max_restarts is {sup.max_restarts} restarts "
            f"in a row without progress ({record.restarts} restart(s) in all). "
            + outcome.loop.runbook()
        )
    if sup.max_restarts == 0:
        return "Failed: max_restarts is 0, so no restart is made; no further attempt."
    return (
        f"Failed: {sup.restart_limit} failures are allowed within "
        f"{sup.restart_limit_window_s:g} s (restart_limit, restart_limit_window_s) and "
        f"this one was past it, whatever the progress between ({record.restarts} restart(s) "
        "in all): failing this often, the job spends its time starting, not training. "
        "Look at the machine and the incidents' symptoms, then `wardenctl resume`."
    )


def recovered_text(attempt: int, restored_step: int | None) -> str:
    """The outcome of a recovery whose replay was settled without a mismatch."""
    return (
        f"Recovered: attempt {attempt} continues the same experiment from step "
        f"{restored_step}; the job runs on."
    )


def recovery_failed_text(attempt: int, next_incident: str) -> str:
    """The outcome of a recovery whose attempt failed before its replay was settled."""
    return (
        f"The recovery attempt {attempt} failed before its replay was verified; see "
        f"incident {next_incident}."
    )


def recovery_action(attempt: Attempt, verifier: ReplayVerifier, ready: Event) -> dict[str, Any]:
    """What the daemon did to recover, for the incident's Action section."""
    record = attempt.record
    restored = verifier.plan.restored_step
    delay = verifier.incident.details.get("backoff_s", 0.0)
    generation = ready.get("generation")
    pid = attempt.running.pid
    faults = record.job.faults
    drills = "faults still on (every_attempt)" if faults.every_attempt else "faults off"
    return {
        "attempt": attempt.number,
        "pid": pid,
        "writer_generation": generation,
        "text": (
            f"Started attempt {attempt.number} (pid {pid}, writer generation {generation}) "
            f"of {record.job.label()} as the single writer of checkpoint "
            f"'{record.checkpoint}', with {drills}, "
            f"resuming from step {ready['step'] if restored is None else restored} after a "
            f"{delay:.2f} s backoff ({budget.restart_count(record)})."
        ),
    }


def symptom(attempt: Attempt, info: ExitInfo, kind: IncidentKind) -> str:
    """What was seen, from the attempt's own evidence."""
    failure, record = attempt.failure, attempt.record
    last = attempt.last_event or {}
    if not record.job.emits_events:
        return plain.symptom(attempt, info, kind)
    if kind is K.STALL and attempt.stall_evidence is not None:
        ev = attempt.stall_evidence
        cpu = ev.get("cpu_during_gap") or {}
        verdict = (
            "hung (using no CPU)"
            if (cpu.get("percent") or 0) < 20
            else "spinning (busy without progress)"
        )
        member = ev.get("stalled_member") if record.job.run.processes > 1 else None
        return (
            f"Attempt {attempt.number} of job {record.id} ({record.job.label()}) was stuck "
            f"in its {ev['phase']} phase"
            + (f" (member {member}, the one the others waited for)" if member is not None else "")
            + f": no {awaited(ev['phase'], True)} event for {ev['gap_s']:.2f} s (timeout "
            f"{ev['timeout_s']:g} s, overshoot {ev['overshoot_s'] * 1000:.0f} ms) after its "
            f"last event "
            f"({last.get('event')} at step {last.get('step')}). psutil status "
            f"{ev.get('psutil_status')}, CPU {cpu.get('cpu_s')} s over "
            f"{cpu.get('over_s')} s ({cpu.get('percent')}%): the program was {verdict}. "
            f"It was stopped (SIGTERM, {STALL_KILL_GRACE_S:g} s grace, SIGKILL)."
        )
    if kind is K.RSS_LIMIT:
        rss = attempt.sample.get("rss_mb")
        return (
            f"Attempt {attempt.number} of job {record.id} ({record.job.label()}) was stopped "
            f"by the daemon after {info.duration_s:.2f} s: its resident memory, {rss} MB, "
            f"passed [supervision] max_rss_mb = {record.job.supervision.max_rss_mb}. Raise "
            "that field, or remove it (no limit is the default). Its last event was "
            f"{last.get('event')} at step {last.get('step')}."
        )
    how = f"was killed by {info.signal}" if info.signal else f"exited with status {info.status}"
    what = (
        f" ({failure['code']}: {failure['message']})"
        if failure is not None
        else " without a failed event"
    )
    told = members.first_failure(attempt.running.members_view())
    return (
        f"Attempt {attempt.number} of job {record.id} ({record.job.label()}) {how}{what} "
        f"after {info.duration_s:.2f} s; its last event was {last.get('event')} at step "
        f"{last.get('step')}." + (f" {told}" if told else "")
    )


def prevention(attempt: Attempt, kind: IncidentKind, incident: Incident) -> list[str]:
    """Prevention work derived from the failure, kept apart from the restoration."""
    job = attempt.record.job
    faults = job.faults if attempt.number == 1 or job.faults.every_attempt else None
    lines = []
    if not job.emits_events:
        return plain.prevention(attempt, kind, incident)
    injecting = INJECTED_AS.get(kind, ()) if faults is not None else ()
    set_faults = {k: getattr(faults, k) for k in injecting if getattr(faults, k) is not None}
    if set_faults and faults is not None:
        written = ", ".join(
            f"{name} = {json.dumps(value)}"
            for name, value in faults.model_dump(exclude_defaults=True).items()
        )
        lines.append(
            f"This failure was injected by a drill ([faults] {written}); drill "
            "faults apply to the first attempt only. The failure is the drill's, not the "
            "program's (what its recovery found is the program's own); keep [faults] out "
            "of production job files."
        )
    elif kind is K.CRASH and (killed := attempt.killed_from_outside()) is not None:
        rss = attempt.sample.get("rss_mb", "an unknown number of")
        lines.append(
            f"It was killed by {killed}, not by the daemon: a signal leaves no traceback. "
            f"From outside it is usually the kernel's OOM killer (its last sample: {rss} MB "
            "resident; see dmesg, or its cgroup's memory.events), an operator or a node "
            "agent: look there before at the program."
        )
    elif kind is K.CRASH:
        lines.append(
            f"Read the traceback in {incident.evidence['stderr']} and fix the "
            "cause before the next run; a restart only repeats a deterministic "
            "failure."
        )
    elif kind is K.STALL:
        lines.append(
            f"Read the stack dump in {incident.evidence.get('stack dump')}: the "
            "innermost frame of the main thread is where the program waited."
        )
    elif kind is K.RSS_LIMIT:
        lines.append(
            f"Raise [supervision] max_rss_mb (now {job.supervision.max_rss_mb}) "
            "or shrink the state."
        )
    view = attempt.running.members_view()
    if (first := view.get("failed_member")) is not None:
        stderr = attempt.folder / member_file(STDERR, first)
        lines.append(members.runbook_line(first, stderr, members.lost_node(view, first)))
    last = incident.boundary.get("last_logged_step") or 0
    saved = incident.boundary.get("checkpoint_step") or 0
    if last > saved:
        lines.append(
            f"{last - saved} update(s) past the newest checkpoint had to be "
            f"replayed; checkpoint_every = {attempt.record.run_setting('checkpoint_every')} "
            "bounds that loss, lower it if replay costs too much."
        )
    return lines


def failure_incident(
    attempt: Attempt, kind: IncidentKind, symptom_text: str, number: int, checkpoint_dir: Path
) -> Incident:
    """A new incident for a failed attempt: its evidence, failure boundary and prevention."""
    record = attempt.record
    folder = attempt.folder
    incident = Incident(
        id=f"{record.id}-{number}",
        job=record.id,
        kind=kind,
        opened=time.time(),
        attempt=attempt.number,
        symptom=symptom_text,
    )
    bare = not record.job.emits_events
    incident.evidence = {
        "output" if bare else "events": str(attempt.stdout),
        "stderr": str(folder / "stderr.log"),
        "exit": str(folder / "exit.json"),
        "attempt job file": str(folder / "job.json"),
    }
    if record.job.program is not None:
        incident.evidence["run file"] = str(folder / "run.json")
    if attempt.stall_evidence is not None:
        if attempt.stall_evidence["stack_dump_file"] is not None:
            incident.evidence["stack dump"] = attempt.stall_evidence["stack_dump_file"]
        incident.details.update(
            {k: v for k, v in attempt.stall_evidence.items() if k != "stack_dump_file"}
        )
    beat = attempt.heartbeat
    if beat is not None:
        incident.details["heartbeat"] = {
            "beats": beat.beats,
            "last": beat.last_beat,
            "last_time": beat.last_beat_time,
            "output_lines": beat.lines,
            "last_line": beat.last_line,
        }
    plan = ReplayPlan.from_events(attempt.number, folder / EVENTS_FILE)
    checkpoint = attempt.checkpoint
    if checkpoint is None and checkpoint_dir.is_dir() and not bare:
        committed = CheckpointStore(checkpoint_dir).committed()
        checkpoint = (committed[-1][0], str(committed[-1][1])) if committed else None
    incident.boundary = {
        "last_logged_step": plan.last_logged_step,
        "last_logged_hash": plan.logged.get(plan.last_logged_step),
        "checkpoint_step": checkpoint[0] if checkpoint else None,
        "checkpoint_file": checkpoint[1] if checkpoint else None,
    }
    incident.details["last_progress_time"] = plan.last_progress_time or (
        beat.last_beat_time if beat is not None else None
    )
    if attempt.failure is not None:
        incident.details["failure"] = dict(attempt.failure.fields)
    events = attempt.running.events
    if events.lost_bytes:
        incident.details["evidence_lost"] = {
            "file": str(events.path),
            "bytes": events.lost_bytes,
            "error": events.error,
        }
        what, then = (
            ("output", ".")
            if bare
            else ("events", "; the replay proof can only use what was kept.")
        )
        incident.symptom += (
            f" {events.lost_bytes} bytes of its {what} could not be kept in {events.path}: "
            f"{events.error}{then}"
        )
    incident.prevention = prevention(attempt, kind, incident)
    return incident


def restart_incident(
    record: JobRecord, plan: ReplayPlan, folder: Path, previous_pid: int | None, number: int
) -> Incident:
    """The incident of a job found active (or preempted by a stop) when the daemon starts."""
    planned = record.state is JobState.PREEMPTED
    bare = not record.job.emits_events
    logged = "" if bare else f" (last logged update {plan.last_logged_step})"
    text = (
        f"The daemon was stopped and preempted attempt {record.attempt} of "
        f"{record.job.label()} at step {record.step}; the daemon has restarted."
        if planned
        else f"The daemon stopped while attempt {record.attempt} of {record.job.label()} "
        f"was {record.state.value}{logged}; the daemon has restarted and its program "
        f"(pid {previous_pid}) is gone."
    )
    stdout = ("output", OUTPUT_FILE) if bare else ("events", EVENTS_FILE)
    return Incident(
        id=f"{record.id}-{number}",
        job=record.id,
        kind=K.DAEMON_RESTART,
        opened=time.time(),
        attempt=record.attempt,
        symptom=text,
        evidence={stdout[0]: str(folder / stdout[1]), "stderr": str(folder / "stderr.log")},
        boundary={
            "last_logged_step": plan.last_logged_step,
            "last_logged_hash": plan.logged.get(plan.last_logged_step),
            "checkpoint_step": record.newest_checkpoint_step,
            "checkpoint_file": None,
        },
        details={"last_progress_time": plan.last_progress_time},
        prevention=[
            "None needed: a planned stop; each worker committed its current step."
            if planned
            else "Stop the daemon with SIGTERM (systemctl stop) so every worker commits "
            "its current step first."
        ],
    )


def duplicate_writer_incident(
    record: JobRecord, owner: JobRecord, number: int, root: Root
) -> Incident:
    """The incident of a job refused because a live job owns its checkpoint."""
    now = time.time()
    return Incident(
        id=f"{record.id}-{number}",
        job=record.id,
        kind=K.DUPLICATE_WRITER,
        opened=now,
        attempt=record.attempt,
        symptom=(
            f"Job {record.id} asked to write checkpoint '{record.checkpoint}', which live "
            f"job {owner.id} (pid {owner.pid}) owns."
        ),
        evidence={
            "request": str(root.job(record.id) / "job.json"),
            "owner state": str(root.job(owner.id) / "state.json"),
        },
        boundary={
            "checkpoint_step": owner.newest_checkpoint_step,
            "checkpoint_file": str(root.checkpoints / record.checkpoint),
        },
        status="escalated",
        outcome=(
            "Duplicate writer prevented: no worker was started for this job, so the "
            f"checkpoints of {owner.id} are untouched. Escalated for a person to decide "
            "(rename the checkpoint, or resume once the owner has finished). "
            + start_fresh(record.id)
        ),
        prevention=[
            "Give every concurrent job its own checkpoint name; two jobs share a "
            "checkpoint only to continue one another, one after the other."
        ],
        closed=now,
    )
