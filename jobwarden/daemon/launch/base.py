"""The launcher seam: how an attempt is started, followed, signalled and reaped.

A `Launcher` turns a `LaunchSpec` (argv, environment, working directory,
process count, evidence folder) into a `RunningAttempt`.  Everything a job's
supervisor knows about a running attempt comes through that object: the
events it streams, its pid and samples, the signals it accepts, and its
`ExitInfo`.  So another launcher (Slurm, say) drops in without touching the
policy or the supervisor.  ``wardend --launcher NAME`` picks one: a name
registered in the ``jobwarden.launchers`` entry point group, or
``module:attribute``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from jobwarden.daemon.config import LaunchSettings
from jobwarden.daemon.store.evidence import EvidenceFile
from jobwarden.daemon.store.stamps import Stamper
from jobwarden.errors import JobwardenError
from jobwarden.events import Event, Malformed, parse_line
from jobwarden.jobfile import Job
from jobwarden.jobfolder import EVENTS_FILE
from jobwarden.runtime import unpinned
from jobwarden.worker.command import WorkerCall

log = structlog.get_logger("wardend.launcher")
LINE_LIMIT = 1 << 20
DRAIN_S = 5.0
EXIT_POLL_S = 0.05
"""How long the pipe may stay open after the leader's exit and its descendants' kill."""
ATTEMPT_ENV = "JOBWARDEN_ATTEMPT_FOLDER"
"""Set in each local worker's environment to its attempt folder: how a restarted daemon
finds a worker whose pid it never saved (`Launcher.find_orphans`)."""

OnEvent = Callable[[Event], None]
OnMalformed = Callable[[Malformed], None]


class LauncherError(JobwardenError):
    """Raised when a launcher cannot be found or cannot start an attempt."""

    code = "daemon.launcher"
    exit_status = 78


def inherited(env: Mapping[str, str], job: Job) -> dict[str, str]:
    """What an attempt of ``job`` inherits of the daemon's worker environment: all of it,
    less the single-thread pins for a job that gave up exactness (the daemon's own
    environment may carry them: `runtime.unpinned`); the job's own ``env`` comes after."""
    return dict(env) if job.run.exact else unpinned(env)


@dataclass(frozen=True)
class LaunchSpec:
    """One attempt to start: what to run, where, and where its evidence goes."""

    job_id: str
    attempt: int
    folder: Path
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    processes: int = 1
    stdout: str = EVENTS_FILE
    """The file in ``folder`` that keeps every byte of stdout (`EVENTS_FILE`, `OUTPUT_FILE`)."""
    job: Job | None = None
    """The validated job this attempt runs, as the daemon holds it (never parsed again)."""
    worker: WorkerCall | None = None
    """The built-in worker's call when ``argv`` is it (`WorkerCall.argv`); None for a program."""


@dataclass(frozen=True)
class ExitInfo:
    """How an attempt ended: its exit status (negative: killed by that signal)."""

    status: int
    signal: str | None
    duration_s: float
    preempted: bool = False
    """The cluster preempted it (Slurm): never a failure of the program, whatever its status."""

    @classmethod
    def from_status(cls, status: int, duration_s: float) -> ExitInfo:
        """From a returncode as asyncio and subprocess report it."""
        name = signal.Signals(-status).name if status < 0 else None
        return cls(status, name, duration_s)

    def as_record(self) -> dict[str, Any]:
        """The fields of exit.json that the launcher knows."""
        return {"exit_status": self.status, "signal": self.signal, "duration_s": self.duration_s}


