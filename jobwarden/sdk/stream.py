"""Where an attached run's events go: stdout, or an events file of the program's choosing.

On stdout the events keep the stream to themselves: file descriptor 1 is
duplicated for them, and the program's own output (``print``, C libraries,
child processes) is sent to stderr for the life of the run, so a supervisor
reading stdout (or ``> run.jsonl``) sees only events.  An events file is
appended to (mode 0600, never through a symbolic link), so running a program
again adds its next attempt to the same log, as `wardenctl verify` reads it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import IO, Any

from jobwarden.errors import JobFileError
from jobwarden.events import Emitter, SupervisorGone

EVENTS_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class RunEmitter(Emitter):
    """An `Emitter` that never raises: once nobody reads (``broken``), events are dropped.

    The step loop checks ``broken`` between updates and stops as on SIGTERM.
    """

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one event, or drop it when the stream is broken."""
        with contextlib.suppress(SupervisorGone):
            super().emit(kind, **fields)


class EventStream:
    """The open destination of a run's events; `close` gives stdout back."""

    def __init__(self, stream: IO[str], owned: bool, saved_stdout: int | None) -> None:
        self.emitter = RunEmitter(stream)
        self._stream = stream
        self._owned = owned
        self._saved_stdout = saved_stdout

    @classmethod
    def open(cls, events: str | Path | IO[str] | None, *, redirect_prints: bool) -> EventStream:
        """Open ``events`` (a path, a text stream, or None for stdout).

        Raises `JobFileError` for an events file that cannot be opened (a symbolic
        link is refused); the refusal itself then goes to stdout.
        """
        if events is not None and not isinstance(events, (str, Path)):
            return cls(events, owned=False, saved_stdout=None)
        if events is not None:
            try:
                fd = os.open(events, EVENTS_FILE_FLAGS, 0o600)
            except OSError as error:
                problem = f"events: {events}: cannot open for appending: {error.strerror}"
                raise JobFileError("attach(events=...)", [problem]) from error
            return cls(os.fdopen(fd, "a", encoding="utf-8"), owned=True, saved_stdout=None)
        if not redirect_prints:
            return cls(sys.stdout, owned=False, saved_stdout=None)
        with contextlib.suppress(OSError, ValueError):  # the reader may already be gone
            sys.stdout.flush()
        try:
            fd = os.dup(1)
        except OSError:  # no stdout at all: events are dropped like a gone reader's
            return cls(sys.stdout, owned=False, saved_stdout=None)
        os.dup2(2, 1)
        return cls(os.fdopen(fd, "w", encoding="utf-8"), owned=True, saved_stdout=fd)

    def close(self) -> None:
        """Flush, close what was opened here and put stdout back."""
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        if self._saved_stdout is not None:
            with contextlib.suppress(OSError):
                os.dup2(self._saved_stdout, 1)
            self._saved_stdout = None
        if self._owned:
            self._owned = False
            with contextlib.suppress(OSError, ValueError):  # a broken pipe cannot be flushed
                self._stream.close()
