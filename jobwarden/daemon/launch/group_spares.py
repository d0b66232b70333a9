"""Group spares: the N members of a built-in multi-process job, started together ahead of need.

A job of a built-in task with ``[run] processes = N`` (local launcher) gets,
once its first attempt is under way (`FIRST_AFTER_S`), a *group*: N warm
spares (``python -m jobwarden.worker.spare``) with the membership variables of
members 0..N-1 and a coordinator port of the group's own (free on loopback
when the group starts, as an attempt's is chosen).  They join
`jax.distributed` among themselves, import, build the task's data, compile
its update on the state's shapes and run the restore's and the commit's
collectives once (`jobwarden.worker.warm`); each then says it is ready and
waits on its stdin, holding no lock and writing nothing under the checkpoint
directory.  A spare cannot join another group once it has computed anything
(JAX refuses), so the group is handed whole or not at all: the restart-all
gives every member its attempt folder (``stderr.<i>.log`` opened by the
daemon, ``events.<i>.jsonl`` from its stdout, as `GroupAttempt` expects) and
the group's coordinator becomes the attempt's.  Each member answers
``taken`` within `HANDOFF_S`, then member 0 takes the writer lock, restores
the newest accepted checkpoint and shares it, and all go on.

A group with a member that died, is stopped, or does not answer its handoff
is discarded whole (killed and waited for) and the attempt starts cold; one
still preparing is not waited for.  A group whose member dies while it waits
is replaced, up to `MAX_FAILURES` times per job.  Each member's folder
(``jobs/<job>/spares/<n>-g<i>``) gets its ``HANDED_FILE`` before the handoff,
so a daemon restarted under a handed group finds its members as it finds a
cold attempt's.  A group is killed with every process naming its folders
when its job settles or changes, and when the daemon stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import structlog

from jobwarden.daemon.background import Background, off_loop
from jobwarden.daemon.launch import reaper
from jobwarden.daemon.launch.base import LaunchSpec, RunningAttempt
from jobwarden.daemon.launch.members import GroupAttempt, Spawn, free_port, member_spec
from jobwarden.daemon.launch.spares import HANDED_FILE, spare_folder, start_spare
from jobwarden.daemon.store.evidence import keep, open_evidence
from jobwarden.jobfolder import STDERR_FILE, member_file
from jobwarden.sdk.distributed import COORDINATOR_ENV, PROCESS_ID_ENV, PROCESSES_ENV

log = structlog.get_logger("wardend.spare")

FIRST_AFTER_S = 1.0
"""A job's first group starts this long after its first attempt: not beside its imports."""
REPLACE_AFTER_S = 3.0
"""After a handoff, the next group starts this much later: its N imports must not slow the
handed members' restore and first update on a small machine."""
HANDOFF_S = 2.0
"""A group with a member that has not answered ``taken`` this long after the handoff is
discarded; the attempt starts cold."""
READY_TIMEOUT_S = 300.0
MAX_FAILURES = 3
"""A job whose groups failed this many times (a member died, or never got ready) gets no more."""

Adopt = Callable[[LaunchSpec, asyncio.subprocess.Process], RunningAttempt]


def group_key(spec: LaunchSpec) -> str | None:
    """What a group must share with ``spec``'s attempt to run it: the job, its task and
    training fields, the member count, the interpreter, compile cache and environment; None
    for anything a group cannot run (a command job, one process, a workdir of its own)."""
    call, job = spec.worker, spec.job
    if call is None or job is None or job.task is None or spec.processes < 2 or spec.cwd:
        return None
    cache = str(call.cache) if call.cache is not None else None
    env = sorted(spec.env.items())
    return json.dumps(
        [job.id, job.task, job.train_fields(), spec.processes, call.python, cache, env]
    )


@dataclass
class Group:
    """The N spare members of one job's next attempt, and where their coordinator listens."""

    key: str
    coordinator: str
    procs: list[asyncio.subprocess.Process]
    folders: list[Path]
    ready: asyncio.Future[bool]
    prepared_s: list[float] = field(default_factory=list)

    def usable(self) -> bool:
        """Every member prepared, alive and not stopped."""
        done = self.ready.done() and not self.ready.cancelled() and self.ready.result()
        return done and all(_waiting(proc) for proc in self.procs)

    def preparing(self) -> bool:
        """Not yet ready, and no member has ended."""
        return not self.ready.done() and all(p.returncode is None for p in self.procs)

    def view(self) -> dict[str, Any]:
        """What ``status`` says of it: ready or preparing, the memory its members hold."""
        members = []
        for index, proc in enumerate(self.procs):
            rss = 0
            with contextlib.suppress(psutil.Error):
                ps = psutil.Process(proc.pid)
                rss = sum(p.memory_info().rss for p in [ps, *ps.children(recursive=True)])
            members.append({"process": index, "pid": proc.pid, "rss_mb": round(rss / 2**20, 1)})
        state = "ready" if self.usable() else "preparing"
        total = round(sum(m["rss_mb"] for m in members), 1)
        return {"state": state, "rss_mb": total, "group": True, "members": members}