class RunningAttempt(abc.ABC):
    """An attempt a launcher started; the supervisor's only handle on it."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.ended = asyncio.Event()
        self.exit_info: ExitInfo | None = None
        self.events = EvidenceFile(spec.folder / spec.stdout)

    @property
    @abc.abstractmethod
    def pid(self) -> int | None:
        """The main process's pid, where the launcher knows one."""

    @abc.abstractmethod
    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Dispatch every event line until the attempt ends, then return how it ended.

        Implementations keep every byte of the event stream in `events`
        (``folder/<spec.stdout>``), set `exit_info` and `ended` before returning,
        and never raise for anything the attempt wrote or the disk refused.  A
        plain program's lines are dispatched too (mostly as malformed): what
        they mean is the supervisor's business.
        """

    @abc.abstractmethod
    def signal(self, signum: int) -> None:
        """Send ``signum`` to the attempt's main process, if it still runs."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill everything the attempt started, at once."""

    def when_started(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the attempt runs: at once here, later for a batch job
        that waits in a queue first (its startup watch starts then)."""
        callback()

    def create_time(self) -> float | None:
        """The kernel's start time of the main process, to recognise it after a restart."""
        return None

    @property
    def node(self) -> str | None:
        """The host the attempt runs on: this one, unless a launcher places it elsewhere."""
        return socket.gethostname()

    def sample(self) -> dict[str, Any]:
        """Resource figures (rss_mb, cpu_percent, status, threads, cpu_s), where known."""
        return {}

    def members_view(self) -> dict[str, Any]:
        """For an attempt of several processes: each member, those not yet ready
        (``missing``) and the one the others wait for (``stalled_member``); else empty."""
        return {}

    def member_pids(self) -> dict[str, Any]:
        """For an attempt of several processes, ``members``: each one's index and pid (for
        the ``attempt.started`` log record); else empty."""
        return {}

    def _ended(self, info: ExitInfo) -> ExitInfo:
        self.exit_info = info
        self.ended.set()
        return info

    async def stop(self, grace_s: float) -> None:
        """SIGTERM, up to ``grace_s`` to leave (the worker commits), then kill; returns once
        the attempt has ended."""
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.ended.wait(), grace_s)
        except TimeoutError:
            self.kill()
            await self.ended.wait()


class ProcessGroupAttempt(RunningAttempt):
    """An attempt that is one child process leading its own process group (asyncio)."""

    def __init__(self, spec: LaunchSpec, proc: asyncio.subprocess.Process) -> None:
        super().__init__(spec)
        self.proc = proc
        self.started_mono = time.monotonic()

    @property
    def pid(self) -> int:
        """The child's pid, which is also its process group id."""
        return self.proc.pid

    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Pump stdout while the leader runs; its own exit ends the attempt (a descendant that
        holds the pipe cannot hide it): `after_exit`, then the pipe drained to EOF, bounded."""
        pumping = asyncio.ensure_future(self._pump(on_event, on_malformed))
        await self._leader_exit()
        duration = time.monotonic() - self.started_mono
        await self.after_exit()
        done, _ = await asyncio.wait({pumping}, timeout=DRAIN_S)
        if not done:
            log.warning("attempt.pipe_held", job=self.spec.job_id, pid=self.pid, waited_s=DRAIN_S)
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            self.events.close()
            transport = getattr(self.proc, "_transport", None)
            if transport is not None:
                transport.close()
        status = await self.proc.wait()
        return self._ended(ExitInfo.from_status(status, duration))

    async def _leader_exit(self) -> None:
        """Return once the leader has exited: its pidfd readable, or (no pidfd) its status
        seen by the child watcher, polled."""
        try:
            fd: int | None = os.pidfd_open(self.pid)
        except OSError:  # gone already, or a kernel without pidfds
            fd = None
        if fd is None or self.proc.returncode is not None:
            if fd is not None:
                os.close(fd)
            while self.proc.returncode is None:
                await asyncio.sleep(EXIT_POLL_S)
            return
        loop = asyncio.get_running_loop()
        exited = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def _pump(self, on_event: OnEvent, on_malformed: OnMalformed) -> None:
        try:
            if self.proc.stdout is not None:
                await pump(self.proc.stdout, self.events, on_event, on_malformed)
        except Exception as error:  # noqa: BLE001 - an attempt we cannot follow is ended, not lost
            log.error("attempt.unfollowable", job=self.spec.job_id, error=repr(error))
            self.kill()

    async def after_exit(self) -> None:
        """The leader has exited: SIGKILL what is left of its process group."""
        self.kill()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child alone, if it still runs."""
        if self.proc.returncode is None:
            with suppress_gone():
                os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the child's whole process group."""
        with suppress_gone():
            os.killpg(self.pid, signal.SIGKILL)


