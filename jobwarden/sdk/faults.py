"""Drill faults, injected at the points a real failure would hit.

All are operational (never hashed): ``fail_after`` raises after an update,
``crash_after`` kills the process with SIGKILL after an update,
``crash_in_commit`` kills it after the pending checkpoint file is durable and
before it is replaced into place, ``stall_at`` hangs after N completed updates,
``step_delay_s`` slows every update, ``commit_delay_s`` every commit (a slow disk:
the wait comes after the pending file is durable, before the replace), and
``crash_every_s`` kills the process with SIGKILL that many seconds after the
run is entered (a soak's chaos: every attempt, wherever it is, even mid-commit).
The SDK's step loop consults them, so every drill applies to a user's program as
it does to the built-in tasks.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jobwarden.errors import InjectedFailure
from jobwarden.events import Emitter, human
from jobwarden.jobfile import FaultSection
from jobwarden.sdk.stream import RunEmitter


class FaultPlan:
    """The faults of one attempt, consulted by the step loop (`jobwarden.sdk.run.Run`)."""

    def __init__(self, faults: FaultSection, emitter: Emitter) -> None:
        self.faults = faults
        self.emitter = emitter
        self._chaos: threading.Timer | None = None

    def arm(self) -> None:
        """Start the ``crash_every_s`` clock, if configured (`disarm` stops it)."""
        seconds = self.faults.crash_every_s
        if seconds is None or self._chaos is not None:
            return
        self._chaos = threading.Timer(seconds, hard_crash, (f"crash_every_s={seconds:g}",))
        self._chaos.daemon = True
        self._chaos.start()

    def disarm(self) -> None:
        """Stop the ``crash_every_s`` clock: the run is left."""
        if self._chaos is not None:
            self._chaos.cancel()
            self._chaos = None

    def before_update(self, completed: int) -> None:
        """Stall or slow down before the next update, as configured."""
        if self.faults.stall_at == completed:
            seconds = self.faults.stall_seconds
            self.emitter.emit("stall_injected", step=completed, seconds=seconds)
            # As an injected crash does: stderr says the hang was the drill's, and a test
            # whose supervisor cannot read events sees the stall begun.
            human(f"jobwarden worker: injected stall of {seconds:g} s after update {completed}\n")
            time.sleep(seconds)
        if self.faults.step_delay_s:
            time.sleep(self.faults.step_delay_s)

    def after_update(self, step: int) -> None:
        """Fail or crash after update ``step``, as configured."""
        if self.faults.fail_after == step:
            raise InjectedFailure(f"controlled failure after update {step}", step=step)
        if self.faults.crash_after == step:
            # The drill crashes after the update's event is out, hashed in the background
            # or not, held for a later write or not, so that its verification points do
            # not depend on a thread's timing.
            # A real crash (and crash_every_s) may come before: then that hash is simply
            # not a verification point.
            if isinstance(self.emitter, RunEmitter):
                self.emitter.drain()
                self.emitter.release()  # and the ones held for a later write
            hard_crash(f"crash_after={step}")

    def commit_hook(self, step: int) -> Callable[[Path], None] | None:
        """A hook that slows down or crashes the commit of the checkpoint at ``step``, as
        configured; it runs once the pending file is durable, before the replace."""
        delay, crash = self.faults.commit_delay_s, self.faults.crash_in_commit == step
        if not delay and not crash:
            return None

        def hook(pending: Path) -> None:
            time.sleep(delay)
            if crash:
                hard_crash(f"crash_in_commit={step}, pending file {pending}")

        return hook


def hard_crash(why: str) -> None:
    """Die at once by SIGKILL: no cleanup, no event, as a real crash would."""
    human(f"jobwarden worker: injected hard crash ({why})\n")
    os.kill(os.getpid(), signal.SIGKILL)
