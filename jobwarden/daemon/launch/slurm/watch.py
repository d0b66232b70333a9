"""One Slurm job as the daemon follows it: its polled state, its start, its signals, its files.

`SlurmWatch` asks slurmctld for the job's state (``scontrol -o show job``,
every `STATE_POLL_S`), notes when it leaves the queue (the startup watch starts
then, not at submission), and sends it signals through ``scancel``.  An
attempt of one process and each member of an N-process attempt follow their
files with `FileFeed`: the worker writes them on its node, so the daemon reads
what was appended (polling: inotify sees nothing a remote node writes).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.background import Background
from jobwarden.daemon.launch.base import LauncherError
from jobwarden.daemon.launch.slurm.ctl import query, slurm_command
from jobwarden.daemon.launch.slurm.state import Phase, SlurmJob
from jobwarden.daemon.store.evidence import EvidenceFile

log = structlog.get_logger("wardend.slurm")
STATE_POLL_S = 0.5
"""How often the job's state is asked of slurmctld (the issue asks for at most 1 s)."""
FILE_POLL_S = 0.05
"""How often an attempt's event files are read for new lines."""


class FollowedFile(EvidenceFile):
    """The worker writes its own event file on the node; `pump` must not write it again."""

    def write(self, data: bytes) -> None:
        """Nothing to keep: the bytes are already in the file."""


@dataclass
class FileFeed:
    """Hands what a worker appended to ``path`` to a reader, from where it last stopped."""

    path: Path
    reader: asyncio.StreamReader
    offset: int = 0

    def feed(self) -> bool:
        """Give the reader the new bytes; whether there were any."""
        fed = False
        try:
            with self.path.open("rb") as stream:
                stream.seek(self.offset)
                while chunk := stream.read(1 << 16):
                    self.reader.feed_data(chunk)
                    self.offset += len(chunk)
                    fed = True
        except FileNotFoundError:
            pass
        except OSError as error:
            log.warning("slurm.events_unreadable", file=str(self.path), error=str(error))
        return fed


@dataclass
class SlurmWatch:
    """The state of one Slurm job, as last polled, and what waits for it to start or end."""

    job_id: str
    label: str
    submitted_mono: float = field(default_factory=time.monotonic)
    job: SlurmJob | None = None
    started_mono: float | None = None
    over: bool = False
    """The job ended, was requeued, or Slurm no longer knows it."""
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    background: Background = field(default_factory=lambda: Background("slurm"))
    terminated: bool = False

    @property
    def started(self) -> bool:
        """Whether the job has left the queue."""
        return self.started_mono is not None

    @property
    def queued(self) -> bool:
        """Whether the job still waits in the queue, as far as is known."""
        return self.job.phase is Phase.QUEUED if self.job is not None else not self.started

    async def poll(self) -> SlurmJob | None:
        """Ask slurmctld once; a failed question is logged and changes nothing."""
        try:
            job = self.job = await query(self.job_id)
        except LauncherError as error:
            log.warning("slurm.poll_failed", slurm_job=self.job_id, error=str(error))
            return self.job
        if job is None or job.phase is not Phase.QUEUED:
            self.mark_started()
        if job is None or job.phase in (Phase.ENDED, Phase.REQUEUED):
            self.over = True
        return job

    async def watch(self) -> None:
        """Poll until the job is over (an N-member attempt runs this beside its members)."""
        while not self.over:
            await self.poll()
            if not self.over:
                await asyncio.sleep(STATE_POLL_S)

    def when_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the job has left the queue."""
        if self.started:
            callback()
        else:
            self.callbacks.append(callback)

    def mark_started(self) -> None:
        """The job runs (its state says so, or its first event line arrived)."""
        if self.started:
            return
        self.started_mono = time.monotonic()
        pending = round(self.started_mono - self.submitted_mono, 3)
        log.info("slurm.started", job=self.label, slurm_job=self.job_id, pending_s=pending)
        for callback in self.callbacks:
            callback()
        self.callbacks.clear()

    def sample(self) -> dict[str, Any]:
        """The Slurm job id, state and reason (``PD (Resources)``): what status shows."""
        job = self.job
        state = job.describe() if job is not None else "submitted"
        return {
            "status": f"slurm {self.job_id} {state}",
            "slurm_job": self.job_id,
            "slurm_state": job.state if job is not None else None,
            "slurm_reason": job.reason if job is not None else None,
            "node": job.node if job is not None else None,
            "pending_s": round((self.started_mono or time.monotonic()) - self.submitted_mono, 3),
        }

    def scancel(self, *options: str) -> None:
        """Run ``scancel OPTIONS JOB`` in the background."""
        self.background.spawn(slurm_command("scancel", *options, self.job_id))

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the job's steps (the workers), never to srun."""
        if not self.over:
            self.scancel(f"--signal={signal.Signals(signum).name.removeprefix('SIG')}")

    def terminate(self) -> None:
        """SIGTERM to the steps once: every member of the job gets it from that one call."""
        if not self.terminated:
            self.terminated = True
            self.signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL everything of the job, then cancel it (a pending one included)."""
        if not self.over:
            self.scancel("--full", "--signal=KILL")
            self.scancel()

    async def stop(self, ended: asyncio.Event, grace_s: float) -> None:
        """SIGTERM through the batch script's trap (the path of Slurm's time limit), up to
        ``grace_s`` for the workers to commit, then `kill`; a job still queued is cancelled."""
        if self.queued:
            self.kill()
        elif not self.over:
            self.terminated = True
            await slurm_command("scancel", "--batch", "--signal=TERM", self.job_id)
        try:
            await asyncio.wait_for(ended.wait(), grace_s)
        except TimeoutError:
            self.kill()
            await ended.wait()
