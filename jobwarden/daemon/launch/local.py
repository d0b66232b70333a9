"""The local launcher: each attempt is a process group on this box, watched with psutil.

The worker starts in a new session (its own process group), in the spec's
working directory, stdin from /dev/null, stdout a pipe whose every byte is kept
(``events.jsonl``, or ``output.log`` for a plain program), stderr straight into
``stderr.log``.  Its exit is learned from asyncio's child watcher, whoever
still holds the pipe; then its group and every descendant that left it are
killed (`jobwarden.daemon.launch.reaper`), so nothing the worker started
outlives the attempt.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import structlog

from jobwarden.daemon.background import off_loop
from jobwarden.daemon.children import CHILDREN
from jobwarden.daemon.config import LaunchSettings
from jobwarden.daemon.launch import reaper
from jobwarden.daemon.launch.base import (
    ATTEMPT_ENV,
    LINE_LIMIT,
    Launcher,
    LaunchSpec,
    ProcessGroupAttempt,
    RunningAttempt,
    suppress_gone,
)
from jobwarden.daemon.launch.group_spares import GroupSpares, group_key
from jobwarden.daemon.launch.members import GroupAttempt
from jobwarden.daemon.launch.program_spares import ProgramSpares, program_key
from jobwarden.daemon.launch.spares import SparePool, handed_to
from jobwarden.daemon.store.evidence import open_evidence
from jobwarden.runtime import SUPERVISOR_ENV

log = structlog.get_logger("wardend.local")
ORPHAN_WAIT_S = 60.0
ORPHAN_POLL_S = 0.05


class LocalAttempt(ProcessGroupAttempt):
    """One attempt's worker process group, sampled with psutil."""

    def __init__(self, spec: LaunchSpec, proc: asyncio.subprocess.Process) -> None:
        super().__init__(spec, proc)
        reaper.LEADERS.add(proc.pid)
        self.folders = {str(spec.folder)}
        """The attempt folders its descendants may name (`ATTEMPT_ENV`): a spare's too."""
        try:
            self._ps: psutil.Process | None = psutil.Process(proc.pid)
            self.folders.add(self._ps.environ().get(ATTEMPT_ENV, str(spec.folder)))
        except psutil.Error:
            self._ps = None

    async def after_exit(self) -> None:
        """The leader has exited: its group and every stray of its folders are killed, off the
        loop, before the attempt counts as ended."""
        reaper.LEADERS.discard(self.pid)
        killed = await off_loop(reaper.sweep, self.pid, self.folders)
        if killed:
            log.warning("attempt.strays_killed", job=self.spec.job_id, pid=self.pid, strays=killed)

    def create_time(self) -> float | None:
        """The kernel's start time of the worker."""
        try:
            return self._ps.create_time() if self._ps else None
        except psutil.Error:
            return None

    def sample(self) -> dict[str, Any]:
        """rss, cpu%, status and threads of the worker, from psutil (the daemon reaps ended
        orphans at each sampling turn, `reaper.reap_orphans`, not each attempt)."""
        if self._ps is None:
            return {}
        try:
            with self._ps.oneshot():
                times = self._ps.cpu_times()
                return {
                    "rss_mb": round(self._ps.memory_info().rss / 2**20, 1),
                    "cpu_percent": self._ps.cpu_percent(interval=None),
                    "status": self._ps.status(),
                    "threads": self._ps.num_threads(),
                    "cpu_s": times.user + times.system,
                    "sampled": time.time(),
                }
        except psutil.Error:
            return {}


