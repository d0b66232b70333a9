"""A daemon in miniature: real records, incidents and root on tmp_path, scripted attempts.

`Rig` is what a `JobSupervisor` gets from its daemon (`Rig.services`: the
real `JobTable`, `IncidentLog` and `Root`, the `ScriptedLauncher`, a
`MockClock`) and what the control handlers see of it: it satisfies
`jobwarden.daemon.view.View`.  Its methods of the View (`is_live`,
`stop_job`, `resume_job`, `metrics_text`, `notifications_delivered`) and its
bookkeeping of settled supervisors and checkpoint owners do what `Wardend`'s
do, minus the scheduling: a resumed or submitted job is only put in `queue`.

Jobs are taken in as intake takes them: the request's bytes validated by
`job_from_bytes`, the job folder made durable by `create_folder`, the record
it saved registered in the table.

Every task a supervisor spawns is kept; `Rig.close` cancels those still
running and fails the test if any of them raised, or if a supervisor handler
failed (the supervisor only logs that, so the log is captured and read).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import structlog.testing

from jobwarden.daemon.config import NotifySettings, Options
from jobwarden.daemon.incidents.records import IncidentLog
from jobwarden.daemon.intake.queue import Intake
from jobwarden.daemon.intake.spool import Rejection, Spool
from jobwarden.daemon.observe import metrics
from jobwarden.daemon.observe.hooks import Notifications
from jobwarden.daemon.stats import Stats
from jobwarden.daemon.store.jobs import JobRecord, JobTable, create_folder
from jobwarden.daemon.store.layout import Root
from jobwarden.daemon.supervise.services import Services, Supervising
from jobwarden.daemon.supervise.supervisor import JobSupervisor
from jobwarden.events import Event, read_events
from jobwarden.jobfile import Job, job_from_bytes
from jobwarden.states import JobState
from tests.scripted import Hang, ScriptedAttempt, ScriptedLauncher, Worker
from tests.unit.clock import MockClock

T = TypeVar("T")
SCENARIO_TIMEOUT_S = 10.0
"""A scenario that has not ended by then is stuck: fail it rather than wait for pytest."""
FAILURES = frozenset({"supervisor.handler_failed", "lifecycle.task_failed"})
"""Logged errors that mean a defect, never a job's fault."""
FAST_SUPERVISION: dict[str, Any] = {"startup_timeout_s": 30.0, "stall_timeout_s": 5.0}
"""Deadlines the tests reach by advancing the clock."""
S = JobState
PATHS: dict[JobState, tuple[JobState, ...]] = {
    S.QUEUED: (),
    S.STARTING: (S.STARTING,),
    S.RUNNING: (S.STARTING, S.RUNNING),
    S.STALLED: (S.STARTING, S.RUNNING, S.STALLED),
    S.RECOVERING: (S.STARTING, S.RUNNING, S.RECOVERING),
    S.PREEMPTED: (S.STARTING, S.RUNNING, S.PREEMPTED),
    S.FAILED: (S.STARTING, S.RUNNING, S.FAILED),
    S.ESCALATED: (S.STARTING, S.RUNNING, S.ESCALATED),
    S.COMPLETED: (S.STARTING, S.RUNNING, S.COMPLETED),
    S.CANCELLED: (S.CANCELLED,),
}
"""A legal way from queued to each state, for a record no supervisor holds."""


def document(job_id: str, **sections: Any) -> dict[str, Any]:
    """A job request: linreg, 8 steps committed every 2, and ``sections`` over that
    (``run={...}``, ``supervision={...}``, ``checkpoint="name"``, ``command=[...]``...; a
    section given as None is left out)."""
    doc: dict[str, Any] = {
        "id": job_id,
        "task": "linreg",
        "run": {"steps": 8, "checkpoint_every": 2},
        "supervision": dict(FAST_SUPERVISION),
    }
    for name, value in sections.items():
        if value is None:
            doc.pop(name, None)
        elif isinstance(value, dict) and isinstance(doc.get(name), dict):
            doc[name] = {**doc[name], **value}
        else:
            doc[name] = value
    if "command" in doc:
        doc.pop("task")
    return doc


