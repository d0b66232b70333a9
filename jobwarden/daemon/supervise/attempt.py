"""A live attempt of a job, as its supervisor sees it, and the one place its launch is prepared.

A task job runs the built-in worker on the attempt's job file.  A command job
runs its own argv in its workdir (default: the attempt's folder), with the
job's ``env`` laid over the daemon's allow-listed worker environment and
``JOBWARDEN_RUN_FILE`` naming the attempt's ``run.json``: a
`jobwarden.sdk.RunFile` that tells the program its checkpoint directory and the
``[run]`` and ``[faults]`` fields its job file sets (faults only in the first
attempt).

An attempt's malformed event lines reach the daemon's log at a bounded rate
(`MalformedLines`).  A program that prints to stdout what is not an event (a
command job left at ``sdk = true``, a stray ``print``) may write thousands of
lines a second.  Each line is kept verbatim in the attempt's events file and counted; the daemon's
own log hears of the first `FIRST_LINES` one by one, then of the rest in one
``event.malformed_summary`` record at most every `SUMMARY_EVERY_S` and when the
attempt ends.  So no job can grow ``wardend.log`` by more than a few records a
minute, nor hold the loop writing them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.incidents.records import Incident
from jobwarden.daemon.launch.base import LaunchSpec, RunningAttempt, inherited
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.supervise.heartbeat import Heartbeat
from jobwarden.daemon.supervise.policy import AttemptReport, StopReason, supersedes
from jobwarden.daemon.supervise.stall import StallWatch
from jobwarden.daemon.supervise.verification import ReplayVerifier
from jobwarden.events import Event, Malformed
from jobwarden.files import write_text_atomic
from jobwarden.jobfile import Job
from jobwarden.jobfolder import EVENTS_FILE, JOB_FILE, OUTPUT_FILE
from jobwarden.program import Program
from jobwarden.proof.replay import Verdict
from jobwarden.sdk.settings import RUN_FILE_ENV, RunFile
from jobwarden.worker.command import WorkerCall

log = structlog.get_logger("wardend.supervisor")

CPU_MARK_EVERY_S = 0.5
RUN_FILE = "run.json"


def prepare(
    root: Root, record: JobRecord, cache: Path, signing_key: Path | None, env: dict[str, str]
) -> LaunchSpec:
    """Write the attempt's folder and job file (faults only in the first attempt), and the
    launch spec: the worker on them, or the job's own program and its run file."""
    folder = root.attempt(record.id, record.attempt)
    folder.parent.mkdir(mode=0o700, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    job = record.job if record.attempt == 1 else record.job.without_faults()
    job_file = folder / JOB_FILE
    write_text_atomic(job_file, json.dumps(job.to_record(), indent=2) + "\n")
    checkpoint_dir = root.checkpoints / record.checkpoint
    env = inherited(env, job)
    program = job.program
    if program is None:
        call = WorkerCall(job_file, checkpoint_dir, cache, signing_key)
        return LaunchSpec(
            record.id,
            record.attempt,
            folder,
            call.argv(),
            dict(env),
            processes=job.run.processes,
            job=job,
            worker=call,
        )
    if not program.sdk:  # the SDK makes its own, private; a plain program finds it made
        checkpoint_dir.mkdir(mode=0o700, exist_ok=True)
    run_file = folder / RUN_FILE
    write_text_atomic(run_file, run_file_text(job, checkpoint_dir, cache, signing_key))
    return LaunchSpec(
        record.id,
        record.attempt,
        folder,
        list(program.argv),
        program_environment(env, program, run_file),
        cwd=Path(program.workdir) if program.workdir is not None else folder,
        stdout=stdout_name(job),
        processes=job.run.processes,
        job=job,
    )


def stdout_name(job: Job) -> str:
    """The file of an attempt's folder that keeps its stdout: events, or a plain program's
    own output."""
    return EVENTS_FILE if job.emits_events else OUTPUT_FILE


def output_entry(raw: bytes) -> dict[str, Any]:
    """One line of a plain program's ``output.log``, as the ``events`` command gives it."""
    return {"event": "output", "line": raw.decode(errors="replace")}


def run_file_text(job: Job, checkpoint_dir: Path, cache: Path, signing_key: Path | None) -> str:
    """The `RunFile` of one attempt of a command job, as JSON.

    Only the fields the job file sets are written (``exclude_unset``), so the
    program's own settings stand for the rest (docs/sdk.md, "Settings").
    """
    given: dict[str, Any] = {"signing_key": str(signing_key)} if signing_key else {}
    document = RunFile(
        v=1,
        checkpoint_dir=str(checkpoint_dir),
        job_id=job.id,
        run=job.run,
        faults=job.faults,
        compile_cache=str(cache),
        **given,
    )
    return document.model_dump_json(exclude_unset=True, indent=2) + "\n"


def program_environment(
    base: Mapping[str, str], program: Program, run_file: Path
) -> dict[str, str]:
    """A command job's environment: the allow-listed ``base``, the job's ``env`` over it,
    and ``JOBWARDEN_RUN_FILE`` (the launcher adds ``JOBWARDEN_SUPERVISOR_PID``)."""
    return {**base, **program.env, RUN_FILE_ENV: str(run_file)}


@dataclass
class Attempt:
    """One live attempt of a job, with what its supervisor has learned from its events."""

    record: JobRecord
    number: int
    running: RunningAttempt
    stall: StallWatch
    verifier: ReplayVerifier | None = None
    failure: Event | None = None
    completed: bool = False
    stop_reason: StopReason | None = None
    superseded: StopReason | None = None
    """The stop under way that ``stop_reason`` took the place of (a stall, say), if any."""
    last_event: dict[str, Any] | None = None
    last_progress: dict[str, Any] | None = None
    checkpoint: tuple[int, str] | None = None
    restored: tuple[int, bool] | None = None
    """The step its ``restored`` event named, and whether an external checkpointer's."""
    cpu_mark: tuple[float, float] | None = None
    stall_evidence: dict[str, Any] | None = None
    heartbeat: Heartbeat | None = None
    """A plain program's heartbeat watch (None for a job that emits events)."""
    sample: dict[str, Any] = field(default_factory=dict)
    """The newest psutil sample of the attempt (the job record's is cleared when it ends)."""
    malformed: MalformedLines | None = None
    """Its malformed event lines, as the daemon's log is told of them (made at the first)."""
    exit_files: dict[str, str] = field(default_factory=dict)
    """What its folder keeps of its end (exit.json, its phases), by name, once it has ended."""

    @property
    def folder(self) -> Path:
        """The attempt's evidence folder (stdout, stderr.log, exit.json, job.json, run.json)."""
        return self.running.spec.folder

    @property
    def stdout(self) -> Path:
        """The file holding the attempt's stdout: events.jsonl, or a plain program's output.log."""
        return self.folder / self.running.spec.stdout

    @property
    def incident(self) -> Incident | None:
        """The incident this attempt recovers from, until its replay is settled."""
        verifier = self.verifier
        return verifier.incident if verifier and verifier.verdict is Verdict.PENDING else None

    def observe(self, event: Event) -> None:
        """Learn from one event: the stall watch follows it into the phase it begins."""
        self.last_event = {k: v for k, v in event.fields.items() if k != "components"}
        kind = event.kind
        self.stall.observe(event)
        if kind in ("ready", "completed") and isinstance(event.get("step"), int):
            self.record.step = event["step"]  # a resumed run may end with no new update
        if kind == "started":
            self.record.program_run = reported_run(event) or self.record.program_run
        elif kind == "progress":
            self.last_progress = self.last_event
            self.mark_cpu()
        elif kind == "checkpoint":
            self.checkpoint = (event["step"], event["file"])
        elif kind == "restored" and self.restored is None:
            self.restored = (event["step"], event.fields.get("checkpointer") == "external")
        elif kind == "completed":
            self.completed = True
        elif kind == "failed":
            self.failure = event

    def beat(self, stall_timeout_s: float | None) -> None:
        """A plain program's heartbeat: forward motion, as ``progress`` is for an SDK program."""
        self.stall.alive(stall_timeout_s)
        self.mark_cpu()

    def mark_cpu(self) -> None:
        """Note the CPU time used so far, at most every half second, for stall evidence."""
        now = time.monotonic()
        if self.cpu_mark is None or now - self.cpu_mark[0] > CPU_MARK_EVERY_S:
            cpu = self.running.sample().get("cpu_s")
            if cpu is not None:
                self.cpu_mark = (now, cpu)

    def stopping(self, reason: StopReason) -> bool:
        """Record that the daemon stops this attempt for ``reason``; False if it has ended, or
        is stopping already for a reason that ``reason`` does not outrank (`supersedes`)."""
        before = self.stop_reason
        if self.running.exit_info is not None or (
            before is not None and not supersedes(reason, before)
        ):
            return False
        if before is not None:
            self.superseded = before
        self.stop_reason = reason
        return True

    def killed_from_outside(self) -> str | None:
        """The signal that ended the attempt if the daemon did not stop it and it reported
        no failure."""
        info = self.running.exit_info
        if info is None or self.stop_reason is not None or self.failure is not None:
            return None
        return info.signal

    def report(self) -> AttemptReport:
        """What the policy is told about this attempt."""
        failure = self.failure
        return AttemptReport(
            number=self.number,
            completed=self.completed,
            failure_code=failure["code"] if failure is not None else None,
            failure_message=failure["message"] if failure is not None else None,
            stopped_by=self.stop_reason,
            mismatch_step=self.verifier.mismatch_step if self.verifier is not None else None,
            emits_events=self.record.job.emits_events,
            restored_step=self.restored[0] if self.restored is not None else None,
            external_checkpoints=self.restored is not None and self.restored[1],
            committed_step=self.checkpoint[0] if self.checkpoint is not None else None,
            last_step=self.last_progress["step"] if self.last_progress is not None else None,
            checkpoint_every=self.record.run_setting("checkpoint_every") or 1,
            events_seen=self.last_event is not None,
            stray_lines=self.malformed.seen if self.malformed is not None else 0,
        )


def reported_run(event: Event) -> dict[str, int] | None:
    """The ``steps`` and ``checkpoint_every`` a ``started`` event's ``run`` holds, if any."""
    run = event.get("run")
    if not isinstance(run, dict):
        return None
    found = {k: run[k] for k in RUN_REPORTED if isinstance(run.get(k), int)}
    return found or None


RUN_REPORTED = ("steps", "checkpoint_every")
"""The program's own settings the daemon keeps in the job's record."""


# ---- malformed lines

FIRST_LINES = 20
"""Malformed lines of one attempt logged one by one, before they are summarised."""
SUMMARY_EVERY_S = 10.0
"""At most one summary record per attempt in this long."""


@dataclass
class MalformedLines:
    """One attempt's malformed lines: counted, the first logged, the rest summarised."""

    job: str
    attempt: int
    clock: Callable[[], float] = time.monotonic
    seen: int = 0
    unlogged: int = 0
    last_reason: str = ""
    last_line: int = 0
    summarised_at: float | None = None

    def note(self, line: Malformed) -> None:
        """One malformed line: logged while few, else counted for the next summary."""
        self.seen += 1
        if self.seen <= FIRST_LINES:
            log.warning(
                "event.malformed",
                job=self.job,
                attempt=self.attempt,
                line=line.lineno,
                reason=line.reason,
                **({"further": "summarised"} if self.seen == FIRST_LINES else {}),
            )
            return
        self.unlogged += 1
        self.last_reason, self.last_line = line.reason, line.lineno
        now = self.clock()
        if self.summarised_at is None or now - self.summarised_at >= SUMMARY_EVERY_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Log the lines not yet told of in one record (at the attempt's end, and on a timer)."""
        if not self.unlogged:
            return
        log.warning(
            "event.malformed_summary",
            job=self.job,
            attempt=self.attempt,
            lines=self.unlogged,
            total=self.seen,
            last_line=self.last_line,
            last_reason=self.last_reason,
        )
        self.unlogged = 0
        self.summarised_at = self.clock() if now is None else now
