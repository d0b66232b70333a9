"""The daemon a drill talks to: a given one, or a private one it starts and stops."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jobwarden.control import client
from jobwarden.control.protocol import ControlError
from jobwarden.errors import JobwardenError
from jobwarden.states import SETTLED

# The states a drill waits for: the daemon will do nothing more for the job on its own.
SETTLED_STATES = tuple(sorted(state.value for state in SETTLED))
POLL_S = 0.05


class DrillAbandoned(JobwardenError):
    """Raised in a drill's thread when the run it belongs to is given up (another drill
    raised, or the operator pressed Ctrl-C), so that no thread outlives the daemon."""

    code = "drill.abandoned"


class DaemonHandle:
    """Talks to the daemon of one root, the way an operator would; ``private`` when the drill
    started that daemon itself."""

    def __init__(self, root: Path, private: bool = False) -> None:
        self.root = root
        self.private = private
        self.abandoned = threading.Event()

    def ask(self, cmd: str, **args: Any) -> Any:
        """One control request."""
        return client.request(self.root / "control.sock", cmd, **args)

    def submit(self, name: str, text: str) -> None:
        """Drop a request file: create in spool/tmp, rename into spool/incoming."""
        tmp = self.root / "spool" / "tmp" / name
        tmp.write_text(text)
        os.rename(tmp, self.root / "spool" / "incoming" / name)

    def pause(self) -> None:
        """Wait one poll interval; raises `DrillAbandoned` once the run is given up."""
        if self.abandoned.wait(POLL_S):
            raise DrillAbandoned(f"the drills on {self.root} were abandoned")

    def wait(
        self, job: str, states: tuple[str, ...] = SETTLED_STATES, timeout: float = 300
    ) -> dict[str, Any]:
        """Poll until the job reaches one of ``states``; returns its status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status: dict[str, Any] = self.ask("status", job=job)
                if status["state"] in states:
                    return status
            except ControlError:
                pass
            self.pause()
        raise TimeoutError(f"job {job} did not reach {states} within {timeout} s")


@contextmanager
def daemon_for(
    root: Path | None,
    private: Path,
    *,
    compile_cache: Path | None = None,
    slots: int | None = None,
) -> Iterator[DaemonHandle]:
    """The daemon at ``root``, or a private one on ``private``, stopped afterwards.

    The private daemon runs ``slots`` jobs at once (wardend's default unless given) and
    compiles into ``compile_cache`` (its own ``ROOT/cache/jax`` unless given); a given
    daemon keeps its own settings.
    """
    if root is not None:
        handle = DaemonHandle(root)
        handle.ask("version")
        yield handle
        return
    private.parent.mkdir(parents=True, exist_ok=True)
    private.mkdir(mode=0o700, exist_ok=True)
    argv = [sys.executable, "-m", "jobwarden.daemon", "--root", str(private)]
    if slots is not None:
        argv += ["--max-concurrent", str(slots)]
    if compile_cache is not None:
        argv += ["--compile-cache", str(compile_cache)]
    with (private.parent / "wardend.stderr").open("wb") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
        handle = DaemonHandle(private, private=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    handle.ask("version")
                    break
                except client.DaemonUnreachable:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise
                    time.sleep(POLL_S)
            yield handle
        finally:
            proc.terminate()
            proc.wait(120)