def intake(root: Root, table: JobTable, request: dict[str, Any]) -> JobRecord:
    """Take ``request`` in as the spool does: validate its bytes, make its folder durable,
    register the record it saved (in state queued)."""
    raw = json.dumps(request).encode()
    name = f"{request['id']}.json"
    job: Job = job_from_bytes(raw, name, "json")
    record = create_folder(
        root, job, raw, ".json", claim=f"{time.time_ns()}.{name}", request_name=name
    )
    return table.adopt(record)


class Rig:
    """One root's records, incidents and supervisors, driven by a test."""

    def __init__(self, path: Path, launcher: ScriptedLauncher | None = None) -> None:
        self.root = Root(path)
        self.root.create()
        self.options = Options()
        self.table = JobTable(self.root)
        self.incidents = IncidentLog(self.root)
        self.launcher = launcher or ScriptedLauncher()
        self.clock = MockClock()
        self.stats = Stats()
        self.supervisors: dict[str, JobSupervisor] = {}
        self.started = time.time()
        self.shutting_down = False
        self.stopping = asyncio.Event()
        self.spool = Spool(self.root, lambda job_id: job_id in self.table)
        self.intake_queue = Intake(self.spool, self._admit)
        self.hooks = Notifications.attach(NotifySettings(), self.root, self.table, self.incidents)
        self.queue: deque[str] = deque()
        """Jobs resumed or submitted, waiting for a slot (nothing schedules them here)."""
        self.settled: list[str] = []
        """Each job whose supervisor said it needs no slot any more, in order."""
        self.tasks: set[asyncio.Task[Any]] = set()
        self.logs: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._exits = contextlib.ExitStack()

    # ---- what a supervisor gets

    def services(self) -> Services:
        """The daemon's part of every supervisor."""
        return Services(
            root=self.root,
            table=self.table,
            incidents=self.incidents,
            launcher=self.launcher,
            stats=self.stats,
            clock=self.clock,
            compile_cache=self.root.cache,
            signing_key=None,
            environment={"PATH": "/usr/bin:/bin"},
            spawn=self.spawn,
            owner_of=self.owner_of,
            on_settled=self.on_settled,
        )

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start ``work``, kept until `close`."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        return task

    def owner_of(self, record: JobRecord) -> JobRecord | None:
        """The other job a supervisor holds that writes ``record``'s checkpoint (as Wardend)."""
        for supervisor in self.supervisors.values():
            other = supervisor.record
            if other.id != record.id and other.checkpoint == record.checkpoint:
                return other
        return None

    def on_settled(self, supervisor: Supervising) -> None:
        """The job needs no slot any more: its supervisor is let go (as Wardend)."""
        job_id = supervisor.record.id
        if self.supervisors.get(job_id) is supervisor:
            del self.supervisors[job_id]
        self.settled.append(job_id)
        self._changed.set()

    # ---- what a test does

    def submit(self, job_id: str, **sections: Any) -> JobRecord:
        """A new queued job (`document` with ``sections``)."""
        return intake(self.root, self.table, document(job_id, **sections))

    def worker(self, record: JobRecord, seed: str = "a") -> Worker:
        """The events of ``record``'s experiment (``seed``), with its own step counts."""
        run = record.job.run
        return Worker(
            seed=seed,
            steps=run.steps,
            checkpoint_every=run.checkpoint_every,
            checkpoint_dir=str(self.root.checkpoints / record.checkpoint),
        )

    def put(self, record: JobRecord, state: JobState) -> JobRecord:
        """Move a queued ``record`` to ``state`` through legal transitions (`PATHS`), as if
        an earlier supervisor had; an attempt was made if it ever started."""
        for target in PATHS[state]:
            if target is S.STARTING:
                record.attempt += 1
            self.table.transition(record, target, f"to {target.value} for the test")
        return record

    def job_in(self, job_id: str, state: JobState, **sections: Any) -> JobRecord:
        """A new job, moved to ``state`` with no supervisor holding it."""
        return self.put(self.submit(job_id, **sections), state)

    async def live(self, job_id: str, **sections: Any) -> tuple[JobRecord, ScriptedAttempt]:
        """A new job whose first attempt runs (ready, then busy at step 1) under a supervisor."""
        record = self.submit(job_id, **sections)
        work = self.worker(record)
        self.launcher.plan(job_id, [*work.start(), *work.updates(1, 1), Hang()])
        await self.launched(record)
        attempt = self.launcher.of(job_id)[-1]
        await attempt.reached()
        return record, attempt

    def supervise(self, record: JobRecord) -> JobSupervisor:
        """A supervisor for ``record``, holding a slot."""
        supervisor = JobSupervisor(record, self.services())
        self.supervisors[record.id] = supervisor
        return supervisor

    async def launched(self, record: JobRecord) -> JobSupervisor:
        """``record`` supervised, its first attempt launched."""
        supervisor = self.supervise(record)
        await supervisor.launch()
        return supervisor

    async def until_settled(self, job_id: str) -> None:
        """Return once ``job_id``'s supervisor has said it needs no slot any more."""
        while job_id not in self.settled:
            self._changed.clear()
            await self._changed.wait()

    async def until(self, check: Callable[[], bool]) -> None:
        """Return once ``check()`` holds, looking after each turn of the loop."""
        while not check():
            await asyncio.sleep(0)

    def states(self, record: JobRecord) -> list[str]:
        """Every state ``record`` has been in, from its history."""
        return [entry["to"] for entry in record.history]

    def incident_records(self, job_id: str) -> list[dict[str, Any]]:
        """The latest record of each of the job's incidents, oldest first."""
        return self.incidents.load(job_id)

    def event_kinds(self, job_id: str, attempt: int) -> list[str]:
        """The kinds of the events one attempt's events.jsonl kept."""
        path = self.root.job(job_id) / "attempts" / str(attempt) / "events.jsonl"
        return [item.kind for item in read_events(path) if isinstance(item, Event)]

    def exit_record(self, job_id: str, attempt: int) -> dict[str, Any]:
        """One attempt's exit.json."""
        return json.loads(
            (self.root.job(job_id) / "attempts" / str(attempt) / "exit.json").read_text()
        )

    def saved_state(self, job_id: str) -> dict[str, Any]:
        """The job's ``state.json`` as persisted."""
        return json.loads((self.root.job(job_id) / "state.json").read_text())

    # ---- the daemon's actions, as the handlers see them (`View`)

    def is_live(self, job_id: str) -> bool:
        """Whether the job has an attempt running now."""
        supervisor = self.supervisors.get(job_id)
        return supervisor is not None and supervisor.attempt is not None

    def stop_job(self, record: JobRecord) -> dict[str, Any] | None:
        """Preempt a job; None when nothing runs."""
        supervisor = self.supervisors.get(record.id)
        return supervisor.stop() if supervisor is not None else None

    def metrics_text(self) -> str:
        """The Prometheus exposition of the rig's state, rendered as the daemon renders it."""
        return metrics.render(self)

    def notifications_delivered(self) -> dict[str, int]:
        """Hook and webhook events sent, dropped and overflowed (none: no sink is set)."""
        return self.hooks.counts()

    def resume_job(self, record: JobRecord) -> dict[str, Any]:
        """Queue a preempted, failed or escalated job again."""
        record.restarts = 0
        record.resume_on_start = False
        self.table.transition(record, JobState.QUEUED, "resumed by operator")
        self.queue.append(record.id)
        return {"job": record.id, "state": record.state.value}

    def _admit(self, taken: Job | Rejection) -> None:
        if isinstance(taken, Rejection):
            self.stats.intake_rejected += 1
            return
        self.stats.intake_accepted += 1
        self.queue.append(self.table.adopt(self.spool.adopted(taken)).id)

    # ---- the run of one scenario

    async def __aenter__(self) -> Rig:
        self.logs = self._exits.enter_context(structlog.testing.capture_logs())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Cancel what still runs, close the files; fail on any task or handler failure."""
        try:
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.intake_queue.close()
            self.intake_queue.executor.shutdown(wait=True)
            self.hooks.close()
            self.incidents.close()
        finally:
            self._exits.close()
        raised = [t.exception() for t in self.tasks if not t.cancelled() and t.exception()]
        failed = [r for r in self.logs if r.get("event") in FAILURES]
        assert raised == []
        assert failed == []


def play(
    path: Path,
    scenario: Callable[[Rig], Awaitable[T]],
    launcher: ScriptedLauncher | None = None,
) -> T:
    """Run ``scenario`` on a fresh `Rig` in its own event loop, within a time limit."""

    async def main() -> T:
        async with Rig(path / "root", launcher) as rig:
            return await asyncio.wait_for(scenario(rig), SCENARIO_TIMEOUT_S)

    return asyncio.run(main())
