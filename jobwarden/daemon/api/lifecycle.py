"""An operator ends what was started: stop, cancel, restart, signal, remove, and retention.

``remove`` with ``fresh: true`` archives each job's checkpoint directory with
it, and ``archive_checkpoint`` archives one that no job holds, so that a new
job of that checkpoint starts from step 0 (``wardenctl submit --fresh``).

Each request names one or more jobs (``jobs``: a list of ids) or every job
it applies to (``all: true``), as supervisorctl accepts, and answers one
result per job, so one unknown name does not hide what was done to the
others.  Everything runs on the daemon's loop; the job folders read for
``archived`` and ``rejected`` are read in a thread.

A job whose worker runs cannot be cancelled or restarted at once: it is
preempted first (its worker commits its current step), and the cancel or
the resume follows once it rests.  `Lifecycle.follow_up` keeps stopping each
new attempt of such a job (one a stall or a crash started meanwhile) until
it does.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from jobwarden.daemon.api import arguments
from jobwarden.daemon.background import Background, off_loop
from jobwarden.daemon.store import archive
from jobwarden.daemon.store.jobs import JobRecord
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import check_name
from jobwarden.protocol import ControlError
from jobwarden.states import RESUMABLE, TERMINAL, JobState

if TYPE_CHECKING:
    from jobwarden.daemon.view import View

log = structlog.get_logger("wardend.lifecycle")

S = JobState
MAX_NAMES = 1000
POLL_S = 0.1
"""How often a job being cancelled or restarted is looked at until it rests."""
KEEP_EVERY_S = 1.0
"""How often the ``--keep-finished`` retention is applied."""
CANCELLABLE_AT_ONCE = frozenset({S.QUEUED, *RESUMABLE})
SIGNALS = frozenset({"HUP", "INT", "QUIT", "USR1", "USR2", "TERM", "CONT", "STOP", "WINCH"})
"""What ``signal`` may send: USR1 is the worker's stack dump.  Not KILL: stop and cancel
end a job the way that keeps its evidence."""
REJECTED_LIMIT = 10_000
ERROR_SUFFIX = ".error.json"


class Lifecycle:
    """The lifecycle requests of one daemon, and the cancels and restarts under way."""

    def __init__(
        self, daemon: View, keep_finished: int | None = None, keep_days: float | None = None
    ) -> None:
        self.daemon = daemon
        self.keep_finished = keep_finished
        self.keep_days = keep_days
        self.pending: dict[str, str] = {}
        """Job id -> "cancel" or "restart", for jobs being stopped first."""
        self.background = Background("lifecycle")

    def handlers(self) -> dict[str, Any]:
        """The requests this module answers."""
        return {
            "stop": self.stop,
            "cancel": lambda args: self.each(args, self.cancel_one, "cancel"),
            "restart": lambda args: self.each(args, self.restart_one, None),
            "remove": lambda args: self.each(
                args,
                lambda r: self.remove_one(
                    r, replacing=args.get("replacing") is True, fresh=args.get("fresh") is True
                ),
                "remove",
            ),
            "archive_checkpoint": self.archive_checkpoint,
            "signal": self.signal,
            "archived": lambda args: off_loop(archive.rows, self.daemon.root),
            "rejected": self.rejected,
        }

    # ---- selecting jobs

    def each(self, args: dict[str, Any], action: Any, all_of: str | None) -> dict[str, Any]:
        """Apply ``action`` to each named job (or to every job ``all_of`` applies to)."""
        results = []
        for name, record in self.selected(args, all_of):
            if record is None:
                results.append(failure(name, "control.no_such_job", f"no job {name!r:.80}"))
                continue
            try:
                results.append({"job": record.id, "ok": True, **action(record)})
            except ControlError as error:
                results.append(failure(record.id, error.code, error.message))
        return {"results": results}

    def selected(self, args: dict[str, Any], all_of: str | None) -> list[tuple[str, Any]]:
        """(name, record or None) for each job a request names."""
        table = self.daemon.table
        if args.get("all") is True:
            if all_of is None:
                raise ControlError("control.bad_request", "all: not for this command")
            return [(r.id, r) for r in list(table) if applies(all_of, r, self.daemon)]
        names = args.get("jobs")
        if (
            not isinstance(names, list)
            or not 1 <= len(names) <= MAX_NAMES
            or not all(isinstance(n, str) for n in names)
        ):
            raise ControlError(
                "control.bad_request",
                f"jobs must be a list of 1 to {MAX_NAMES} job ids (or all: true)",
            )
        return [(name, table.get(name)) for name in dict.fromkeys(names)]

    # ---- stop, cancel, restart

    def stop(self, args: dict[str, Any]) -> Any:
        """stop job | jobs | all: preempt (the worker commits its current step)."""
        if "job" in args:  # the single-job form: one answer, or its error
            return arguments.stop(self.daemon, args)
        return self.each(args, self.stop_one, "stop")

    def stop_one(self, record: JobRecord) -> dict[str, Any]:
        """Preempt one job; raises control.not_running when nothing runs."""
        answer = self.daemon.stop_job(record)
        if answer is None:
            raise ControlError(
                "control.not_running", f"job {record.id} is {record.state.value}; nothing to stop"
            )
        log.info("job.stop_requested", job=record.id, attempt=record.attempt, pid=record.pid)
        return {"state": record.state.value, **answer}

    def cancel_one(self, record: JobRecord) -> dict[str, Any]:
        """Cancel a queued or resting job at once; a running one once it has committed."""
        if record.state in TERMINAL:
            raise ControlError(
                "control.bad_state", f"job {record.id} is {record.state.value} already"
            )
        if record.id not in self.daemon.supervisors and record.state in CANCELLABLE_AT_ONCE:
            self.finish_cancel(record)
            return {"state": record.state.value, "cancelling": False}
        return self.stop_then(record, "cancel")

    def restart_one(self, record: JobRecord) -> dict[str, Any]:
        """Stop a running job (it commits), then resume it; resume a resting one at once."""
        if record.id not in self.daemon.supervisors:
            if record.state not in RESUMABLE:
                raise ControlError(
                    "control.bad_state",
                    f"job {record.id} is {record.state.value}; restart applies to running, "
                    "preempted, failed or escalated jobs",
                )
            log.info("job.restart_requested", job=record.id, state=record.state.value)
            return {**self.daemon.resume_job(record), "restarting": False}
        return self.stop_then(record, "restart")

    def stop_then(self, record: JobRecord, action: str) -> dict[str, Any]:
        """Preempt a job a supervisor holds, and ``action`` it once it rests."""
        doing = {"cancel": "cancelling", "restart": "restarting"}[action]
        if record.id in self.pending:
            return {"state": record.state.value, doing: True, "already": True}
        self.pending[record.id] = action
        log.info(f"job.{action}_requested", job=record.id, attempt=record.attempt, pid=record.pid)
        supervisor = self.daemon.supervisors.get(record.id)
        attempt = supervisor.attempt if supervisor is not None else None
        answer = self.daemon.stop_job(record) or {}
        if record.id in self.pending:
            self.background.spawn(self.follow_up(record, attempt.running if attempt else None))
        return {"state": record.state.value, doing: True, **answer}

    async def follow_up(self, record: JobRecord, stopped: object | None) -> None:
        """Stop every new attempt of ``record`` until it rests, then cancel or resume it
        (``stopped``: the running attempt already stopped, known by identity only)."""
        daemon = self.daemon
        while record.id in self.pending and daemon.table.get(record.id) is record:
            supervisor = daemon.supervisors.get(record.id)
            if supervisor is None:
                self.finish(record)
                return
            running = supervisor.attempt.running if supervisor.attempt else None
            if running is None or running is not stopped:
                # a new attempt (a restart after a stall or a crash), or a restart backoff
                stopped = running
                daemon.stop_job(record)
            await asyncio.sleep(POLL_S)

    def finish(self, record: JobRecord) -> None:
        """The job rests: carry out the cancel or the restart it waited for."""
        action = self.pending.pop(record.id, None)
        if action == "cancel" and record.state in CANCELLABLE_AT_ONCE:
            self.finish_cancel(record)
        elif action == "restart" and record.state in RESUMABLE:
            self.daemon.resume_job(record)
        elif action is not None:
            log.info(f"job.{action}_moot", job=record.id, state=record.state.value)

    def finish_cancel(self, record: JobRecord) -> None:
        """Move a job that no supervisor holds to cancelled."""
        record.resume_on_start = False
        step = f" at step {record.step}" if record.attempt else ""
        self.daemon.table.transition(
            record, S.CANCELLED, f"cancelled by operator{step} (was {record.state.value})"
        )
        self.retain()

    # ---- signal, remove, retention

    def signal(self, args: dict[str, Any]) -> Any:
        """signal job name: send an allowed signal to the job's live worker."""
        record = arguments.job_record(self.daemon, args)
        name = args.get("signal")
        name = name.upper().removeprefix("SIG") if isinstance(name, str) else name
        if name not in SIGNALS:
            raise ControlError(
                "control.bad_request",
                f"signal must be one of {', '.join(sorted(SIGNALS))}, not {name!r:.20}",
            )
        supervisor = self.daemon.supervisors.get(record.id)
        attempt = supervisor.attempt if supervisor is not None else None
        if attempt is None:
            raise ControlError(
                "control.not_running", f"job {record.id} is {record.state.value}; no worker runs"
            )
        signum = signal.Signals[f"SIG{name}"]
        attempt.running.signal(signum)
        log.info("job.signalled", job=record.id, attempt=attempt.number, signal=signum.name)
        return {"job": record.id, "signal": signum.name, "pid": attempt.running.pid}

    def remove_one(
        self, record: JobRecord, replacing: bool = False, fresh: bool = False
    ) -> dict[str, Any]:
        """Archive a settled job whole; its id is free again (``replacing``: for the job file
        ``submit --replace`` hands in next, which the archive's reason says; ``fresh``: its
        checkpoint directory goes with it, unless another job holds that too)."""
        if record.state not in archive.REMOVABLE or record.id in self.daemon.supervisors:
            raise ControlError(
                "control.bad_state",
                f"job {record.id} is {record.state.value}; remove applies to completed, "
                "cancelled, failed or escalated jobs (cancel it first)",
            )
        if fresh:
            self.refuse_shared(record.checkpoint, record.id)
        state = record.state.value
        why = "replaced (wardenctl submit --replace)" if replacing else "removed by operator"
        carried = fresh and archive.is_directory(self.daemon.root.checkpoints / record.checkpoint)
        target = archive.archive_job(self.daemon.root, self.daemon.table, record, why, fresh=fresh)
        self.daemon.incidents.forget(record.id)
        held = f"{target.name}/{archive.CHECKPOINT}" if carried else None
        return {"state": state, "archived": target.name, "checkpoint_archived": held}

    def refuse_shared(self, checkpoint: str, job_id: str | None = None) -> None:
        """Raise control.bad_state when a job other than ``job_id`` names ``checkpoint``."""
        others = sorted(
            r.id for r in self.daemon.table if r.checkpoint == checkpoint and r.id != job_id
        )
        if others:
            raise ControlError(
                "control.bad_state",
                f"checkpoint {checkpoint!r} is also the checkpoint of job {', '.join(others)}: "
                "remove that job first (with --fresh to archive the directory with it)",
            )

    def archive_checkpoint(self, args: dict[str, Any]) -> dict[str, Any]:
        """archive_checkpoint checkpoint: move a checkpoint directory that no job in the
        table names to ``ROOT/archive/checkpoints/``, so a new job of it starts from step 0."""
        name = args.get("checkpoint")
        try:
            checked = check_name(name) if isinstance(name, str) else None
        except ValueError:
            checked = None
        if checked is None:
            raise ControlError(
                "control.bad_request", "checkpoint: a checkpoint name as a job file gives it"
            )
        name = checked
        self.refuse_shared(name)
        target = archive.archive_checkpoint(self.daemon.root, name)
        where = f"{archive.CHECKPOINTS}/{target.name}" if target is not None else None
        return {"checkpoint": name, "archived": where}

    def retain(self) -> None:
        """Apply ``--keep-finished`` and ``--keep-finished-days``."""
        daemon, days = self.daemon, self.keep_days
        max_age_s = None if days is None else days * archive.DAY_S
        moved = archive.retain(
            daemon.root, daemon.table, daemon.supervisors, self.keep_finished, max_age_s
        )
        for job_id in moved:
            daemon.incidents.forget(job_id)

    @property
    def retains(self) -> bool:
        """Whether a retention is set (``--keep-finished``, ``--keep-finished-days``)."""
        return self.keep_finished is not None or self.keep_days is not None

    async def keep(self) -> None:
        """Apply the retention now and every `KEEP_EVERY_S`, while the daemon runs."""
        while not self.daemon.shutting_down:
            try:
                self.retain()
            except Exception as error:  # the next turn tries again
                log.error("retention.failed", error=repr(error), exc_info=error)
            await asyncio.sleep(KEEP_EVERY_S)

    async def rejected(self, args: dict[str, Any]) -> Any:
        """rejected [lines]: the newest rejected requests with their problems, newest last."""
        count = arguments.int_arg(args, "lines", 100, 1, REJECTED_LIMIT)
        return await off_loop(rejected_requests, self.daemon.root, count)


