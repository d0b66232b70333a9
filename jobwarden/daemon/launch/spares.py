"""Warm spares: one pre-started worker per task and runtime, handed the next attempt.

A built-in task job's attempt (its `LaunchSpec.worker` call, built once from
the job the daemon holds; one process, no workdir of its own) is matched to a
*key*: the task, its training fields, the worker's interpreter, compile cache
and environment.  The first attempt of a key starts cold and, beside it, a spare
(``python -m jobwarden.worker.spare``, `jobwarden.worker.spare`): JAX imported,
the task's data built, its update compiled, no lock held, nothing written to
any checkpoint directory.  The next attempt of that key (a recovery, or another
job of the same configuration) is handed to the spare over its stdin and
followed like any worker (`LocalAttempt` on the same process: its stdout is the
attempt's events, its stderr the attempt's ``stderr.log`` from the handoff on);
another spare starts in the background once the handed one is under way.
A spare's environment names its own folder (``jobs/<job>/spares/<n>``) for good,
so before the handoff the daemon writes the attempt's folder into the spare's
`HANDED_FILE`: after the daemon's own restart `handed_to` leads from the
spare to the attempt, and the worker is found as a cold one is.

A spare runs as the worker would: the same user, environment, session of its
own, cgroup and rlimits (the daemon's).  Command jobs and SDK programs get no
spare: what their program imports and compiles is theirs.  A spare whose key
has had no live attempt for `IDLE_S` is retired, and every spare ends by
itself when its stdin closes (the daemon exits, however it exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from jobwarden.daemon.background import Background
from jobwarden.daemon.children import CHILDREN
from jobwarden.daemon.launch.base import ATTEMPT_ENV, LINE_LIMIT, LaunchSpec, RunningAttempt
from jobwarden.daemon.store.evidence import keep, open_evidence
from jobwarden.jobfolder import STDERR_FILE
from jobwarden.runtime import SUPERVISOR_ENV
from jobwarden.worker.command import WorkerCall

log = structlog.get_logger("wardend.spare")

IDLE_S = 60.0
"""A spare whose key had no live attempt for this long is retired."""
REPLACE_AFTER_S = 0.5
"""After a handoff, the next spare starts this much later: its import must not slow the
handed worker's restore on a small machine."""
READY_TIMEOUT_S = 300.0
HANDED_FILE = "handed"
"""In a spare's folder: the attempt folder it was handed, written before the handoff."""


def spare_folder(spec: LaunchSpec, name: str) -> Path:
    """A new spare's own folder, ``jobs/<job>/spares/<name>``, made."""
    folder = spec.folder.parent.parent / "spares" / name
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


async def start_spare(
    argv: list[str], folder: Path, env: dict[str, str], cwd: Path | None = None
) -> asyncio.subprocess.Process:
    """Start a spare (of a task, a program or a group's member) in a session of its own,
    as a worker is: its stdin and stdout pipes to the daemon, its stderr in ``folder``,
    the daemon's pid and ``folder`` in its environment, followed as the daemon's child."""
    env = {**env, SUPERVISOR_ENV: str(os.getpid()), ATTEMPT_ENV: str(folder)}
    with open_evidence(folder / STDERR_FILE) as stderr, CHILDREN.starting():
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=cwd,
            start_new_session=True,
            limit=LINE_LIMIT,
        )
        CHILDREN.follow(proc)
    return proc


Spawn = Callable[[LaunchSpec, str], Awaitable[RunningAttempt]]
Adopt = Callable[[LaunchSpec, asyncio.subprocess.Process], RunningAttempt]


CLOSE_WAIT_S = 5.0
"""How long the daemon's shutdown waits for its retired spares to end before SIGKILL."""


def spare_key(spec: LaunchSpec) -> str | None:
    """What a spare must share with ``spec``'s attempt to run it: the task, its training
    fields, the interpreter, compile cache and environment; None for anything a spare
    cannot run (a command job, several processes, a workdir of its own)."""
    call, job = spec.worker, spec.job
    if call is None or job is None or job.task is None or spec.processes != 1 or spec.cwd:
        return None
    cache = str(call.cache) if call.cache is not None else None
    return json.dumps([job.task, job.train_fields(), call.python, cache, sorted(spec.env.items())])


@dataclass
class Spare:
    """One spare process and whether it has reported ready."""

    proc: asyncio.subprocess.Process
    folder: Path
    ready: asyncio.Task[bool] | None = None

    def usable(self) -> bool:
        """Prepared and still alive."""
        done = self.ready is not None and self.ready.done() and not self.ready.cancelled()
        return done and self.ready is not None and self.ready.result() and self.alive()

    def alive(self) -> bool:
        """Not yet exited."""
        return self.proc.returncode is None

    def retire(self) -> None:
        """Close its stdin: it ends at once, preparing or waiting."""
        if self.ready is not None:
            self.ready.cancel()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


