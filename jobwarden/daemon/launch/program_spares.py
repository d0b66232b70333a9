"""Spares of users' SDK programs: one per command job, started ahead of the attempt that needs it.

A command job with ``sdk = true`` gets a spare once its first attempt is under
way (`FIRST_AFTER_S`), one per member of a multi-process job (each slot,
`slot_of`, is a job and a member index): its own command, workdir and
environment, with ``$JOBWARDEN_SPARE`` set, in a folder of its own
(``jobs/<job>/spares/<n>``: its ``stderr.log`` and a copy of the attempt's run
file). What an attempt sets anew (`PER_ATTEMPT_ENV`: the run file, a member's
coordinator) is told to the spare in the handoff. The program runs up to its
restore point and says it is ready (`jobwarden.sdk.spare`); it holds no lock
and nothing under the checkpoint directory. The job's next attempt is handed
to it over its stdin; the spare answers within `HANDOFF_S` that it took the
attempt, or refuses (its sources or data files changed since it started: a
cold start would run other code), and the daemon starts the attempt cold
whenever it does not say ``taken`` in time. Its ``HANDED_FILE`` names the
attempt before the handoff, so a restarted daemon finds the worker as it finds
a cold one.

A spare that dies while waiting is replaced, up to `MAX_FAILURES` times per
slot; one that is still preparing when it is needed is not waited for.  A
spare is killed with its process group and every process naming its folder
when its job settles, when the job's command, workdir or environment change,
when its memory would take all spares over ``--spare-memory-mb``, and when the
daemon stops.  Plain programs (``sdk = false``) get none: nothing marks their
restore point.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import structlog

from jobwarden.daemon.background import Background, off_loop
from jobwarden.daemon.launch import reaper
from jobwarden.daemon.launch.base import LaunchSpec, RunningAttempt
from jobwarden.daemon.launch.spares import HANDED_FILE, spare_folder, start_spare
from jobwarden.daemon.store.evidence import keep, open_evidence
from jobwarden.jobfolder import STDERR_FILE
from jobwarden.sdk.distributed import COORDINATOR_ENV, PROCESS_ID_ENV
from jobwarden.sdk.settings import RUN_FILE_ENV
from jobwarden.sdk.spare import READY, SPARE_ENV, TAKEN, Handoff

log = structlog.get_logger("wardend.spare")

FIRST_AFTER_S = 1.0
"""A job's first spare starts this long after its attempt: not beside its imports."""
REPLACE_AFTER_S = 0.5
"""After a handoff or a spare's death, the next spare starts this much later."""
MEMBER_REPLACE_AFTER_S = 10.0
"""The same for a member's spare: a handed member still builds its model and compiles after
the handoff (it waited before joining the others), which the next spare's start-up would
slow on a small machine."""
HANDOFF_S = 1.0
"""A spare that has not said ``taken`` this long after the handoff is killed; the attempt
starts cold."""
READY_TIMEOUT_S = 600.0
MAX_FAILURES = 3
"""A job whose spares failed this many times (died, refused to prepare) gets no more."""
RUN_FILE = "run.json"

Spawn = Callable[[LaunchSpec, str], Awaitable[RunningAttempt]]
Adopt = Callable[[LaunchSpec, asyncio.subprocess.Process], RunningAttempt]


PER_ATTEMPT_ENV = (RUN_FILE_ENV, COORDINATOR_ENV)
"""What an attempt's environment sets anew each time (a spare is told them at the handoff)."""


def program_key(spec: LaunchSpec) -> str | None:
    """What a spare must share with ``spec``'s attempt (or member): the job, its argv, workdir
    and environment (but what is set per attempt); None when it can have no spare."""
    job = spec.job
    if job is None or job.program is None or not job.program.sdk:
        return None
    env = sorted((k, v) for k, v in spec.env.items() if k not in PER_ATTEMPT_ENV)
    return json.dumps([job.id, spec.argv, job.program.workdir, env])


def slot_of(spec: LaunchSpec) -> str:
    """The spare's place: the job, and the member's index (0 for a job of one process)."""
    return f"{spec.job_id}/{spec.env.get(PROCESS_ID_ENV, '0')}"


def _workdir(spec: LaunchSpec) -> str | None:
    program = spec.job.program if spec.job is not None else None
    return program.workdir if program is not None else None


@dataclass
class ProgramSpare:
    """One spare of a job's program: its process, folder, key and readiness."""

    key: str
    proc: asyncio.subprocess.Process
    folder: Path
    ready: asyncio.Future[bool]
    prepared_s: float | None = None

    def usable(self) -> bool:
        """Ready and still alive."""
        done = self.ready.done() and not self.ready.cancelled() and self.ready.result()
        return done and self.proc.returncode is None

    def view(self) -> dict[str, Any]:
        """What ``status`` says of it: pid, state, the memory it holds (its whole tree)."""
        rss = 0
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(self.proc.pid)
            rss = sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
        state = "ready" if self.usable() else "preparing"
        return {"pid": self.proc.pid, "state": state, "rss_mb": round(rss / 2**20, 1)}


