"""The Slurm launcher: each attempt is one Slurm batch job whose script runs the worker by srun.

``wardend --launcher slurm`` submits every attempt with ``sbatch --parsable``,
named ``jw-<job>-<attempt>`` (`slurmscript`: its options and script).  The
daemon follows the attempt's files and the job's state (`slurmwatch`); what
each Slurm state means is `slurmstate`'s.  ``[run] processes = N`` runs N srun
tasks, each a member (`slurmgroup`).

Signals (measured on Slurm 22.05): a SIGTERM that reaches ``srun`` makes it
abort the step and SIGKILL the worker before it can commit, so nothing here
signals the batch step's processes with SIGTERM.  The script instead traps
SIGTERM and passes it to the job's steps (``scancel --signal=TERM``), where the
worker commits and exits 75.  The job carries ``--signal=B:TERM@<lead>``, so
Slurm's own time limit takes that path, and so does the daemon's stop
(``scancel --batch --signal=TERM``, the grace, then ``scancel``).

After the daemon's own restart, `SlurmLauncher.adopt` follows the Slurm job of
the job's last attempt again, by the id ``slurm.json`` recorded, rather than
submitting another.  A node that failed under an earlier attempt is excluded from the
next (`slurmexclude`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from jobwarden.daemon.config import LaunchSettings
from jobwarden.daemon.launch.base import (
    LINE_LIMIT,
    ExitInfo,
    Launcher,
    LauncherError,
    LaunchSpec,
    OnEvent,
    OnMalformed,
    RunningAttempt,
    pump,
)
from jobwarden.daemon.launch.slurm.ctl import query, sbatch, slurm_command
from jobwarden.daemon.launch.slurm.exclude import exclusion
from jobwarden.daemon.launch.slurm.group import SlurmGroupAttempt
from jobwarden.daemon.launch.slurm.lease import LeaseState, checkpoint_of, judge_directory
from jobwarden.daemon.launch.slurm.script import (
    EXIT_RECORD,
    JOB_RECORD,
    MEMBER_SCRIPT,
    SCRIPT,
    SlurmSettings,
    batch_script,
    member_script,
    read_status,
)
from jobwarden.daemon.launch.slurm.state import Phase, exit_of
from jobwarden.daemon.launch.slurm.watch import (
    FILE_POLL_S,
    STATE_POLL_S,
    FileFeed,
    FollowedFile,
    SlurmWatch,
)
from jobwarden.files import write_text_atomic
from jobwarden.sections import section_of

log = structlog.get_logger("wardend.slurm")
ORPHAN_WAIT_S = 60.0


class SlurmAttempt(RunningAttempt):
    """One attempt of one process as one Slurm job, followed through its files and scontrol."""

    def __init__(self, spec: LaunchSpec, watch: SlurmWatch) -> None:
        super().__init__(spec)
        self.events = FollowedFile(spec.folder / spec.stdout)
        self.watch = watch

    @property
    def pid(self) -> int | None:
        """The worker runs on a node: the daemon holds no pid of it."""
        return None

    @property
    def job_id(self) -> str:
        """The Slurm job id."""
        return self.watch.job_id

    def when_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the job has left the queue (the startup watch starts then)."""
        self.watch.when_started(callback)

    def sample(self) -> dict[str, Any]:
        """The Slurm job id, state and reason (``PD (Resources)``): what status shows."""
        return self.watch.sample()

    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Feed the event file's new bytes to `pump` and poll the job until it ends."""
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        pumping = asyncio.create_task(pump(reader, self.events, on_event, on_malformed))
        feed, watch, next_poll = FileFeed(self.events.path, reader), self.watch, 0.0
        while True:
            if feed.feed():
                watch.mark_started()  # a line before the poll saw RUNNING
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + STATE_POLL_S
                await watch.poll()
                if watch.over:
                    break
            await asyncio.sleep(FILE_POLL_S)
        job = watch.job
        if job is not None and job.phase is Phase.REQUEUED:
            await slurm_command("scancel", self.job_id)  # the next attempt is ours to start
        feed.feed()
        reader.feed_eof()
        await pumping
        ended = exit_of(job, read_status(self.spec.folder / EXIT_RECORD))
        log.info("slurm.ended", slurm_job=self.job_id, status=ended.status, why=ended.why)
        duration = time.monotonic() - (watch.started_mono or watch.submitted_mono)
        return self._ended(ExitInfo(ended.status, ended.signal, duration, ended.preempted))

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the job's steps (the worker), never to srun."""
        if self.exit_info is None:
            self.watch.signal(signum)

    def kill(self) -> None:
        """SIGKILL everything of the job, then cancel it (a pending one included)."""
        if self.exit_info is None:
            self.watch.kill()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM through the batch script's trap, ``grace_s`` to commit, then `kill`."""
        await self.watch.stop(self.ended, grace_s)