@dataclass
class SparePool:
    """The daemon's spares, one per key, and the live attempts of each key."""

    spares: dict[str, Spare] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    handed: int = 0
    _timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _background: Background = field(default_factory=lambda: Background("spare"))
    _retiring: set[asyncio.subprocess.Process] = field(default_factory=set)
    """Retired spares not yet seen to end (the daemon's shutdown waits for them too)."""

    async def start(self, spec: LaunchSpec, spawn: Spawn, adopt: Adopt) -> RunningAttempt:
        """Start ``spec``'s attempt: on this key's spare when one is ready, else cold (``spawn``);
        either way a spare of the key is (re)started in the background."""
        key, call = spare_key(spec), spec.worker
        if key is None or call is None:
            return await spawn(spec, STDERR_FILE)
        attempt = await self._hand(key, call, spec, adopt)
        if attempt is None:
            attempt = await spawn(spec, STDERR_FILE)
            self._background.spawn(self._ensure(key, call, spec, 0.0))
        else:
            self._background.spawn(self._ensure(key, call, spec, REPLACE_AFTER_S))
        self._follow(key, attempt)
        return attempt

    async def _hand(
        self, key: str, call: WorkerCall, spec: LaunchSpec, adopt: Adopt
    ) -> RunningAttempt | None:
        spare = self.spares.get(key)
        if spare is None or not spare.usable() or spare.proc.stdin is None:
            return None
        del self.spares[key]
        spec.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        stderr = spec.folder / STDERR_FILE
        open_evidence(stderr).close()  # created here as the daemon creates it: never a link
        if (error := keep(spare.folder / HANDED_FILE, str(spec.folder))) is not None:
            log.warning("spare.unrecorded", pid=spare.proc.pid, error=error)
            spare.retire()  # a worker a restarted daemon could not find: start cold instead
            return None
        try:
            spare.proc.stdin.write(json.dumps(call.handoff(stderr)).encode() + b"\n")
            await spare.proc.stdin.drain()
            spare.proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError) as error:
            log.warning("spare.lost", pid=spare.proc.pid, error=repr(error))
            spare.retire()
            return None
        self.handed += 1
        log.info("spare.handed", job=spec.job_id, attempt=spec.attempt, pid=spare.proc.pid)
        return adopt(spec, spare.proc)

    async def _ensure(self, key: str, call: WorkerCall, spec: LaunchSpec, delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        current = self.spares.get(key)
        if key in self.failed or (current is not None and current.alive()):
            return
        if not self.live.get(key):
            return
        folder = spare_folder(spec, str(time.time_ns()))
        proc = await start_spare(call.spare_argv(), folder, spec.env)
        spare = self.spares[key] = Spare(proc, folder)
        spare.ready = asyncio.ensure_future(self._wait_ready(key, spare))
        log.info("spare.started", pid=proc.pid, task=json.loads(key)[0], folder=str(folder))

    async def _wait_ready(self, key: str, spare: Spare) -> bool:
        assert spare.proc.stdout is not None
        try:
            line = await asyncio.wait_for(spare.proc.stdout.readline(), READY_TIMEOUT_S)
            ready = json.loads(line) if line else {}
        except (TimeoutError, ValueError):
            ready = {}
        if ready.get("spare") == "ready":
            log.info("spare.ready", pid=spare.proc.pid, prepared_s=ready.get("prepared_s"))
            return True
        log.warning("spare.unprepared", pid=spare.proc.pid, stderr=str(spare.folder))
        self.failed.add(key)  # no second try for a key whose preparation fails
        spare.retire()
        return False

    def _follow(self, key: str, attempt: RunningAttempt) -> None:
        self.live[key] = self.live.get(key, 0) + 1
        if (timer := self._timers.pop(key, None)) is not None:
            timer.cancel()

        async def ended() -> None:
            await attempt.ended.wait()
            self.live[key] -= 1
            if not self.live[key]:
                loop = asyncio.get_running_loop()
                self._timers[key] = loop.call_later(IDLE_S, self._retire, key)

        self._background.spawn(ended())

    def _retire(self, key: str) -> None:
        self._timers.pop(key, None)
        if self.live.get(key):
            return
        spare = self.spares.pop(key, None)
        if spare is not None:
            log.info("spare.retired", pid=spare.proc.pid)
            spare.retire()
            self._retiring.add(spare.proc)
            self._background.spawn(self._ended(spare.proc))

    def pids(self) -> list[int]:
        """The pids of the spares not handed out (for tests and status)."""
        return [s.proc.pid for s in self.spares.values() if s.alive()]

    async def _ended(self, proc: asyncio.subprocess.Process) -> None:
        await proc.wait()
        self._retiring.discard(proc)

    async def close(self) -> None:
        """Retire every spare and wait for it, and for those retired before, to end (they do
        at once), SIGKILLing any still there after `CLOSE_WAIT_S`: none outlives the loop."""
        for timer in self._timers.values():
            timer.cancel()
        await self._background.cancel_and_wait()  # no spare starts from now on
        for spare in self.spares.values():
            spare.retire()
        procs = [spare.proc for spare in self.spares.values()] + list(self._retiring)
        self.spares.clear()
        self._retiring.clear()
        if procs:
            waits = [asyncio.ensure_future(proc.wait()) for proc in procs]
            _, late = await asyncio.wait(waits, timeout=CLOSE_WAIT_S)
            for proc in procs:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
            if late:
                await asyncio.wait(late, timeout=CLOSE_WAIT_S)


def handed_to(folder: str) -> str:
    """The attempt folder the spare of ``folder`` (its `ATTEMPT_ENV`) was handed; "" when
    ``folder`` is no spare's or the spare was never handed one."""
    path = Path(folder)
    if not folder or path.parent.name != "spares":
        return ""
    try:
        return (path / HANDED_FILE).read_text()
    except (OSError, ValueError):
        return ""
