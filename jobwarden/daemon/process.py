"""Worker processes: spawn in their own process group, pump events, sample, stop.

Stopping is one named policy: SIGTERM to the worker (it commits a checkpoint
and exits 75), a grace period, then SIGKILL to the whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from jobwarden.events import Event, Malformed, parse_line
from jobwarden.worker.runtime import SUPERVISOR_ENV

LINE_LIMIT = 1 << 20


@dataclass
class ExitInfo:
    """How an attempt's process ended."""

    status: int
    signal: str | None
    duration_s: float
    stopped_by: str | None

    def as_record(self) -> dict[str, Any]:
        """JSON-ready form for exit.json."""
        return {
            "exit_status": self.status,
            "signal": self.signal,
            "duration_s": self.duration_s,
            "stopped_by": self.stopped_by,
            "ended": time.time(),
        }


@dataclass
class WorkerProcess:
    """One attempt's worker process and its evidence folder."""

    job_id: str
    attempt: int
    folder: Path
    argv: list[str]
    env: dict[str, str]
    proc: asyncio.subprocess.Process | None = None
    started_mono: float = 0.0
    stop_reason: str | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    exit_info: ExitInfo | None = None
    malformed: int = 0
    _ps: psutil.Process | None = None

    @property
    def pid(self) -> int:
        """The worker's pid (also its process group id)."""
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        """Spawn the worker in a new session, stderr straight to stderr.log."""
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**self.env, SUPERVISOR_ENV: str(os.getpid())}
        with (self.folder / "stderr.log").open("ab") as stderr:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=env,
                start_new_session=True,
                limit=LINE_LIMIT,
            )
        self.started_mono = time.monotonic()
        try:
            self._ps = psutil.Process(self.pid)
        except psutil.Error:
            self._ps = None

    def create_time(self) -> float | None:
        """The kernel's start time of the worker, to recognise it after a daemon restart."""
        try:
            return self._ps.create_time() if self._ps else None
        except psutil.Error:
            return None

    async def pump(
        self, on_event: Callable[[Event], None], on_malformed: Callable[[Malformed], None]
    ) -> ExitInfo:
        """Record every stdout byte verbatim and dispatch each line, until EOF; then reap.

        Lines longer than `LINE_LIMIT` are kept in the file but reported as
        malformed once and not parsed; nothing the worker writes can crash this.
        """
        assert self.proc is not None
        assert self.proc.stdout is not None
        stream = self.proc.stdout
        buffer = bytearray()
        lineno, skipping = 0, False

        def dispatch(raw: bytes) -> None:
            parsed = parse_line(raw.decode(errors="replace"), lineno)
            if isinstance(parsed, Event):
                on_event(parsed)
            else:
                self.malformed += 1
                on_malformed(parsed)

        with (self.folder / "events.jsonl").open("ab", buffering=0) as events:
            while chunk := await stream.read(1 << 16):
                events.write(chunk)
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    lineno += 1
                    if skipping:
                        skipping = False
                    elif line.strip():
                        dispatch(line)
                if len(buffer) > LINE_LIMIT and not skipping:
                    lineno += 1
                    self.malformed += 1
                    on_malformed(
                        Malformed(
                            buffer[:200].decode(errors="replace"),
                            f"line over {LINE_LIMIT} bytes",
                            lineno,
                        )
                    )
                    skipping = True
                if skipping:
                    buffer.clear()
            if buffer.strip() and not skipping:
                lineno += 1
                dispatch(bytes(buffer))
        status = await self.proc.wait()
        info = ExitInfo(
            status=status,
            signal=signal.Signals(-status).name if status < 0 else None,
            duration_s=time.monotonic() - self.started_mono,
            stopped_by=self.stop_reason,
        )
        self.exit_info = info
        (self.folder / "exit.json").write_text(json.dumps(info.as_record(), indent=2) + "\n")
        self.exited.set()
        return info

    def sample(self) -> dict[str, Any]:
        """rss, cpu%, status and threads of the worker, from psutil."""
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

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the worker alone, if it still runs."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL the worker's whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)

    async def stop(self, reason: str, grace_s: float) -> None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL the group; returns once reaped."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.exited.wait(), grace_s)
        except TimeoutError:
            self.kill_group()
            await self.exited.wait()


def worker_argv(job_file: Path, checkpoint_dir: Path, cache: Path) -> list[str]:
    """The command line of one attempt: the worker, exactly as an operator would run it."""
    return [
        sys.executable,
        "-m",
        "jobwarden.worker",
        "--job",
        str(job_file),
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--compile-cache",
        str(cache),
    ]
