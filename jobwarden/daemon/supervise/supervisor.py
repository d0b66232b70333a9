"""One supervisor per live job: it owns the attempt and applies the policy's outcomes.

A `JobSupervisor` starts attempts through the daemon's `Launcher`, follows
their events (progress, stalls, the replay proof) or, for a plain program,
its output and heartbeat (`daemon.heartbeat`), and when an attempt ends
asks `policy.decide` what follows, then applies that `Outcome`: incidents are
opened and concluded, the job's state moves through `JobTable.transition`,
and a restart is a timer on the loop.  It runs on the daemon's one loop, and
tells the daemon through ``on_settled`` when the job no longer needs a slot.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import time
from collections.abc import Callable
from typing import Any

import structlog

from jobwarden import testfaults
from jobwarden.daemon.incidents.records import Incident
from jobwarden.daemon.launch.base import ExitInfo, LauncherError, RunningAttempt
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.supervise import adoption, diagnosis, outcomes, phases, policy
from jobwarden.daemon.supervise import stallevidence as stalled
from jobwarden.daemon.supervise.attempt import Attempt, MalformedLines, prepare
from jobwarden.daemon.supervise.phases import Durations, StallPhase
from jobwarden.daemon.supervise.policy import Outcome, StopReason
from jobwarden.daemon.supervise.services import Services
from jobwarden.daemon.supervise.stall import StallWatch
from jobwarden.daemon.supervise.verification import ReplayVerifier
from jobwarden.errors import IncidentKind
from jobwarden.events import Event, Malformed
from jobwarden.files import UnsafePathError
from jobwarden.jobfolder import ATTEMPTS, EVENTS_FILE
from jobwarden.proof.replay import ReplayPlan
from jobwarden.states import JobState

log = structlog.get_logger("wardend.supervisor")

S = JobState
K = IncidentKind
Verifier = ReplayVerifier | None


class JobSupervisor:
    """Runs one job's attempts, from its launch until it settles."""

    def __init__(self, record: JobRecord, services: Services) -> None:
        self.record = record
        self.services = services
        self.attempt: Attempt | None = None
        self.closing = False
        self._relaunch: asyncio.TimerHandle | None = None
        self._following: asyncio.Task[None] | None = None
        self.refusal: UnsafePathError | None = None
        """A path the daemon must write for this job is unsafe: the job ends escalated."""
        self.refused = False
        self.streak = 0
        """Restarts in a row without a healthy attempt (`policy.streak_of`), for the backoff."""
        self.recovery: ReplayVerifier | None = None
        """The newest recovery begun (in its backoff, launching or running), so that a job
        that comes to rest before its proof is settled concludes its incident (`_settled`)."""
        self.phases: Durations | None = None
        """What the job's ended attempts showed of each phase (read at the first launch)."""

    # ---- starting attempts

    async def launch(self, verifier: ReplayVerifier | None = None) -> None:
        """Start the next attempt (a recovery when ``verifier`` is given)."""
        if verifier is not None:
            self.recovery = verifier
        try:
            await self._launch(verifier)
        except UnsafePathError as error:
            self.refuse_unsafe(error)

    async def _launch(self, verifier: ReplayVerifier | None) -> None:
        s, record = self.services, self.record
        if self.closing:
            return
        owner = s.owner_of(record)
        refusal = policy.admit(record, owner)
        if refusal is not None and owner is not None:
            self._refuse_duplicate(refusal, owner)
            return
        record.attempt += 1
        number = record.attempt
        # Durable before the worker exists: a restarted daemon never reuses this number, and
        # finds the worker by its attempt folder (`Launcher.find_orphans`) if its pid is lost.
        if record.state is S.QUEUED:
            s.table.transition(record, S.STARTING, f"attempt {number} launched")
        else:
            s.table.save(record)
        try:
            spec = prepare(s.root, record, s.compile_cache, s.signing_key, s.environment)
            running = await s.launcher.start(spec)
        except (LauncherError, OSError) as error:
            if isinstance(error, OSError) and error.errno == errno.ELOOP:  # O_NOFOLLOW, a link
                raise UnsafePathError(str(error.filename), "is a symbolic link") from error
            log.error("attempt.launch_failed", job=record.id, attempt=number, error=str(error))
            recovery = verifier.incident if verifier is not None else None
            outcomes.launch_failed(s, record, number, error, recovery)
            self._settled()
            return
        self._begin(number, running, verifier)

    def _begin(self, number: int, running: RunningAttempt, verifier: Verifier) -> None:
        s, record, sup = self.services, self.record, self.record.job.supervision
        if self.phases is None:
            self.phases = phases.history(s.root.job(record.id) / ATTEMPTS, number)
        stall = StallWatch(
            s.clock,
            lambda phase, gap: self._on_stall(attempt, phase, gap),
            phases.explicit_timeouts(sup),
            self.phases,
        )
        attempt = self.attempt = Attempt(record, number, running, stall, verifier)
        testfaults.pause_if(testfaults.Fault.PAUSE_AFTER_LAUNCH, job=record.id, pid=running.pid)
        record.pid, record.pid_started = running.pid, running.create_time()
        record.attempt_started = time.time()
        s.table.save(record)
        if record.job.emits_events:  # time in a batch queue is not startup time
            running.when_started(lambda: attempt.stall.start(sup.startup_timeout_s))
        else:
            on_beat = functools.partial(self._guarded, self._on_beat, attempt, None)
            running.when_started(lambda: outcomes.start_plain(s, record, attempt, on_beat))
        log.info(
            "attempt.started",
            job=record.id,
            attempt=number,
            pid=running.pid,
            **running.member_pids(),
            launcher=s.launcher.name,
            recovery=verifier is not None,
        )
        self._following = s.spawn(self._follow(attempt))

    async def recover_after_restart(self, left_open: list[Incident]) -> None:
        """The daemon restarted while this job was active: wait out every worker of the job
        still alive (its pid, or found by its attempt folder), conclude the incidents left
        open, then resume under a new ``daemon_restart`` incident; or re-adopt an attempt
        its launcher can follow again (`adoption`)."""
        try:
            if adopted := await adoption.adopt(self.services, self.record, left_open):
                self._begin(self.record.attempt, *adopted)
                return
            previous = await outcomes.wait_orphans(self.services, self.record)
            verifier = outcomes.restarted(self.services, self.record, previous, left_open)
        except UnsafePathError as error:
            self.refuse_unsafe(error)
            return
        await self.launch(verifier)

    async def _follow(self, attempt: Attempt) -> None:
        info = await attempt.running.follow(
            lambda e: self._guarded(self._on_event, attempt, e),
            lambda m: self._guarded(self._on_malformed, attempt, m),
        )
        self._guarded(self._ending, attempt, info)
        try:  # exit.json and the phases at once, off the loop, before the outcome
            await outcomes.keep_exit(attempt.folder, attempt.exit_files)
        except UnsafePathError as error:
            self.refuse_unsafe(error)
            return
        self._guarded(self._ended, attempt, info)

    def _guarded(
        self, handler: Callable[[Attempt, Any], None], attempt: Attempt, item: Any
    ) -> None:
        """Run one handler; a failure (a full disk under a record, say) is logged, never fatal."""
        try:
            handler(attempt, item)
        except UnsafePathError as error:
            self.refuse_unsafe(error)
        except Exception as error:
            log.error(
                "supervisor.handler_failed",
                job=self.record.id,
                attempt=attempt.number,
                handler=handler.__name__,
                error=repr(error),
                exc_info=error,
            )

    # ---- events

    def _on_beat(self, attempt: Attempt, _: None) -> None:
        """A plain program's heartbeat: forward motion, as progress is for the SDK's."""
        record = self.record
        attempt.beat(record.job.supervision.stall_timeout_s)
        record.last_progress = time.time()
        if record.state is S.STARTING:
            self.services.table.transition(
                record, S.RUNNING, f"attempt {attempt.number}: first heartbeat"
            )

    def _on_malformed(self, attempt: Attempt, line: Malformed) -> None:
        if attempt.heartbeat is not None:  # a plain program's own output, not an event
            attempt.heartbeat.line(line.line)
            return
        self.services.stats.malformed_event_lines += 1
        if attempt.malformed is None:
            attempt.malformed = MalformedLines(self.record.id, attempt.number)
        attempt.malformed.note(line)

    def _on_event(self, attempt: Attempt, event: Event) -> None:
        record, s = self.record, self.services
        if attempt.heartbeat is not None:  # a plain program's line that looks like an event
            attempt.heartbeat.line(json.dumps(event.fields))
            return
        attempt.observe(event)
        s.incidents.traces.observe(s.root.job(record.id), attempt.number, event)
        verifier, kind = attempt.verifier, event.kind
        if kind in ("restored", "checkpoint"):
            record.newest_checkpoint_step = event["step"]
        if kind == "restored" and verifier is not None:
            verifier.restored(event)
            s.incidents.write(verifier.incident, "incident.recovery_point")
        elif kind == "ready":
            if record.state is S.STARTING:
                s.table.transition(record, S.RUNNING, f"attempt {attempt.number} ready")
            if verifier is not None:
                verifier.incident.action = diagnosis.recovery_action(attempt, verifier, event)
                exact = record.job.run.exact
                outcomes.replay(s, record, attempt, lambda: verifier.ready(event, exact=exact))
        elif kind == "progress":
            record.step, record.last_progress = event["step"], time.time()
            if verifier is not None:
                outcomes.replay(s, record, attempt, lambda: verifier.progress(event))
        elif kind == "checkpoint":
            s.stats.checkpoints += 1
            s.stats.checkpoint_bytes += event["bytes"]
            s.stats.checkpoint_seconds += event["seconds"]

    # ---- stalls, limits and stops

    def _on_stall(self, attempt: Attempt, phase: StallPhase, gap: float) -> None:
        if not attempt.stopping(StopReason.STALL):
            return
        self.services.stats.stalls_detected += 1
        self.services.spawn(stalled.stop_stalled(self.services.table, attempt, phase, gap))

    def sample(self) -> None:
        """Sample the live attempt's resources; stop it when over its memory limit."""
        attempt = self.attempt
        if attempt is None:
            return
        sample = attempt.sample = self.record.sample = attempt.running.sample()
        if (spare := self.services.launcher.spare_of(self.record.id)) is not None:
            sample["spare"] = spare  # the memory a waiting spare holds, beside the attempt's
        limit = self.record.job.supervision.max_rss_mb
        if policy.over_memory_limit(sample.get("rss_mb"), limit) and attempt.stopping(
            StopReason.RSS
        ):
            log.warning(
                "attempt.rss_limit", job=self.record.id, rss_mb=sample["rss_mb"], limit_mb=limit
            )
            grace = self.record.job.supervision.stop_grace_s
            self.services.spawn(attempt.running.stop(grace))

    def stop(self) -> dict[str, Any] | None:
        """An operator's stop: the worker commits and exits; None when nothing runs."""
        record, attempt = self.record, self.attempt
        if attempt is not None:
            attempt.stopping(StopReason.OPERATOR)
            grace = record.job.supervision.stop_grace_s
            self.services.spawn(attempt.running.stop(grace))
            return {
                "job": record.id,
                "stopping": True,
                "pid": attempt.running.pid,
                "grace_s": grace,
            }
        if self._relaunch is not None:
            self._relaunch.cancel()
            self._relaunch = None
            self.apply(policy.Preempted("stopped by operator during restart backoff"))
            return {"job": record.id, "stopping": False, "state": record.state.value}
        return None

    async def shutdown(self) -> None:
        """The daemon stops: preempt the live attempt (it commits), keep a pending restart
        for the next start, and return once the attempt's end is handled."""
        self.closing = True
        if self._relaunch is not None:
            self._relaunch.cancel()
            self._relaunch = None
        attempt = self.attempt
        if attempt is not None:
            attempt.stopping(StopReason.SHUTDOWN)
            await attempt.running.stop(self.record.job.supervision.stop_grace_s)
        if self._following is not None:
            await asyncio.shield(self._following)

    # ---- ends

    def _ending(self, attempt: Attempt, info: ExitInfo) -> None:
        """The attempt is over: let go of it, and say what its folder keeps of its end."""
        self._phases_ended(attempt)
        if attempt.heartbeat is not None:
            attempt.heartbeat.cancel()
        if attempt.malformed is not None:
            attempt.malformed.flush()
        self.attempt = None
        self.record.pid, self.record.sample = None, {}  # the attempt keeps its last sample
        attempt.exit_files["exit.json"] = outcomes.exit_text(attempt, info, self.refusal)

    def _ended(self, attempt: Attempt, info: ExitInfo) -> None:
        record = self.record
        log.info(
            "attempt.exited",
            job=record.id,
            attempt=attempt.number,
            status=info.status,
            signal=info.signal,
            stopped_by=attempt.stop_reason,
            superseded=attempt.superseded,
        )
        if self.refusal is not None:
            self.refuse_unsafe(self.refusal)
            return
        outcome = policy.decide(record, attempt.report(), info, self.streak, time.time())
        self.apply(outcome, attempt, info)

    def _phases_ended(self, attempt: Attempt) -> None:
        """Keep what the ended attempt showed of each phase, for the attempts after it."""
        seen = attempt.stall.ended()
        if self.phases is not None and attempt.record.job.emits_events:
            self.phases.merge(seen)
            attempt.exit_files[phases.PHASES_FILE] = phases.saved_text(seen)

    def apply(
        self, outcome: Outcome, attempt: Attempt | None = None, info: ExitInfo | None = None
    ) -> None:
        """Carry out ``outcome``: incidents, the transition, and any restart."""
        s, record = self.services, self.record
        match outcome:
            case policy.Completed():
                if attempt is not None and attempt.verifier is not None:
                    outcomes.replay(s, record, attempt, attempt.verifier.settle)
                outcomes.complete(s, record, outcome, attempt)
            case policy.Preempted():
                outcomes.preempt(s, record, outcome, info)
            case policy.Escalate(kind=K.REPLAY_MISMATCH) if attempt and attempt.verifier:
                outcomes.escalate_mismatch(s, record, outcome, attempt.verifier.incident)
            case policy.Restart() if attempt and info:
                self.streak = outcome.streak
                incident = outcomes.failure(s, record, outcome, attempt, info)
                plan = ReplayPlan.from_events(attempt.number, attempt.folder / EVENTS_FILE)
                self._restart_later(ReplayVerifier(plan, incident), outcome.delay_s)
                return
            case policy.Escalate() | policy.Fail() if attempt and info:
                outcomes.failure(s, record, outcome, attempt, info)
            case _:
                raise policy.UnappliableOutcome(record.id, outcome)
        self._settled()

    def _restart_later(self, verifier: ReplayVerifier, delay_s: float) -> None:
        self.recovery = verifier
        if self.closing:
            return  # the job stays recovering; the next daemon start resumes it

        def launch() -> None:
            self._relaunch = None
            self.services.spawn(self.launch(verifier))

        self._relaunch = asyncio.get_running_loop().call_later(delay_s, launch)

    def refuse_unsafe(self, error: UnsafePathError) -> None:
        """A path the daemon writes for this job is a link or not its own: stop the live
        attempt (it commits), then escalate the job ``unsafe_path`` naming the path, once."""
        self.refusal = self.refusal or error
        if self._relaunch is not None:
            self._relaunch.cancel()
            self._relaunch = None
        if self.attempt is not None:
            self.attempt.stall.cancel()
            grace = self.record.job.supervision.stop_grace_s
            self.services.spawn(self.attempt.running.stop(grace))
        elif not self.refused:
            self.refused = True
            outcomes.unsafe_path(self.services, self.record, self.refusal)
            self._settled()

    def _refuse_duplicate(self, refusal: policy.Escalate, owner: JobRecord) -> None:
        outcomes.refuse_duplicate(self.services, self.record, refusal, owner)
        self._settled()

    def _settled(self) -> None:
        """Tell the daemon the job rests, its recovery's incident concluded first if the job
        came to rest before the proof was settled: a resting job keeps no incident open."""
        recovery = self.recovery
        if recovery is not None and recovery.incident.status == "open":
            outcomes.cut_short(self.services, self.record, recovery.incident)
        self.services.on_settled(self)
