"""The daemon a drill talks to: a given one, or a private one it starts and stops."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jobwarden.control import client
from jobwarden.errors import JobwardenError
from jobwarden.protocol import ControlError
from jobwarden.states import SETTLED

# The states a drill waits for: the daemon will do nothing more for the job on its own.
SETTLED_STATES = tuple(sorted(state.value for state in SETTLED))
POLL_S = 0.05
# A submit answers once the daemon's intake has taken the job in, which a busy intake delays.
SUBMIT_TIMEOUT_S = 60.0
LAUNCHER_ENV = "JOBWARDEN_DRILL_LAUNCHER"
"""``wardenctl drill --launcher NAME`` sets it: the private daemon's ``wardend --launcher``."""


class DrillAbandoned(JobwardenError):
    """Raised in a drill's thread when the run it belongs to is given up (another drill
    raised, or the operator pressed Ctrl-C), so that no thread outlives the daemon."""

    code = "drill.abandoned"


class JobRejected(JobwardenError):
    """Raised when the daemon rejects a job a drill submits (a plugin task the daemon does not
    know, say); carries the daemon's problems and where it kept the file."""

    code = "drill.rejected"


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
        """Hand a job file to the daemon over its control socket (``submit``: the daemon drops
        it into its own spool and takes it in); raises `JobRejected` if it is refused."""
        answer = client.request(
            self.root / "control.sock", "submit", SUBMIT_TIMEOUT_S, name=name, content=text
        )
        if not answer["accepted"]:
            raise JobRejected(
                f"the daemon rejected {name}: " + "; ".join(answer["problems"]),
                problems=answer["problems"],
                kept_at=answer["kept_at"],
            )

    def status(self, job: str) -> dict[str, Any] | None:
        """The job's status, None while the daemon does not know it."""
        try:
            found: dict[str, Any] = self.ask("status", job=job)
        except ControlError:
            return None
        return found

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
            status = self.status(job)
            if status is not None and status["state"] in states:
                return status
            self.pause()
        raise TimeoutError(f"job {job} did not reach {states} within {timeout} s")


def activated(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (this process's by default) with this interpreter's folder first on its
    ``PATH``, as an activated virtualenv has it: a command job's ``python`` is then the one
    wardenctl runs on, which has jobwarden."""
    env = dict(os.environ if environ is None else environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


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
    compiles into ``compile_cache`` (its own ``ROOT/cache/jax`` unless given); the folder of
    this interpreter comes first on its ``PATH``, so that a command job's ``python`` is the
    one wardenctl runs on, which has jobwarden (as an activated virtualenv would have it).  A
    given daemon keeps its own settings.
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
    if os.environ.get(LAUNCHER_ENV):
        argv += ["--launcher", os.environ[LAUNCHER_ENV]]
    with (private.parent / "wardend.stderr").open("wb") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, env=activated())
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