class LocalLauncher(Launcher):
    """Starts each attempt as a process group on this box."""

    name = "local"

    def __init__(self, settings: LaunchSettings | None = None) -> None:
        super().__init__(settings)
        reaper.become_subreaper()
        warm = self.settings.warm_spares
        self.spares = SparePool() if warm else None
        """Warm spares for built-in task jobs (`jobwarden.daemon.launch.spares`); None: cold."""
        self.groups = GroupSpares() if warm else None
        """Group spares for built-in multi-process jobs (`jobwarden.daemon.launch.group_spares`)."""
        memory = self.settings.spare_memory_mb
        self.programs = ProgramSpares(memory) if warm and memory != 0 else None
        """Spares of SDK programs (`jobwarden.daemon.launch.program_spares`); None: cold."""

    async def close(self) -> None:
        """Retire every warm spare (each ends at once when its stdin closes), every group
        spare and every program's spare, and wait for them to end."""
        if self.spares is not None:
            await self.spares.close()
        if self.groups is not None:
            await self.groups.close()
        if self.programs is not None:
            await self.programs.close()

    def settled(self, job_id: str) -> None:
        """The job rests: its program's spare or its group spare is killed, with every
        process tree."""
        if self.programs is not None:
            self.programs.settled(job_id)
        if self.groups is not None:
            self.groups.settled(job_id)

    def spare_of(self, job_id: str) -> dict[str, Any] | None:
        """The job's program spare or group spare: pids, preparing or ready, and the memory
        its trees hold."""
        if self.groups is not None and (group := self.groups.view(job_id)) is not None:
            return group
        return self.programs.view(job_id) if self.programs is not None else None

    async def wait_orphan(self, pid: int, started: float | None) -> None:
        """Poll the old worker until it exits (it sees its stdout break, commits and leaves);
        SIGKILL its group after `ORPHAN_WAIT_S`.  A pid reused by another process counts
        as gone."""
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
            await asyncio.sleep(ORPHAN_POLL_S)
        log.warning("orphan.killed", pid=pid, waited_s=ORPHAN_WAIT_S)
        with suppress_gone():
            os.killpg(pid, signal.SIGKILL)

    def find_orphans(self, job_folder: Path) -> list[tuple[int, float | None]]:
        """Every process of this user whose environment names an attempt folder of the job
        (`ATTEMPT_ENV`, set at spawn), or a spare's folder that was handed one (`handed_to`),
        so a worker is found even if its pid was never saved."""
        prefix = f"{job_folder}{os.sep}attempts{os.sep}"
        found = []
        for proc in psutil.process_iter(["uids"]):
            try:
                if proc.info["uids"] is None or proc.info["uids"].real != os.getuid():
                    continue
                folder = proc.environ().get(ATTEMPT_ENV, "")
                if folder.startswith(prefix) or handed_to(folder).startswith(prefix):
                    found.append((proc.pid, proc.create_time()))
            except psutil.Error:  # gone, a zombie, or not ours to read
                continue
        return found

    async def start(self, spec: LaunchSpec) -> RunningAttempt:
        """Spawn the worker in a new session, stderr straight to stderr.log; N cooperating
        members for ``processes = N`` (`jobwarden.daemon.launch.members`).  A job that
        gave up exactness (``[run] exact = false``) always starts cold: a spare has JAX
        running already, pinned to one thread."""
        if spec.job is not None and not spec.job.run.exact:
            if spec.processes > 1:
                return await GroupAttempt.start(spec, self.spawn)
            return await self.spawn(spec, "stderr.log")
        if spec.processes > 1:
            programs = self.programs if program_key(spec) is not None else None
            if programs is None and self.groups is not None and group_key(spec) is not None:
                return await self.groups.start(spec, self.spawn, LocalAttempt)
            if programs is None:
                return await GroupAttempt.start(spec, self.spawn)

            async def member(one: LaunchSpec, stderr_name: str) -> RunningAttempt:
                return await programs.start(one, self.spawn, LocalAttempt, stderr_name)

            return await GroupAttempt.start(spec, member)  # each member on its own spare
        if self.programs is not None and program_key(spec) is not None:
            return await self.programs.start(spec, self.spawn, LocalAttempt)
        if self.spares is not None:
            return await self.spares.start(spec, self.spawn, LocalAttempt)
        return await self.spawn(spec, "stderr.log")

    async def spawn(self, spec: LaunchSpec, stderr_name: str) -> LocalAttempt:
        """One process group, its stderr straight to ``stderr_name`` in the attempt folder."""
        spec.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {**spec.env, SUPERVISOR_ENV: str(os.getpid()), ATTEMPT_ENV: str(spec.folder)}
        with open_evidence(spec.folder / stderr_name) as stderr, CHILDREN.starting():
            proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd=spec.cwd,
                start_new_session=True,
                limit=LINE_LIMIT,
            )
            CHILDREN.follow(proc)
        return LocalAttempt(spec, proc)
