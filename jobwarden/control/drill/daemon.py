"""The daemon a drill talks to: a given one, or a private one it starts and stops.

The private daemon is the package's harness (`jobwarden.control.harness.Wardend`), as the
tests and benchmarks start theirs.  What a drill needs beyond it: it hands jobs over the
control socket (``submit``: the daemon's answer names the problems of a refused job, which
the drill's verdict shows), it may attach to an operator's daemon it neither starts nor
stops, its waits end early once the run is abandoned, and its private daemon rescans at
wardend's default interval with this interpreter first on its ``PATH``, logging to
``OUT/wardend.stderr``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jobwarden.control import client
from jobwarden.control.harness import SETTLED_STATES, Wardend
from jobwarden.errors import JobwardenError
from jobwarden.protocol import ControlError

__all__ = [
    "LAUNCHER_ENV",
    "POLL_S",
    "SETTLED_STATES",
    "SUBMIT_TIMEOUT_S",
    "DaemonHandle",
    "DrillAbandoned",
    "JobRejected",
    "activated",
    "daemon_for",
]

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


class DaemonHandle(Wardend):
    """Talks to the daemon of one root, the way an operator would; ``private`` when the drill
    started that daemon itself."""

    start_timeout_s = 30.0
    wait_timeout_s = 300.0
    stop_timeout_s = 120.0
    poll_s = POLL_S

    def __init__(self, root: Path, cache: Path | None = None, *extra: str, **options: Any) -> None:
        super().__init__(root, cache, *extra, **options)
        self.abandoned = threading.Event()

    @property
    def private(self) -> bool:
        """Whether the drill started this daemon, so that its slots are the drills' own."""
        return self.proc is not None

    def submit(self, name: str, text: str) -> None:
        """Hand a job file to the daemon over its control socket (``submit``: the daemon drops
        it into its own spool and takes it in); raises `JobRejected` if it is refused."""
        answer = client.request(self.socket, "submit", SUBMIT_TIMEOUT_S, name=name, content=text)
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
        if self.abandoned.wait(self.poll_s):
            raise DrillAbandoned(f"the drills on {self.root} were abandoned")

    def wait(
        self, job: str, states: Collection[str] = SETTLED_STATES, timeout: float | None = None
    ) -> dict[str, Any]:
        """Poll until the job reaches one of ``states``; returns its status."""
        limit = self.wait_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            status = self.status(job)
            if status is not None and status["state"] in states:
                return status
            self.pause()
        raise TimeoutError(f"job {job} did not reach {states} within {limit} s")


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
    extra: list[str] = []
    if slots is not None:
        extra += ["--max-concurrent", str(slots)]
    if os.environ.get(LAUNCHER_ENV):
        extra += ["--launcher", os.environ[LAUNCHER_ENV]]
    handle = DaemonHandle(
        private,
        compile_cache,
        *extra,
        rescan_interval=None,
        stderr=private.parent / "wardend.stderr",
        append_stderr=False,
        env=activated(),
    )
    try:
        handle.start()
        yield handle
    finally:
        handle.stop()