class SlurmLauncher(Launcher):
    """Submits each attempt as one Slurm batch job."""

    name = "slurm"

    def __init__(self, settings: LaunchSettings | None = None) -> None:
        super().__init__(settings)
        self.slurm = SlurmSettings.of(self.settings.slurm)

    async def start(self, spec: LaunchSpec) -> RunningAttempt:
        """Write the batch script and submit it; raises `LauncherError` when sbatch refuses."""
        spec.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        await self._end_earlier_attempts(spec)
        if spec.processes > 1:
            write_text_atomic(spec.folder / MEMBER_SCRIPT, member_script(spec))
        script = spec.folder / SCRIPT
        write_text_atomic(script, batch_script(spec))
        script.chmod(0o700)
        settings = self.slurm.for_job(section_of(spec.folder.parent.parent))
        excluded = await exclusion(spec, settings.nodes or 1)
        settings = replace(settings, exclude=tuple(excluded))
        argv = ["sbatch", *settings.sbatch_options(spec), str(script)]
        checkpoint = checkpoint_of(spec.folder)
        before = await judge_directory(checkpoint) if checkpoint is not None else None
        if before is not None and before.state is LeaseState.LIVE:
            log.warning("slurm.lease_live", job=spec.job_id, why=before.why)  # to be fenced
        job_id = await sbatch(argv, spec.env)
        record = {"slurm_job": job_id, "submitted": time.time(), "sbatch": argv}
        record["lease_before"] = before.as_record() if before is not None else None
        record["exclude"] = excluded
        write_text_atomic(spec.folder / JOB_RECORD, json.dumps(record, indent=2) + "\n")
        log.info("slurm.submitted", job=spec.job_id, attempt=spec.attempt, slurm_job=job_id)
        return self._attempt(spec, SlurmWatch(job_id, spec.job_id))

    @staticmethod
    def _attempt(spec: LaunchSpec, watch: SlurmWatch) -> RunningAttempt:
        if spec.processes > 1:
            return SlurmGroupAttempt.of(spec, watch)
        return SlurmAttempt(spec, watch)

    async def adopt(self, spec: LaunchSpec) -> RunningAttempt | None:
        """After the daemon's restart: follow again the Slurm job ``slurm.json`` of the
        attempt names, unless Slurm has forgotten it with no exit record from its script
        (None: the daemon recovers the usual way).  Its files are read from the start, so
        the supervisor learns all the attempt did; an ended job gives its real exit."""
        try:
            job_id = str(json.loads((spec.folder / JOB_RECORD).read_text())["slurm_job"])
            job = await query(job_id)
        except (OSError, ValueError, KeyError, LauncherError) as error:
            log.warning(
                "slurm.not_adopted", job=spec.job_id, attempt=spec.attempt, error=str(error)
            )
            return None
        if job is None and read_status(spec.folder / EXIT_RECORD) is None:
            return None
        watch = SlurmWatch(job_id, spec.job_id, job=job)
        if job is None or job.phase is not Phase.QUEUED:
            watch.started_mono = time.monotonic()
        log.info("slurm.adopted", job=spec.job_id, attempt=spec.attempt, slurm_job=job_id)
        return self._attempt(spec, watch)

    async def _end_earlier_attempts(self, spec: LaunchSpec) -> None:
        """An earlier attempt's Slurm job that still runs (one not adopted) is stopped as
        the local launcher stops an orphan (SIGTERM, it commits, it leaves) and waited
        for, so no two attempts of the job run at once."""
        for record in sorted(spec.folder.parent.glob(f"*/{JOB_RECORD}")):
            if record.parent == spec.folder:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, LauncherError):
                job_id = str(json.loads(record.read_text())["slurm_job"])
                job = await query(job_id)
                if job is None or job.phase is Phase.ENDED:
                    continue
                log.warning("slurm.orphan", job=spec.job_id, slurm_job=job_id)
                await slurm_command("scancel", "--batch", "--signal=TERM", job_id)
                deadline = time.monotonic() + ORPHAN_WAIT_S
                while time.monotonic() < deadline:
                    job = await query(job_id)
                    if job is None or job.phase is not Phase.RUNNING:
                        break
                    await asyncio.sleep(STATE_POLL_S)
                await slurm_command("scancel", job_id)
