"""An attempt of N members on Slurm: one Slurm job, ``--ntasks = N``, each srun task a member.

The members are followed as the local launcher's are (`GroupAttempt`: the one
stream the supervisor reads, each member's replay checked against its own log,
restart-all when one fails), with a `SlurmTask` per member in place of a
process group.  Member i's files are named as locally (`member_file`); it has
ended once its script recorded its exit status (``member.<i>.exit``) or the
Slurm job is over.  Signals go to the whole job through one `SlurmWatch`:
``scancel --signal`` reaches every task at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any

import structlog

from jobwarden.daemon.launch.base import (
    LINE_LIMIT,
    ExitInfo,
    LauncherError,
    LaunchSpec,
    OnEvent,
    OnMalformed,
    RunningAttempt,
    pump,
)
from jobwarden.daemon.launch.members import GroupAttempt, member_spec
from jobwarden.daemon.launch.slurm.ctl import slurm_command
from jobwarden.daemon.launch.slurm.exclude import failed, node_states
from jobwarden.daemon.launch.slurm.script import member_node, member_status
from jobwarden.daemon.launch.slurm.state import Phase, exit_of
from jobwarden.daemon.launch.slurm.watch import FILE_POLL_S, FileFeed, FollowedFile, SlurmWatch

log = structlog.get_logger("wardend.slurm")
JOB_END_WAIT_S = 5.0
"""How long the job may take to end once every member has: srun and the script leave."""


class SlurmTask(RunningAttempt):
    """Member ``index`` of an N-member Slurm attempt: its files, and the job's state."""

    def __init__(self, spec: LaunchSpec, index: int, watch: SlurmWatch) -> None:
        super().__init__(spec)
        self.events = FollowedFile(spec.folder / spec.stdout)
        self.index = index
        self.watch = watch

    @property
    def pid(self) -> int | None:
        """The member runs on a node: the daemon holds no pid of it."""
        return None

    @property
    def node(self) -> str | None:
        """The Slurm node the member runs on, as its script recorded it."""
        return member_node(self.spec.folder, self.index)

    def sample(self) -> dict[str, Any]:
        """The job's Slurm state (the members share it)."""
        return self.watch.sample()

    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Feed the member's event file to `pump` until it recorded its exit or the job is over."""
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        pumping = asyncio.create_task(pump(reader, self.events, on_event, on_malformed))
        feed = FileFeed(self.events.path, reader)
        while True:
            if feed.feed():
                self.watch.mark_started()
            status = member_status(self.spec.folder, self.index)
            if status is not None or self.watch.over:
                break
            await asyncio.sleep(FILE_POLL_S)
        feed.feed()
        reader.feed_eof()
        await pumping
        ended = exit_of(self.watch.job if self.watch.over else None, status)
        started = self.watch.started_mono or self.watch.submitted_mono
        duration = time.monotonic() - started
        return self._ended(ExitInfo(ended.status, ended.signal, duration, ended.preempted))

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the job's steps: every member gets it."""
        if self.exit_info is None:
            self.watch.signal(signum)

    def kill(self) -> None:
        """SIGKILL the whole job: a member cannot be killed alone."""
        if self.exit_info is None:
            self.watch.kill()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to the job's steps once (shared by the members), then `kill`."""
        self.watch.terminate()
        try:
            await asyncio.wait_for(self.ended.wait(), grace_s)
        except TimeoutError:
            self.kill()
            await self.ended.wait()


class SlurmGroupAttempt(GroupAttempt):
    """N members as one Slurm job; one failing fails all (restart-all)."""

    def __init__(self, spec: LaunchSpec, members: list[RunningAttempt], watch: SlurmWatch) -> None:
        super().__init__(spec, members)
        self.watch = watch

    @classmethod
    def of(cls, spec: LaunchSpec, watch: SlurmWatch) -> SlurmGroupAttempt:
        """The attempt of ``spec.processes`` members submitted as the Slurm job of ``watch``."""
        tasks: list[RunningAttempt] = [
            SlurmTask(member_spec(spec, index, ""), index, watch) for index in range(spec.processes)
        ]
        return cls(spec, tasks, watch)

    @property
    def job_id(self) -> str:
        """The Slurm job id."""
        return self.watch.job_id

    def when_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the job has left the queue."""
        self.watch.when_started(callback)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every member, with one ``scancel``."""
        if signum != signal.SIGUSR1:
            self._stopping = True
        self.watch.signal(signum)

    def kill(self) -> None:
        """SIGKILL the whole job."""
        self._stopping = True
        self.watch.kill()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM through the batch script's trap, ``grace_s`` to commit, then `kill`."""
        self._stopping = True
        await self.watch.stop(self.ended, grace_s)

    async def _lost_nodes(self) -> dict[int, str]:
        """Members whose node Slurm now reports down, drained, failing or not responding,
        each with ``n2, DOWN+NOT_RESPONDING``: the member did not fail, its machine did (a
        member's end is known once the Slurm job is over, and Slurm ends a job with a member
        on a dead node only once it declared the node down)."""
        nodes = {
            m.index: node for m in self.members if (node := member_node(self.spec.folder, m.index))
        }
        if not nodes:
            return {}
        try:
            states = await node_states()
        except LauncherError as error:
            log.warning("slurm.node_states", slurm_job=self.job_id, error=str(error))
            return {}
        return {
            index: f"{node}, {states[node]}"
            for index, node in nodes.items()
            if failed(states.get(node, ""))
        }

    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Follow every member while the job's state is polled beside them; a job Slurm
        requeued is cancelled (the next attempt is the daemon's to start)."""
        watching = asyncio.create_task(self.watch.watch())
        try:
            info = await super().follow(on_event, on_malformed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(watching), JOB_END_WAIT_S)
        finally:
            watching.cancel()
        job = self.watch.job
        if job is not None and job.phase is Phase.REQUEUED:
            await slurm_command("scancel", self.job_id)
        log.info(
            "slurm.ended", slurm_job=self.job_id, status=info.status, members=len(self.members)
        )
        return info