class Launcher(abc.ABC):
    """Starts attempts."""

    name: str

    def __init__(self, settings: LaunchSettings | None = None) -> None:
        self.settings = settings or LaunchSettings()
        """What the daemon configured launchers with (`jobwarden.daemon.config`)."""

    @abc.abstractmethod
    async def start(self, spec: LaunchSpec) -> RunningAttempt:
        """Start ``spec``'s attempt; raises `LauncherError` when it cannot."""

    async def wait_orphan(self, pid: int, started: float | None) -> None:  # noqa: B027
        """After the daemon's own restart: return once an attempt it started before
        (``pid``, started at ``started``) has gone, ending it if it outlives the wait."""

    async def adopt(self, spec: LaunchSpec) -> RunningAttempt | None:
        """After the daemon's own restart: follow again the attempt ``spec`` names (argv and
        env left empty) when the launcher can find it (a Slurm job by its recorded id);
        None when it cannot, and the daemon recovers by a new attempt."""
        return None

    def settled(self, job_id: str) -> None:  # noqa: B027 - most launchers keep no spares
        """The job rests (or is gone): whatever the launcher keeps for it (a spare) goes."""

    def spare_of(self, job_id: str) -> dict[str, Any] | None:
        """The job's spare (pid, state, rss_mb) for ``status``; None when it has none."""
        return None

    async def close(self) -> None:  # noqa: B027 - most launchers hold nothing between attempts
        """The daemon stops: let go of what the launcher keeps between attempts (spares)."""

    def find_orphans(self, job_folder: Path) -> list[tuple[int, float | None]]:
        """After the daemon's own restart: (pid, start time) of each process still running
        an attempt of the job whose folder is ``job_folder``, found without a saved pid.

        Blocking (it may scan the process table): the daemon calls it in a thread.
        """
        return []


async def pump(
    stream: asyncio.StreamReader, events: EvidenceFile, on_event: OnEvent, on_malformed: OnMalformed
) -> None:
    """Record every byte of ``stream`` verbatim in ``events`` and dispatch each line, until EOF.

    Lines longer than `LINE_LIMIT` are kept in the file but reported as
    malformed once and not parsed; nothing the worker writes can crash this,
    and a disk that refuses the bytes only costs the evidence (`EvidenceFile`).
    Each line dispatched is stamped with the time it was, beside the file
    (`jobwarden.daemon.store.stamps`).
    """
    buffer = bytearray()
    lineno, skipping = 0, False
    stamps = Stamper(events)
    at = events.size()  # the offset in the file of the buffer's first byte

    def dispatch(raw: bytes, end: int) -> None:
        stamps.add(end, time.time())
        parsed = parse_line(raw.decode(errors="replace"), lineno)
        if isinstance(parsed, Event):
            on_event(parsed)
        else:
            on_malformed(parsed)

    try:
        while chunk := await stream.read(1 << 16):
            events.write(chunk)
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                at += end + 1
                lineno += 1
                if skipping:  # the end of a line over the limit, told of already
                    skipping = False
                    stamps.add(at, time.time())
                elif line.strip():
                    dispatch(line, at)
            stamps.flush()
            if len(buffer) > LINE_LIMIT and not skipping:
                lineno += 1
                text = buffer[:200].decode(errors="replace")
                on_malformed(Malformed(text, f"line over {LINE_LIMIT} bytes", lineno))
                skipping = True
            if skipping:
                at += len(buffer)
                buffer.clear()
        if buffer.strip() and not skipping:
            lineno += 1
            dispatch(bytes(buffer), at + len(buffer))
    finally:
        stamps.close()
        events.close()


def suppress_gone() -> contextlib.suppress:
    """Ignore the signal or kill of a process that has already gone."""
    return contextlib.suppress(ProcessLookupError)