def _waiting(proc: asyncio.subprocess.Process) -> bool:
    """Alive, and neither stopped nor a zombie (a hung member would never answer)."""
    if proc.returncode is not None:
        return False
    try:
        return psutil.Process(proc.pid).status() not in (
            psutil.STATUS_STOPPED,
            psutil.STATUS_ZOMBIE,
            psutil.STATUS_DEAD,
        )
    except psutil.Error:
        return False


@dataclass
class GroupSpares:
    """The group spares of built-in multi-process jobs, one group per job."""

    groups: dict[str, Group] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    handed: int = 0
    _background: Background = field(default_factory=lambda: Background("group-spare"))
    _dying: set[asyncio.subprocess.Process] = field(default_factory=set)
    _live: set[str] = field(default_factory=set)
    """The jobs with an attempt started and not yet settled: only these get a group."""
    _starting: set[str] = field(default_factory=set)

    async def start(self, spec: LaunchSpec, spawn: Spawn, adopt: Adopt) -> RunningAttempt:
        """``spec``'s attempt on the job's ready group, else cold (`GroupAttempt.start` with
        ``spawn``); then a group for the next attempt."""
        key = group_key(spec)
        assert key is not None
        self._live.add(spec.job_id)
        attempt = await self._hand(key, spec, adopt)
        delay = REPLACE_AFTER_S
        if attempt is None:
            attempt, delay = await GroupAttempt.start(spec, spawn), FIRST_AFTER_S
        self._background.spawn(self._ensure(key, spec, delay))
        return attempt

    def view(self, job_id: str) -> dict[str, Any] | None:
        """The job's group as ``status`` shows it; None when it has none."""
        group = self.groups.get(job_id)
        return None if group is None else group.view()

    def pids(self) -> list[int]:
        """The pids of the members of groups not handed out."""
        return [p.pid for g in self.groups.values() for p in g.procs if p.returncode is None]

    async def _hand(self, key: str, spec: LaunchSpec, adopt: Adopt) -> RunningAttempt | None:
        job = spec.job_id
        group = self.groups.get(job)
        if group is None or group.preparing():
            return None  # none, or still preparing: the attempt does not wait for it
        del self.groups[job]
        if group.key != key or not group.usable():
            why = "job changed" if group.key != key else "member lost"
            if group.key == key:
                self.failures[job] = self.failures.get(job, 0) + 1
            log.warning("spare.discarded", job=job, pids=[p.pid for p in group.procs], why=why)
            await self._kill(group)  # whole, and gone before the cold attempt starts
            return None
        assert spec.worker is not None
        spec.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        lines = []
        for index, folder in enumerate(group.folders):
            stderr = spec.folder / member_file(STDERR_FILE, index)
            open_evidence(stderr).close()  # created here as the daemon creates it: never a link
            if (error := keep(folder / HANDED_FILE, str(spec.folder))) is not None:
                log.warning("spare.unrecorded", job=job, folder=str(folder), error=error)
                await self._kill(group)
                return None
            lines.append(json.dumps(spec.worker.handoff(stderr)).encode() + b"\n")
        began = time.monotonic()
        answers = await asyncio.gather(
            *(_handoff(proc, line) for proc, line in zip(group.procs, lines, strict=True))
        )
        if not all(answers):
            lost = [p.pid for p, ok in zip(group.procs, answers, strict=True) if not ok]
            log.warning("spare.refused", job=job, attempt=spec.attempt, lost=lost)
            await self._kill(group)  # no member runs on: never two writers, never half a group
            return None
        self.handed += 1
        took = round(time.monotonic() - began, 4)
        members = []
        for index, proc in enumerate(group.procs):
            log.info(
                "spare.handed", job=job, attempt=spec.attempt, pid=proc.pid, process=index, s=took
            )
            members.append(adopt(member_spec(spec, index, group.coordinator), proc))
        return GroupAttempt(spec, members)

    async def _ensure(self, key: str, spec: LaunchSpec, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        job = spec.job_id
        if job not in self._live or job in self._starting:
            return  # settled meanwhile, or another start is under way
        if self.failures.get(job, 0) >= MAX_FAILURES:
            return
        current = self.groups.get(job)
        if current is not None and current.key == key and (current.preparing() or current.usable()):
            return
        if current is not None:
            self.retire(job, "job changed" if current.key != key else "member lost")
        self._starting.add(job)
        try:
            group = await self._spawn(key, spec)
        finally:
            self._starting.discard(job)
        self.groups[job] = group
        self._background.spawn(self._watch(group, spec))
        log.info("spare.started", job=job, group=True, pids=[p.pid for p in group.procs])
        if job not in self._live:  # the job settled while its group was starting
            self.retire(job, "job settled")

    async def _spawn(self, key: str, spec: LaunchSpec) -> Group:
        """Start the N members, each in a folder of its own, on a coordinator of the group's."""
        assert spec.worker is not None
        argv = spec.worker.spare_argv()
        coordinator = f"127.0.0.1:{free_port()}"
        stamp = time.time_ns()
        procs: list[asyncio.subprocess.Process] = []
        folders: list[Path] = []
        for index in range(spec.processes):
            folder = spare_folder(spec, f"{stamp}-g{index}")
            env = {
                **spec.env,
                PROCESS_ID_ENV: str(index),
                PROCESSES_ENV: str(spec.processes),
                COORDINATOR_ENV: coordinator,
            }
            procs.append(await start_spare(argv, folder, env))
            folders.append(folder)
        future = asyncio.get_running_loop().create_future()
        return Group(key, coordinator, procs, folders, future)

    async def _watch(self, group: Group, spec: LaunchSpec) -> None:
        """Wait for every member's ready line; then, while the group waits, for any member's
        death (the group is discarded whole and replaced)."""
        job = spec.job_id
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                answers = await asyncio.gather(*(_ready_line(p) for p in group.procs))
        except TimeoutError:
            answers = [None] * len(group.procs)
        if not all(answers):
            log.warning("spare.unprepared", job=job, folders=[str(f) for f in group.folders])
            group.ready.set_result(False)
            self._failed(job, group, spec)
            return
        group.prepared_s = [float(a) for a in answers if a is not None]
        group.ready.set_result(True)
        pids = [p.pid for p in group.procs]
        log.info("spare.ready", job=job, group=True, pids=pids, prepared_s=group.prepared_s)
        waits = [asyncio.ensure_future(p.wait()) for p in group.procs]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self.groups.get(job) is group:  # a member died while waiting, not handed nor retired
            ended = {p.pid: p.returncode for p in group.procs if p.returncode is not None}
            log.warning("spare.died", job=job, group=True, ended=ended)
            self._failed(job, group, spec)

    def _failed(self, job: str, group: Group, spec: LaunchSpec) -> None:
        self.failures[job] = self.failures.get(job, 0) + 1
        if self.groups.get(job) is group:
            self.retire(job, "failed")
        else:
            self._background.spawn(self._kill(group))
        self._background.spawn(self._ensure(group.key, spec, REPLACE_AFTER_S))

    def retire(self, job_id: str, why: str) -> None:
        """Kill the job's group, if it has one, with every member's process tree."""
        group = self.groups.pop(job_id, None)
        if group is not None:
            log.info("spare.retired", job=job_id, pids=[p.pid for p in group.procs], why=why)
            self._background.spawn(self._kill(group))

    def settled(self, job_id: str) -> None:
        """The job rests: its group goes, and its failures are forgotten."""
        self._live.discard(job_id)
        self.retire(job_id, "job settled")
        self.failures.pop(job_id, None)

    async def _kill(self, group: Group) -> None:
        """SIGKILL every member's group and every process naming its folder, and wait."""
        pairs = zip(group.procs, group.folders, strict=True)
        await asyncio.gather(*(self._kill_one(proc, folder) for proc, folder in pairs))

    async def _kill_one(self, proc: asyncio.subprocess.Process, folder: Path) -> None:
        self._dying.add(proc)
        reaper.LEADERS.add(proc.pid)  # the child watcher reaps it, not the sweep
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            await off_loop(reaper.sweep, proc.pid, {str(folder)})
            await proc.wait()
        finally:
            reaper.LEADERS.discard(proc.pid)
            self._dying.discard(proc)

    async def close(self) -> None:
        """Kill every group and wait for each member to end."""
        await self._background.cancel_and_wait()
        groups, self.groups = list(self.groups.values()), {}
        await asyncio.gather(*(self._kill(group) for group in groups))
        for proc in list(self._dying):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def _ready_line(proc: asyncio.subprocess.Process) -> float | None:
    """The member's ``prepared_s`` from its ready line (gloo writes lines of its own on the
    same stdout first); None when it ended or said another thing."""
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        if isinstance(answer, dict) and "spare" in answer:
            return float(answer.get("prepared_s") or 0.0) if answer["spare"] == "ready" else None
    return None


async def _handoff(proc: asyncio.subprocess.Process, line: bytes) -> bool:
    """Hand one member its attempt; whether it answered ``taken`` within `HANDOFF_S`."""
    if proc.stdin is None or proc.stdout is None:
        return False
    try:
        proc.stdin.write(line)
        await proc.stdin.drain()
        proc.stdin.close()
        async with asyncio.timeout(HANDOFF_S):
            while answer := await proc.stdout.readline():
                with contextlib.suppress(ValueError):
                    if json.loads(answer) == {"spare": "taken"}:
                        return True
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        return False
    return False
