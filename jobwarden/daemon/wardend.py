"""wardend's one loop: intake, scheduling, restart recovery, sampling, and dispatch.

Every job that holds a slot has a `JobSupervisor`, which runs its attempts and
applies the policy's decisions; the loop only takes requests in, hands queued
jobs to supervisors while slots are free, and answers control requests.
Threads and signal handlers only enqueue onto this loop, so no state is
shared across threads.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections import deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import structlog

from jobwarden import __version__, testfaults
from jobwarden.daemon import sandbox
from jobwarden.daemon.api import commands
from jobwarden.daemon.api.lifecycle import Lifecycle
from jobwarden.daemon.api.server import ControlServer
from jobwarden.daemon.background import Background
from jobwarden.daemon.config import Options
from jobwarden.daemon.incidents.records import IncidentLog
from jobwarden.daemon.intake import spool
from jobwarden.daemon.intake.queue import Intake, Taken
from jobwarden.daemon.launch import reaper, registry
from jobwarden.daemon.launch.base import Launcher
from jobwarden.daemon.observe import exporter, hooks, metrics, notify
from jobwarden.daemon.stats import Stats
from jobwarden.daemon.store import rootcheck
from jobwarden.daemon.store.jobs import JobRecord, JobTable
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.supervise.services import Services, Supervising
from jobwarden.daemon.supervise.supervisor import JobSupervisor
from jobwarden.jobfile import Job
from jobwarden.states import ACTIVE, JobState

log = structlog.get_logger("wardend")

S = JobState
BLOCK_S = 2.0


class Wardend:
    """The supervisor daemon of one root."""

    _services: Services
    intake_queue: Intake

    def __init__(
        self,
        root: Root,
        options: Options,
        launcher: Launcher | None = None,
        permits: sandbox.Permits | None = None,
    ) -> None:
        """``launcher``: one made already; else the one ``options.launch`` names.
        ``permits``: what the sandbox was found to permit (`sandbox.probe`, run here if
        not given); intake refuses a job that needs what it blocks."""
        self.root = root
        self.options = options
        self.table = JobTable(root)
        self.incidents = IncidentLog(root)
        self.launcher = launcher or registry.load(options.launch.name, options.launch)
        self.permits = permits or sandbox.probe()
        self.spool = spool.Spool(
            root,
            lambda job_id: job_id in self.table,
            lambda job: sandbox.job_refusal(job.run.processes, self.permits, self.launcher.name),
        )
        self.stats = Stats()
        self.queue: deque[str] = deque()
        self.supervisors: dict[str, JobSupervisor] = {}
        self.stopping = asyncio.Event()
        self.shutting_down = False
        self.background = Background("wardend")
        self.started = time.time()
        self.notifier = notify.Notifier()
        self.hooks = hooks.Notifications.attach(options.notify, root, self.table, self.incidents)
        self.exporter = exporter.Exporter(  # read by any local user: no series by job
            functools.partial(metrics.render, self, per_job=False),
            options.metrics,
            options.sample_interval_s,
        )
        self.lifecycle = Lifecycle(self, options.keep_finished, options.keep_finished_days)
        self.last_status = ""
        self.server = ControlServer(
            options.socket or root.socket,
            commands.handlers(self, self.lifecycle),
            options.group,
            options.control_timeout_s,
        )

    # ---- life cycle

    async def run(self) -> int:
        """Serve until SIGTERM, SIGINT or a shutdown request; returns the exit status."""
        if (refused := rootcheck.socket_refusal(self.server.path)) is not None:
            return refused  # before anything starts: the server replaces a stale socket only
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        if testfaults.active(testfaults.Fault.BLOCK_LOOP_ON_SIGUSR2):
            loop.add_signal_handler(signal.SIGUSR2, time.sleep, BLOCK_S)
        log.info("wardend.sandbox", **self.permits.record())
        self.exporter.start(self._spawn)  # raises MetricsListenError before anything else starts
        self.hooks.start()
        self._services = Services(
            root=self.root,
            table=self.table,
            incidents=self.incidents,
            launcher=self.launcher,
            stats=self.stats,
            clock=loop,
            compile_cache=self.options.compile_cache or self.root.cache,
            signing_key=self.options.signing_key,
            environment=notify.child_environment(os.environ),
            spawn=self._spawn,
            owner_of=self._owner_of,
            on_settled=self._settled,
        )
        self._resume_from_disk()
        metrics.begin(self)  # the totals found were counted by an earlier daemon
        if self.lifecycle.retains:  # its first turn comes now that the table is loaded
            self._spawn(self.lifecycle.keep())

        def admit(taken: Job | spool.Rejection) -> None:  # on the loop, once it is durable
            if isinstance(taken, spool.Rejection):
                self.stats.intake_rejected += 1
                return
            self.stats.intake_accepted += 1
            self.queue.append(self.table.adopt(self.spool.adopted(taken)).id)
            self.schedule()

        self.intake_queue = Intake(self.spool, admit)

        def enqueue(path: Path) -> None:
            loop.call_soon_threadsafe(self.intake, path)

        observer = spool.watch(self.root, enqueue)
        self._rescan()
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
            launcher=self.launcher.name,
            version=__version__,
        )
        await self.stopping.wait()
        await self.intake_queue.close()
        await self._shutdown()
        observer.stop()
        observer.join(5)
        await self.server.close()
        await self.launcher.close()
        self.hooks.close()
        self.exporter.close()
        self.incidents.close()
        log.info("wardend.stopped", pid=os.getpid())
        return 0

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self.background.spawn(coro)

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
        live = sorted(j for j, s in self.supervisors.items() if s.attempt is not None)
        self.notifier.stopping(f"stopping; preempting {len(live)} worker(s)")
        log.info("wardend.stopping", live=live)
        await asyncio.gather(*(s.shutdown() for s in list(self.supervisors.values())))
        await self.background.cancel_and_wait()

    # ---- intake and scheduling

    def intake(self, path: Path) -> asyncio.Future[Taken]:
        """Queue one request file for intake (on the loop); the future holds its outcome.

        The intake thread claims, validates and persists it (`Intake`);
        ``admit`` in `run` registers and queues an accepted job on the loop.
        """
        return self.intake_queue.put(path)

    def _rescan(self) -> None:
        self.intake_queue.rescan()

    def schedule(self) -> None:
        """Hand queued jobs to new supervisors, first in first out, while slots are free."""
        while (
            not self.shutting_down
            and self.queue
            and len(self.supervisors) < self.options.max_concurrent
        ):
            record = self.table.records[self.queue.popleft()]
            if record.state is S.QUEUED and record.id not in self.supervisors:
                self._spawn(self._supervise(record).launch())

    def _supervise(self, record: JobRecord) -> JobSupervisor:
        supervisor = JobSupervisor(record, self._services)
        self.supervisors[record.id] = supervisor
        return supervisor

    def _settled(self, supervisor: Supervising) -> None:
        """A supervisor's job needs no slot any more: free it (and its spare, if it has one)
        and start the next job."""
        if self.supervisors.get(supervisor.record.id) is supervisor:
            del self.supervisors[supervisor.record.id]
        self.launcher.settled(supervisor.record.id)
        self.schedule()

    def _owner_of(self, record: JobRecord) -> JobRecord | None:
        """The other job that holds ``record``'s checkpoint (its only writer), if any."""
        for supervisor in self.supervisors.values():
            other = supervisor.record
            if other.id != record.id and other.checkpoint == record.checkpoint:
                return other
        return None

    # ---- operator commands

    def is_live(self, job_id: str) -> bool:
        """Whether the job has an attempt running now."""
        supervisor = self.supervisors.get(job_id)
        return supervisor is not None and supervisor.attempt is not None

    def stop_job(self, record: JobRecord) -> dict[str, Any] | None:
        """Preempt a job (its worker commits its current step); None when nothing runs."""
        supervisor = self.supervisors.get(record.id)
        return supervisor.stop() if supervisor is not None else None

    def metrics_text(self) -> str:
        """The Prometheus exposition of the daemon's state now (`observe.metrics.render`)."""
        return metrics.render(self)

    def notifications_delivered(self) -> dict[str, int]:
        """Hook and webhook events sent, dropped and overflowed since the daemon started."""
        return self.hooks.counts()

    def resume_job(self, record: JobRecord) -> dict[str, Any]:
        """Queue a preempted, failed or escalated job again, after a person has decided."""
        record.restarts = record.restarts_without_progress = 0
        record.failure_times, record.no_progress = [], []
        record.resume_on_start = False
        self.table.transition(record, S.QUEUED, "resumed by operator")
        self.queue.append(record.id)
        self.schedule()
        return {"job": record.id, "state": record.state.value}

    # ---- daemon restart

    def _resume_from_disk(self) -> None:
        for record in self.table.load():
            left_open = self.incidents.carry_over(record)  # concluded once the job is looked at
            if record.state in ACTIVE or (record.state is S.PREEMPTED and record.resume_on_start):
                self._spawn(self._supervise(record).recover_after_restart(left_open))
                continue
            self.incidents.interrupt(left_open, f"the job was {record.state.value} at the restart")
            if record.state is S.QUEUED:
                self.queue.append(record.id)

    # ---- sampling

    def _status_line(self) -> str:
        counts: dict[str, int] = {}
        for record in self.table:
            counts[record.state.value] = counts.get(record.state.value, 0) + 1
        jobs = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no jobs"
        live = sum(1 for s in self.supervisors.values() if s.attempt is not None)
        return f"{jobs}; {live} worker(s) live"

    def _sample(self) -> None:
        status = self._status_line()
        if status != self.last_status:
            self.last_status = status
            self.notifier.status(status)
        for supervisor in list(self.supervisors.values()):
            supervisor.sample()
        reaper.reap_orphans()  # an orphan that ended after its job settled
        self.table.retry()
        self.incidents.retry()
