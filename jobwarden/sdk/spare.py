"""A spare of an SDK program: started ahead of need, it waits at the run's restore point.

wardend may start a command job's program (``sdk = true``, one process) before
the attempt that will need it, with ``$JOBWARDEN_SPARE`` set (`SPARE_ENV`).  The
program runs as it always does: its imports, its data, its model and optimizer,
and `jobwarden.sdk.attach` pins the runtime and imports JAX.  The run holds no
writer lock and opens nothing under the checkpoint directory; it emits nothing.
At the first call that needs the run's identity (``run.restore``, ``run.restored``,
``run.checkpoint_dir``, ``run.emit``, ``run.steps``; for a member of a
multi-process job, as the run is entered, before `jax.distributed` is joined), after the program's
``warmup`` has compiled its update on the initial state's shapes, it writes one
line on stdout (`READY`, never an event) and waits on stdin.

The daemon hands it one attempt as one JSON line (`Handoff`).  The spare
checks that it is what a cold start would be (`SpareWait.changed`: the sources
and data files it started with are unchanged on disk, and it holds no file
under the checkpoint directory); if not, it says why (`REFUSED`) and exits
`REFUSED_STATUS`, and the daemon starts the attempt cold.  Else it says
`TAKEN`, makes the attempt's ``stderr.log`` its stderr, moves into the
attempt's folder when the job names no workdir, reads the attempt's run file
and goes on as a cold start would: the writer lock, ``started``, the restore.
End of stdin before a handoff (the daemon retires the spare, or stops) ends it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jobwarden.hashing import files_digest
from jobwarden.runtime import exit_now, release_code_pages
from jobwarden.sdk.distributed import PROCESSES_ENV
from jobwarden.sdk.settings import RUN_FILE_ENV

SPARE_ENV = "JOBWARDEN_SPARE"
"""Set (to ``1``) in a spare's environment by the daemon; absent in every attempt."""
READY = "ready"
TAKEN = "taken"
REFUSED = "refused"
REFUSED_STATUS = 75
"""A refusing spare's exit status: nothing failed, the attempt is the cold start's."""


@dataclass(frozen=True)
class Handoff:
    """The attempt a spare is handed: its run file, its ``stderr.log``, the folder to move
    into (None: the job's own workdir, where the spare already is), and the environment the
    attempt sets anew (a member's coordinator, chosen per attempt)."""

    run_file: Path
    stderr: Path
    cwd: Path | None
    env: Mapping[str, str]

    @classmethod
    def parse(cls, line: str) -> Handoff:
        """From the daemon's one line; a line that is not one ends the spare."""
        document = json.loads(line)
        cwd, env = document.get("cwd"), document.get("env") or {}
        folder = Path(cwd) if cwd else None
        return cls(Path(document["run_file"]), Path(document["stderr"]), folder, dict(env))

    def line(self) -> str:
        """The line the daemon writes."""
        cwd = str(self.cwd) if self.cwd is not None else None
        record = {"run_file": str(self.run_file), "stderr": str(self.stderr), "cwd": cwd}
        return json.dumps({**record, "env": dict(self.env)}) + "\n"


def _stats(paths: Sequence[Path]) -> list[tuple[str, int, int]]:
    """Each data file's size and modification time: re-reading gigabytes would cost the
    hand-off what the spare saves."""
    found = []
    for path in paths:
        try:
            stat = path.stat()
            found.append((str(path), stat.st_size, stat.st_mtime_ns))
        except OSError:
            found.append((str(path), -1, -1))
    return found


def held_under(directory: Path) -> list[str]:
    """The files under ``directory`` this process holds open (a spare must hold none)."""
    held = []
    root = os.path.realpath(directory)
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target == root or target.startswith(root + os.sep):
            held.append(target)
    return held


class SpareWait:
    """A spare's side of the hand-off: what it started with, the wait, the check, the take-over."""

    def __init__(self, out: IO[str], sources: Sequence[Path], data_files: Sequence[Path]) -> None:
        self._out = out
        self._sources = tuple(sources)
        self._source_digest = files_digest(self._sources)
        self._data_files = tuple(data_files)
        self._data_stats = _stats(self._data_files)
        self.broken: list[str] = []
        """What the program did before its restore point that a spare must not (`changed`):
        every spare of it would be refused, so the daemon starts no more."""

    @staticmethod
    def wanted(environ: Mapping[str, str]) -> bool:
        """Whether this process is a spare (`SPARE_ENV`)."""
        return environ.get(SPARE_ENV) == "1"

    @staticmethod
    def member(environ: Mapping[str, str]) -> bool:
        """Whether this spare is a member of a multi-process job: it waits as the run is
        entered, since `jax.distributed` must be joined before any JAX computation."""
        return environ.get(PROCESSES_ENV, "1") not in ("", "0", "1")

    def _say(self, what: str, **fields: Any) -> None:
        self._out.write(json.dumps({"spare": what, "pid": os.getpid(), **fields}) + "\n")
        self._out.flush()

    def wait(self, prepared_s: float) -> Handoff:
        """Let go of the libraries' code pages and the heap's free memory (the warmup has
        compiled), say ready, then wait for the handoff; end of input ends the process."""
        release_code_pages(heap=True, collapse=True)
        self._say(READY, prepared_s=round(prepared_s, 4))
        line = sys.stdin.readline()
        if not line:
            exit_now(0)
        try:
            return Handoff.parse(line)
        except (ValueError, KeyError, TypeError):
            exit_now(0)
            raise  # for the type checker: exit_now does not return

    def changed(self, checkpoint_dir: Path | None) -> list[str]:
        """What makes this spare differ from a cold start of the attempt, each named."""
        problems = []
        try:
            digest = files_digest(self._sources)
        except OSError as error:
            digest = f"unreadable: {error}"
        if digest != self._source_digest:
            names = ", ".join(p.name for p in self._sources)
            problems.append(f"sources changed since the spare started ({names})")
        if _stats(self._data_files) != self._data_stats:
            problems.append("data files changed since the spare started")
        held = held_under(checkpoint_dir) if checkpoint_dir is not None else []
        self.broken = [f"holds {path} open before run.restore()" for path in held]
        return problems + self.broken

    def refuse(self, problems: list[str]) -> None:
        """Say why this spare cannot be handed the attempt, and end."""
        sys.stderr.write("jobwarden: spare refused: " + "; ".join(problems) + "\n")
        self._say(REFUSED, problems=problems, contract=bool(self.broken))
        exit_now(REFUSED_STATUS)

    def take_over(self, handoff: Handoff, prints_to_stderr: bool) -> None:
        """Say taken, then become the attempt: its stderr.log as fd 2 (and fd 1 where the
        program's prints go to stderr), its folder as cwd, its run file in the environment."""
        self._say(TAKEN)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        sys.stderr.flush()
        stderr = os.open(handoff.stderr, flags, 0o600)
        os.dup2(stderr, 2)
        if prints_to_stderr:
            sys.stdout.flush()
            os.dup2(stderr, 1)
        os.close(stderr)
        if handoff.cwd is not None:
            os.chdir(handoff.cwd)
        os.environ.update(handoff.env)
        os.environ[RUN_FILE_ENV] = str(handoff.run_file)
        os.environ.pop(SPARE_ENV, None)
