"""wardend's one loop: it owns every job's state; threads and signals only enqueue.

Intake, scheduling, worker events, exits, stalls, recoveries and control
requests all run on one asyncio loop, so no state is shared across threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import structlog

from jobwarden import __version__
from jobwarden.control.protocol import ControlError
from jobwarden.daemon import commands, diagnosis, notify, spool
from jobwarden.daemon.attempt import Attempt
from jobwarden.daemon.incidents import Incident, IncidentLog
from jobwarden.daemon.jobs import JobRecord, JobTable
from jobwarden.daemon.layout import Root
from jobwarden.daemon.process import ExitInfo, WorkerProcess, worker_argv
from jobwarden.daemon.recovery import ReplayPlan
from jobwarden.daemon.server import ControlServer
from jobwarden.daemon.stall import StallWatch
from jobwarden.daemon.verification import ReplayVerifier
from jobwarden.events import Event, Malformed
from jobwarden.files import write_text_atomic
from jobwarden.jobfile import Job
from jobwarden.states import ACTIVE, JobState

log = structlog.get_logger("wardend")

S = JobState
# A test-only fault: block the loop on SIGUSR2, to show watchdog pings come from the loop.
TEST_FAULT_ENV = "JOBWARDEN_TEST_FAULT"
BLOCK_S = 2.0
ORPHAN_WAIT_S = 60.0


@dataclass
class Options:
    """Daemon settings from the command line."""

    max_concurrent: int = max(1, os.cpu_count() or 1)
    socket: Path | None = None
    group: str | None = None
    rescan_interval_s: float = 5.0
    sample_interval_s: float = 1.0
    compile_cache: Path | None = None
    control_timeout_s: float = 5.0


class Wardend:
    """The supervisor daemon of one root."""

    def __init__(self, root: Root, options: Options) -> None:
        self.root = root
        self.options = options
        self.table = JobTable(root)
        self.incidents = IncidentLog(root)
        self.spool = spool.Spool(root, lambda job_id: job_id in self.table)
        self.queue: deque[str] = deque()
        self.live: dict[str, Attempt] = {}
        self.reserved: set[str] = set()
        self.stopping = asyncio.Event()
        self.shutting_down = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self.started = time.time()
        self.counters: dict[str, int] = {
            "intake_accepted": 0,
            "intake_rejected": 0,
            "malformed_event_lines": 0,
            "stalls_detected": 0,
        }
        self.relaunch: dict[str, asyncio.TimerHandle] = {}
        self.incident_kinds: dict[str, int] = {}
        self.checkpoint_totals: dict[str, float] = {"count": 0, "bytes": 0, "seconds": 0.0}
        self.verifier = ReplayVerifier(self.table, self.incidents)
        self.notifier = notify.Notifier()
        self.last_status = ""
        self.server = ControlServer(
            options.socket or root.socket,
            commands.handlers(self),
            options.group,
            options.control_timeout_s,
        )

    # ---- life cycle

    async def run(self) -> int:
        """Serve until SIGTERM, SIGINT or a shutdown request; returns the exit status."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        if os.environ.get(TEST_FAULT_ENV) == "block_loop_on_sigusr2":
            loop.add_signal_handler(signal.SIGUSR2, time.sleep, BLOCK_S)
        self._resume_from_disk()

        def enqueue(path: Path) -> None:
            loop.call_soon_threadsafe(self.intake, path)

        observer = spool.watch(self.root, enqueue)
        for path in spool.pending_requests(self.root):
            self.intake(path)
        await self.server.start()
        self._spawn(self._every(self.options.rescan_interval_s, self._rescan))
        self._spawn(self._every(self.options.sample_interval_s, self._sample))
        interval = self.notifier.watchdog_interval_s
        if interval is not None:
            self._spawn(self._watchdog(interval))
        self.notifier.ready(self._status_line())
        log.info(
            "wardend.ready",
            root=str(self.root.path),
            pid=os.getpid(),
            socket=str(self.server.path),
            max_concurrent=self.options.max_concurrent,
            version=__version__,
        )
        await self.stopping.wait()
        await self._shutdown()
        observer.stop()
        observer.join(5)
        await self.server.close()
        self.incidents.close()
        log.info("wardend.stopped", pid=os.getpid())
        return 0

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "wardend.task_failed", error=repr(task.exception()), exc_info=task.exception()
            )

    async def _every(self, interval: float, action: Any) -> None:
        while not self.shutting_down:
            await asyncio.sleep(interval)
            action()

    async def _watchdog(self, interval: float) -> None:
        """Ping systemd from the loop itself, shutdown included, until cancelled."""
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    async def _shutdown(self) -> None:
        self.shutting_down = True
        self.notifier.stopping(f"stopping; preempting {len(self.live)} worker(s)")
        for timer in self.relaunch.values():
            timer.cancel()
        self.relaunch.clear()
        log.info("wardend.stopping", live=sorted(self.live))
        stops = [
            a.process.stop("shutdown", a.record.job.supervision.stop_grace_s)
            for a in self.live.values()
        ]
        await asyncio.gather(*stops)
        while self.live:
            await asyncio.sleep(0.01)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    # ---- intake and scheduling

    def intake(self, path: Path) -> Job | spool.Rejection | None:
        """Claim and validate one request file (called on the loop); returns the outcome."""
        if self.shutting_down:
            return None
        try:
            taken = self.spool.take(path)
        except OSError as error:
            log.error("spool.error", file=str(path), error=repr(error))
            return None
        if taken is None:
            return None
        if isinstance(taken, spool.Rejection):
            self.counters["intake_rejected"] += 1
            return taken
        self.counters["intake_accepted"] += 1
        self.table.add(taken)
        self.queue.append(taken.id)
        self.schedule()
        return taken

    def _rescan(self) -> None:
        for path in spool.pending_requests(self.root):
            self.intake(path)

    def schedule(self) -> None:
        """Start queued jobs, first in first out, while slots are free."""
        while (
            not self.shutting_down
            and self.queue
            and len(self.live) + len(self.reserved) < self.options.max_concurrent
        ):
            record = self.table.records[self.queue.popleft()]
            if record.state is S.QUEUED:
                self.reserved.add(record.id)
                self._spawn(self._launch(record))

    def _owner_of(self, record: JobRecord) -> JobRecord | None:
        for attempt in self.live.values():
            if attempt.record.checkpoint == record.checkpoint and attempt.record.id != record.id:
                return attempt.record
        return None

    async def _launch(
        self, record: JobRecord, plan: ReplayPlan | None = None, incident: Incident | None = None
    ) -> None:
        """Start the next attempt of ``record`` (a recovery when ``plan`` is given)."""
        try:
            if self.shutting_down:
                return
            owner = self._owner_of(record)
            if owner is not None:
                self._refuse_duplicate(record, owner)
                return
            record.attempt += 1
            number = record.attempt
            folder = self.root.job(record.id) / "attempts" / str(number)
            folder.mkdir(parents=True, exist_ok=True)
            job = record.job if number == 1 else record.job.without_faults()
            job_file = folder / "job.json"
            write_text_atomic(job_file, json.dumps(job.to_record(), indent=2) + "\n")
            checkpoint_dir = self.root.checkpoints / record.checkpoint
            process = WorkerProcess(
                record.id,
                number,
                folder,
                worker_argv(
                    job_file, checkpoint_dir, self.options.compile_cache or self.root.cache
                ),
                notify.child_environment(os.environ),
            )
            loop = asyncio.get_running_loop()
            attempt = Attempt(
                record, number, process, StallWatch(loop, lambda phase, gap: None), plan, incident
            )
            attempt.stall.on_stall = lambda phase, gap: self._on_stall(attempt, phase, gap)
            self.live[record.id] = attempt
            if record.state is S.QUEUED:
                self.table.transition(record, S.STARTING, f"attempt {number} launched")
            await process.start()
            record.pid, record.pid_started = process.pid, process.create_time()
            record.attempt_started = time.time()
            self.table.save(record)
            attempt.stall.start(record.job.supervision.startup_timeout_s)
            log.info(
                "attempt.started",
                job=record.id,
                attempt=number,
                pid=process.pid,
                recovery=plan is not None,
            )
            self._spawn(self._pump(attempt))
        finally:
            self.reserved.discard(record.id)

    async def _pump(self, attempt: Attempt) -> None:
        info = await attempt.process.pump(
            lambda e: self._on_event(attempt, e), lambda m: self._on_malformed(attempt, m)
        )
        self._on_exit(attempt, info)

    # ---- worker events

    def _on_malformed(self, attempt: Attempt, line: Malformed) -> None:
        self.counters["malformed_event_lines"] += 1
        log.warning(
            "event.malformed",
            job=attempt.record.id,
            attempt=attempt.number,
            line=line.lineno,
            reason=line.reason,
        )

    def _on_event(self, attempt: Attempt, event: Event) -> None:
        record, sup = attempt.record, attempt.record.job.supervision
        attempt.last_event = {k: v for k, v in event.fields.items() if k != "components"}
        kind = event.kind
        if kind == "restored":
            self.verifier.restored(attempt, event)
        elif kind == "ready":
            attempt.stall.alive(sup.stall_timeout_s)
            if record.state is S.STARTING:
                self.table.transition(record, S.RUNNING, f"attempt {attempt.number} ready")
            if attempt.plan is not None:
                self.verifier.ready(attempt, event)
        elif kind == "progress":
            attempt.stall.alive(sup.stall_timeout_s)
            record.step, record.last_progress = event["step"], time.time()
            attempt.last_progress = attempt.last_event
            self._mark_cpu(attempt)
            self.verifier.progress(attempt, event)
        elif kind == "checkpoint":
            attempt.stall.alive(sup.stall_timeout_s)
            attempt.checkpoint = (event["step"], event["file"])
            record.newest_checkpoint_step = event["step"]
            totals = self.checkpoint_totals
            totals["count"] += 1
            totals["bytes"] += event["bytes"]
            totals["seconds"] += event["seconds"]
        elif kind == "completed":
            attempt.completed = True
        elif kind == "failed":
            attempt.failure = event

    def _mark_cpu(self, attempt: Attempt) -> None:
        now = time.monotonic()
        if attempt.cpu_mark is None or now - attempt.cpu_mark[0] > 0.5:
            cpu = attempt.process.sample().get("cpu_s")
            if cpu is not None:
                attempt.cpu_mark = (now, cpu)

    # ---- stalls

    def _on_stall(self, attempt: Attempt, phase: str, gap: float) -> None:
        if attempt.process.exit_info is not None or attempt.process.stop_reason is not None:
            return
        self.counters["stalls_detected"] += 1
        attempt.process.stop_reason = "stall"
        self._spawn(self._handle_stall(attempt, phase, gap))

    async def _handle_stall(self, attempt: Attempt, phase: str, gap: float) -> None:
        sup, record = attempt.record.job.supervision, attempt.record
        timeout = sup.startup_timeout_s if phase == "startup" else sup.stall_timeout_s
        attempt.stall_evidence = await diagnosis.stall_evidence(attempt, phase, gap, timeout)
        evidence = attempt.stall_evidence
        if record.state in (S.RUNNING, S.STARTING, S.RECOVERING):
            self.table.transition(
                record,
                S.STALLED,
                f"no {'ready' if phase == 'startup' else 'progress'} for "
                f"{gap:.2f} s (timeout {timeout:g} s)",
                gap_s=round(gap, 4),
            )
        log.warning(
            "attempt.stalled",
            job=record.id,
            attempt=attempt.number,
            phase=phase,
            gap_s=gap,
            status=evidence["psutil_status"],
            cpu=evidence["cpu_during_gap"],
        )
        await attempt.process.stop("stall", diagnosis.STALL_KILL_GRACE_S)

    # ---- exits and recovery

    def _on_exit(self, attempt: Attempt, info: ExitInfo) -> None:
        record = attempt.record
        attempt.stall.cancel()
        self.live.pop(record.id, None)
        record.pid = None
        log.info(
            "attempt.exited",
            job=record.id,
            attempt=attempt.number,
            status=info.status,
            signal=info.signal,
            stopped_by=info.stopped_by,
        )
        if info.stopped_by == "mismatch":
            self.table.save(record)
        elif info.stopped_by == "operator" and not attempt.completed:
            self.table.transition(
                record,
                S.PREEMPTED,
                f"stopped by operator at step {record.step}",
                exit_status=info.status,
            )
        elif info.stopped_by == "shutdown" and not attempt.completed:
            record.resume_on_start = True
            self.table.transition(
                record,
                S.PREEMPTED,
                f"daemon shutdown preempted attempt {attempt.number} at step {record.step}",
                exit_status=info.status,
            )
        elif info.status == 0 and attempt.completed:
            if attempt.plan is not None:
                self.verifier.finish(attempt)
            for incident in attempt.resolved:
                incident.outcome += f" The job then completed at step {record.step}."
                self.incidents.write(incident, "incident.job_completed")
            self.table.transition(
                record, S.COMPLETED, f"attempt {attempt.number} completed", step=record.step
            )
        else:
            self._on_failure(attempt, info)
        self.schedule()

    def _on_failure(self, attempt: Attempt, info: ExitInfo) -> None:
        record, sup = attempt.record, attempt.record.job.supervision
        kind = diagnosis.classify(attempt, info)
        incident = self._open_incident(attempt, kind, diagnosis.symptom(attempt, info, kind))
        if attempt.incident is not None:
            self.incidents.conclude(
                attempt.incident,
                "failed",
                f"The recovery attempt {attempt.number} failed before its replay "
                f"was verified; see incident {incident.id}.",
                "incident.recovery_failed",
            )
        if kind in diagnosis.ESCALATE.values():
            self.incidents.conclude(
                incident,
                "escalated",
                f"Escalated: {diagnosis.escalation_reason(attempt, kind)} No "
                "fallback, no relaxed checks, no restart; a person decides, then "
                "`wardenctl resume`.",
                "incident.escalated",
            )
            self.table.transition(
                record,
                S.ESCALATED,
                f"{kind}: {attempt.failure['message'] if attempt.failure else ''}",
                incident=incident.id,
            )
            return
        if record.restarts >= sup.max_restarts:
            self.incidents.conclude(
                incident,
                "failed",
                f"Failed: {record.restarts} restart(s) used, max_restarts is "
                f"{sup.max_restarts}; no further attempt.",
                "incident.failed",
            )
            self.table.transition(
                record, S.FAILED, f"{kind}; max_restarts exhausted", incident=incident.id
            )
            return
        record.restarts += 1
        delay = sup.restart_backoff_s * 2 ** (record.restarts - 1)
        incident.details["backoff_s"] = delay
        self.incidents.write(incident, "incident.opened")
        self.table.transition(
            record,
            S.RECOVERING,
            f"{kind} of attempt {attempt.number}; restart {record.restarts} in {delay:.2f} s",
            incident=incident.id,
        )
        plan = ReplayPlan.from_events(attempt.number, attempt.process.folder / "events.jsonl")
        self._relaunch_later(record, plan, incident, delay)

    def _relaunch_later(
        self, record: JobRecord, plan: ReplayPlan, incident: Incident, delay: float
    ) -> None:
        self.reserved.add(record.id)

        def launch() -> None:
            self.relaunch.pop(record.id, None)
            self._spawn(self._launch(record, plan, incident))

        self.relaunch[record.id] = asyncio.get_running_loop().call_later(delay, launch)

    # ---- operator commands

    def stop_job(self, record: JobRecord) -> dict[str, Any]:
        """Preempt a job: its worker commits its current step and exits; it waits for resume."""
        attempt = self.live.get(record.id)
        if attempt is not None:
            grace = record.job.supervision.stop_grace_s
            self._spawn(attempt.process.stop("operator", grace))
            return {
                "job": record.id,
                "stopping": True,
                "pid": attempt.process.pid,
                "grace_s": grace,
            }
        timer = self.relaunch.pop(record.id, None)
        if timer is not None:
            timer.cancel()
            self.reserved.discard(record.id)
            self.table.transition(record, S.PREEMPTED, "stopped by operator during restart backoff")
            return {"job": record.id, "stopping": False, "state": record.state.value}
        raise ControlError(
            "control.not_running", f"job {record.id} is {record.state.value}; nothing to stop"
        )

    def resume_job(self, record: JobRecord) -> dict[str, Any]:
        """Queue a preempted, failed or escalated job again, after a person has decided."""
        if record.state not in (S.PREEMPTED, S.FAILED, S.ESCALATED):
            raise ControlError(
                "control.bad_state",
                f"job {record.id} is {record.state.value}; "
                "resume applies to preempted, failed or escalated jobs",
            )
        record.restarts = 0
        record.resume_on_start = False
        self.table.transition(record, S.QUEUED, "resumed by operator")
        self.queue.append(record.id)
        self.schedule()
        return {"job": record.id, "state": record.state.value}

    def _open_incident(self, attempt: Attempt, kind: str, symptom: str) -> Incident:
        record = attempt.record
        incident = diagnosis.failure_incident(
            attempt,
            kind,
            symptom,
            len(record.incidents) + 1,
            self.root.checkpoints / record.checkpoint,
        )
        self._register(record, incident)
        self.incidents.write(incident, "incident.detected")
        log.warning("incident.detected", job=record.id, incident=incident.id, kind=kind)
        return incident

    def _register(self, record: JobRecord, incident: Incident) -> None:
        record.incidents.append(incident.id)
        self.incident_kinds[incident.kind] = self.incident_kinds.get(incident.kind, 0) + 1

    def _refuse_duplicate(self, record: JobRecord, owner: JobRecord) -> None:
        incident = diagnosis.duplicate_writer_incident(
            record, owner, len(record.incidents) + 1, self.root
        )
        self._register(record, incident)
        self.incidents.write(incident, "incident.duplicate_writer_prevented")
        log.warning(
            "incident.duplicate_writer_prevented",
            job=record.id,
            owner=owner.id,
            checkpoint=record.checkpoint,
        )
        self.table.transition(
            record,
            S.ESCALATED,
            f"duplicate writer prevented: checkpoint '{record.checkpoint}' "
            f"is owned by live job {owner.id}",
            incident=incident.id,
        )

    # ---- daemon restart

    def _resume_from_disk(self) -> None:
        for record in self.table.load():
            for incident in self.incidents.load(record.id):
                kind = incident["kind"]
                self.incident_kinds[kind] = self.incident_kinds.get(kind, 0) + 1
            if record.state is S.QUEUED:
                self.queue.append(record.id)
            elif record.state in ACTIVE or (record.state is S.PREEMPTED and record.resume_on_start):
                self.reserved.add(record.id)
                self._spawn(self._resume_after_restart(record))

    async def _resume_after_restart(self, record: JobRecord) -> None:
        previous = record.pid
        if previous is not None:
            await self._wait_for_orphan(previous, record.pid_started)
        folder = self.root.job(record.id) / "attempts" / str(record.attempt)
        plan = ReplayPlan.from_events(record.attempt, folder / "events.jsonl")
        incident = diagnosis.restart_incident(
            record, plan, folder, previous, len(record.incidents) + 1
        )
        self._register(record, incident)
        self.incidents.write(incident, "incident.detected")
        record.resume_on_start = False
        self.table.transition(record, S.RECOVERING, "daemon restarted", incident=incident.id)
        await self._launch(record, plan, incident)

    async def _wait_for_orphan(self, pid: int, started: float | None) -> None:
        deadline = time.monotonic() + ORPHAN_WAIT_S
        while time.monotonic() < deadline:
            try:
                proc = psutil.Process(pid)
                if started is not None and abs(proc.create_time() - started) > 1.0:
                    return
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.NoSuchProcess:
                return
            await asyncio.sleep(0.05)
        log.warning("orphan.killed", pid=pid, waited_s=ORPHAN_WAIT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    # ---- sampling

    def _status_line(self) -> str:
        counts: dict[str, int] = {}
        for record in self.table:
            counts[record.state.value] = counts.get(record.state.value, 0) + 1
        jobs = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no jobs"
        return f"{jobs}; {len(self.live)} worker(s) live"

    def _sample(self) -> None:
        status = self._status_line()
        if status != self.last_status:
            self.last_status = status
            self.notifier.status(status)
        for attempt in list(self.live.values()):
            sample = attempt.process.sample()
            attempt.record.sample = sample
            limit = attempt.record.job.supervision.max_rss_mb
            if sample.get("rss_mb", 0) > limit and attempt.process.stop_reason is None:
                log.warning(
                    "attempt.rss_limit",
                    job=attempt.record.id,
                    rss_mb=sample["rss_mb"],
                    limit_mb=limit,
                )
                attempt.process.stop_reason = "rss"
                self._spawn(
                    attempt.process.stop("rss", attempt.record.job.supervision.stop_grace_s)
                )
