"""Preemption and stack dumps: SIGTERM asks the step loop to commit and stop, SIGUSR1 dumps stacks.

The SIGTERM handler only sets a flag; the loop (`jobwarden.sdk.run.Run.steps`)
reads it between updates, so the update in flight always finishes.  Under a
supervisor (``$JOBWARDEN_SUPERVISOR_PID``) the kernel also sends SIGTERM when
the supervisor dies (``PR_SET_PDEATHSIG``), so an orphaned run commits and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
from types import FrameType
from typing import Any

from jobwarden.runtime import SUPERVISOR_ENV

PR_SET_PDEATHSIG = 1


class Preemption:
    """Records SIGTERM (or a vanished supervisor) for the loop; the handler only sets a flag."""

    def __init__(self) -> None:
        self.requested = False
        self.reason = ""
        self._previous: Any = None
        self._installed = False

    def request(self, reason: str) -> None:
        """Ask the loop to commit and stop, for ``reason``."""
        if not self.requested:
            self.requested, self.reason = True, reason

    def install(self) -> None:
        """Route SIGTERM here and SIGUSR1 to a stack dump of every thread on stderr.

        Must run in the main thread (Python delivers signals there only).
        """
        self._previous = signal.signal(signal.SIGTERM, self._on_term)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        self._installed = True
        supervisor = os.environ.get(SUPERVISOR_ENV)
        if supervisor and supervisor.isdigit():
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != int(supervisor):
                self.request("supervisor gone before start")

    def uninstall(self) -> None:
        """Give SIGTERM and SIGUSR1 back to what the program had before."""
        if not self._installed:
            return
        self._installed = False
        with contextlib.suppress(ValueError, TypeError):  # not the main thread, or no handler
            signal.signal(signal.SIGTERM, self._previous)
        faulthandler.unregister(signal.SIGUSR1)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.request("SIGTERM" if os.getppid() != 1 else "SIGTERM (supervisor gone)")
