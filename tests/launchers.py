"""A test-only launcher: every attempt runs through ``bash -c``, with no psutil at all.

It exists to show the launcher seam: it is written against
`jobwarden.daemon.launcher` alone, and the daemon picks it with
``wardend --launcher tests.launchers:BashLauncher`` without a change to the
policy or the supervisor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from jobwarden.daemon.evidence import open_evidence
from jobwarden.daemon.launcher import (
    LINE_LIMIT,
    ExitInfo,
    Launcher,
    LaunchSpec,
    OnEvent,
    OnMalformed,
    RunningAttempt,
    pump,
    suppress_gone,
)

BANNER = "launched through bash"
SCRIPT = f'echo "{BANNER} $BASH_VERSION" >&2; exec "$@"'


class BashAttempt(RunningAttempt):
    """A worker that bash started and then became (``exec``)."""

    def __init__(self, spec: LaunchSpec, proc: asyncio.subprocess.Process) -> None:
        super().__init__(spec)
        self.proc = proc
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        """bash's pid, which the worker inherited by exec."""
        return self.proc.pid

    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Pump stdout, then reap."""
        if self.proc.stdout is not None:
            await pump(self.proc.stdout, self.events, on_event, on_malformed)
        status = await self.proc.wait()
        return self._ended(ExitInfo.from_status(status, time.monotonic() - self.started))

    def signal(self, signum: int) -> None:
        """Signal the worker."""
        if self.proc.returncode is None:
            with suppress_gone():
                os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the attempt's process group."""
        with suppress_gone():
            os.killpg(self.pid, signal.SIGKILL)


class BashLauncher(Launcher):
    """Runs ``bash -c 'exec "$@"' bash ARGV...`` in a new session."""

    name = "bash"

    async def start(self, spec: LaunchSpec) -> BashAttempt:
        """Start the attempt through bash."""
        spec.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open_evidence(spec.folder / "stderr.log") as stderr:
            proc = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                SCRIPT,
                "bash",
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=spec.env,
                cwd=spec.cwd,
                start_new_session=True,
                limit=LINE_LIMIT,
            )
        return BashAttempt(spec, proc)