@dataclass
class ProgramSpares:
    """The spares of SDK programs, one per job (one per member of a multi-process job), by
    slot (`slot_of`)."""

    memory_mb: float | None = None
    """The memory all spares together may hold (``--spare-memory-mb``); None: no cap."""
    spares: dict[str, ProgramSpare] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    handed: int = 0
    _background: Background = field(default_factory=lambda: Background("program-spare"))
    _dying: set[asyncio.subprocess.Process] = field(default_factory=set)
    _live: set[str] = field(default_factory=set)
    """The jobs with an attempt started and not yet settled: only these get a spare."""
    _starting: set[str] = field(default_factory=set)
    """The slots whose spare is being started: never two at once."""

    async def start(
        self, spec: LaunchSpec, spawn: Spawn, adopt: Adopt, stderr_name: str = STDERR_FILE
    ) -> RunningAttempt:
        """``spec``'s attempt (or member) on its ready spare, else cold (``spawn``); then a
        spare for the next."""
        key = program_key(spec)
        assert key is not None
        self._live.add(spec.job_id)
        attempt = await self._hand(key, spec, adopt, stderr_name)
        delay = MEMBER_REPLACE_AFTER_S if PROCESS_ID_ENV in spec.env else REPLACE_AFTER_S
        if attempt is None:
            attempt, delay = await spawn(spec, stderr_name), FIRST_AFTER_S
        self._background.spawn(self._ensure(key, spec, delay))
        return attempt

    def view(self, job_id: str) -> dict[str, Any] | None:
        """The job's spare as ``status`` shows it (for several members: their memory summed,
        ``ready`` once all are, and each one); None when it has none."""
        views = [s.view() for slot, s in self.spares.items() if slot.startswith(f"{job_id}/")]
        if len(views) <= 1:
            return views[0] if views else None
        ready = all(v["state"] == "ready" for v in views)
        total = round(sum(v["rss_mb"] for v in views), 1)
        return {"state": "ready" if ready else "preparing", "rss_mb": total, "members": views}

    def pids(self) -> list[int]:
        """The pids of the spares not handed out."""
        return [s.proc.pid for s in self.spares.values() if s.proc.returncode is None]

    async def _hand(
        self, key: str, spec: LaunchSpec, adopt: Adopt, stderr_name: str
    ) -> RunningAttempt | None:
        slot = slot_of(spec)
        spare = self.spares.get(slot)
        if spare is None:
            return None
        if spare.key != key:
            self.retire(slot, "job changed")
            return None
        if not spare.usable() or spare.proc.stdin is None or spare.proc.stdout is None:
            return None  # still preparing (or just died): the attempt does not wait for it
        del self.spares[slot]
        spec.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        stderr = spec.folder / stderr_name
        open_evidence(stderr).close()  # created here as the daemon creates it: never a link
        if (error := keep(spare.folder / HANDED_FILE, str(spec.folder))) is not None:
            log.warning("spare.unrecorded", pid=spare.proc.pid, error=error)
            await self._kill(spare)
            return None
        # A job without a workdir runs in its attempt's folder: the spare moves there.
        cwd = None if _workdir(spec) is not None else spec.folder
        anew = {name: spec.env[name] for name in PER_ATTEMPT_ENV if name in spec.env}
        handoff = Handoff(Path(spec.env[RUN_FILE_ENV]), stderr, cwd, anew)
        began = time.monotonic()
        try:
            spare.proc.stdin.write(handoff.line().encode())
            await spare.proc.stdin.drain()
            spare.proc.stdin.close()
            line = await asyncio.wait_for(spare.proc.stdout.readline(), HANDOFF_S)
            answer = json.loads(line) if line else {}
        except (BrokenPipeError, ConnectionResetError, TimeoutError, ValueError) as error:
            answer = {"spare": "lost", "error": repr(error)}
        if not isinstance(answer, dict) or answer.get("spare") != TAKEN:
            log.warning("spare.refused", job=spec.job_id, pid=spare.proc.pid, answer=answer)
            if isinstance(answer, dict) and answer.get("contract"):
                self.failures[slot] = MAX_FAILURES  # its every spare would break it again
            await self._kill(spare)  # gone before the cold attempt: never two writers
            return None
        self.handed += 1
        took = round(time.monotonic() - began, 4)
        log.info("spare.handed", job=spec.job_id, attempt=spec.attempt, pid=spare.proc.pid, s=took)
        return adopt(spec, spare.proc)

    async def _ensure(self, key: str, spec: LaunchSpec, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        slot = slot_of(spec)
        if spec.job_id not in self._live or slot in self._starting:
            return  # settled meanwhile, or another start is under way
        current = self.spares.get(slot)
        if self.failures.get(slot, 0) >= MAX_FAILURES:
            return
        if current is not None and current.proc.returncode is None and current.key == key:
            return
        if current is not None:
            self.retire(slot, "job changed")
        self._starting.add(slot)
        try:
            spare = await self._spawn(key, spec)
        finally:
            self._starting.discard(slot)
        self.spares[slot] = spare
        self._background.spawn(self._watch(slot, spare, spec))
        log.info("spare.started", job=spec.job_id, slot=slot, pid=spare.proc.pid)
        if spec.job_id not in self._live:  # the job settled while its spare was starting
            self.retire(slot, "job settled")

    async def _spawn(self, key: str, spec: LaunchSpec) -> ProgramSpare:
        """Start the program as a spare of ``spec``'s job, in a folder of its own."""
        member = spec.env.get(PROCESS_ID_ENV)
        name = str(time.time_ns()) + (f"-{member}" if member is not None else "")
        folder = spare_folder(spec, name)
        run_file = folder / RUN_FILE
        shutil.copyfile(spec.env[RUN_FILE_ENV], run_file)
        env = {**spec.env, RUN_FILE_ENV: str(run_file), SPARE_ENV: "1"}
        cwd = spec.cwd if _workdir(spec) is not None else folder
        proc = await start_spare(spec.argv, folder, env, cwd)
        return ProgramSpare(key, proc, folder, asyncio.get_running_loop().create_future())

    async def _watch(self, slot: str, spare: ProgramSpare, spec: LaunchSpec) -> None:
        """Wait for its ready line; then, while it waits, for its death (it is replaced)."""
        assert spare.proc.stdout is not None
        job, pid = spec.job_id, spare.proc.pid
        answer: dict[str, Any] = {}
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                while line := await spare.proc.stdout.readline():
                    with contextlib.suppress(ValueError):
                        answer = json.loads(line)
                    if isinstance(answer, dict) and "spare" in answer:
                        break
        except TimeoutError:
            answer = {}
        if not isinstance(answer, dict) or answer.get("spare") != READY:
            log.warning("spare.unprepared", job=job, slot=slot, pid=pid, stderr=str(spare.folder))
            spare.ready.set_result(False)
            self._failed(slot, spare, spec)
            return
        spare.prepared_s = answer.get("prepared_s")
        spare.ready.set_result(True)
        log.info("spare.ready", job=job, slot=slot, pid=pid, prepared_s=spare.prepared_s)
        if self._over_memory(job, slot):
            return
        await spare.proc.wait()
        if self.spares.get(slot) is spare:  # died while waiting, not handed nor retired
            status = spare.proc.returncode
            log.warning("spare.died", job=job, slot=slot, pid=pid, status=status)
            self._failed(slot, spare, spec)

    def _failed(self, slot: str, spare: ProgramSpare, spec: LaunchSpec) -> None:
        self.failures[slot] = self.failures.get(slot, 0) + 1
        self.retire(slot, "failed")
        self._background.spawn(self._ensure(spare.key, spec, REPLACE_AFTER_S))

    def _over_memory(self, job: str, slot: str) -> bool:
        if self.memory_mb is None:
            return False
        total = sum(s.view()["rss_mb"] for s in self.spares.values() if s.usable())
        if total <= self.memory_mb:
            return False
        log.warning("spare.over_memory", job=job, slot=slot, rss_mb=total, limit_mb=self.memory_mb)
        self.failures[slot] = MAX_FAILURES  # the same program will not fit next time either
        self.retire(slot, "over memory")
        return True

    def retire(self, slot: str, why: str) -> None:
        """Kill the spare of ``slot``, if there is one, with its whole process tree."""
        spare = self.spares.pop(slot, None)
        if spare is not None:
            log.info("spare.retired", slot=slot, pid=spare.proc.pid, why=why)
            self._background.spawn(self._kill(spare))

    def settled(self, job_id: str) -> None:
        """The job rests: its spares go, and their failures are forgotten."""
        self._live.discard(job_id)
        for slot in [slot for slot in self.spares if slot.startswith(f"{job_id}/")]:
            self.retire(slot, "job settled")
        for slot in [slot for slot in self.failures if slot.startswith(f"{job_id}/")]:
            del self.failures[slot]

    async def _kill(self, spare: ProgramSpare) -> None:
        """SIGKILL its group and every process naming its folder, and wait for it."""
        self._dying.add(spare.proc)
        reaper.LEADERS.add(spare.proc.pid)  # the child watcher reaps it, not the sweep
        try:
            if spare.proc.stdin is not None:
                spare.proc.stdin.close()
            await off_loop(reaper.sweep, spare.proc.pid, {str(spare.folder)})
            await spare.proc.wait()
        finally:
            reaper.LEADERS.discard(spare.proc.pid)
            self._dying.discard(spare.proc)

    async def close(self) -> None:
        """Kill every spare and wait for each to end."""
        await self._background.cancel_and_wait()
        spares, self.spares = list(self.spares.values()), {}
        await asyncio.gather(*(self._kill(spare) for spare in spares))
        for proc in list(self._dying):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