def applies(command: str, record: JobRecord, daemon: View) -> bool:
    """Whether ``all`` takes in ``record`` for ``command``."""
    if command == "stop":
        return record.id in daemon.supervisors
    if command == "cancel":
        return record.state not in TERMINAL
    return record.state in archive.REMOVABLE and record.id not in daemon.supervisors


def failure(job: str, code: str, message: str) -> dict[str, Any]:
    """One job's refusal within a multi-job answer."""
    return {"job": job, "ok": False, "error": {"code": code, "message": message}}


def rejected_requests(root: Root, count: int) -> dict[str, Any]:
    """The newest ``count`` rejections of ``spool/rejected`` (their error files), newest last."""
    records = []
    for path in root.rejected.glob("*" + ERROR_SUFFIX):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            record = {"problems": [f"error file unreadable: {error}"], "received": 0}
        if not isinstance(record, dict):
            record = {"problems": ["error file is not an object"], "received": 0}
        kept = Path(path.name.removesuffix(ERROR_SUFFIX))
        records.append(
            {
                "file": record.get("file", kept.name),
                "submitted_as": record.get("submitted_as", kept.name),
                "received": record.get("received"),
                "problems": record.get("problems", []),
                "kept_at": str(root.rejected / kept),
            }
        )
    records.sort(key=lambda r: r["received"] if isinstance(r["received"], int | float) else 0)
    return {"count": len(records), "rejected": records[-count:]}
