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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from jobwarden.errors import JobFileError
from jobwarden.events import Emitter, SupervisorGone, encode

EVENTS_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


HOLD_S = 0.1
"""How long an unhashed progress event may wait for the next write (`RunEmitter.emit_held`)."""
HOLD_EVENTS = 32
"""At most this many events are held: one write of a few KiB."""


class RunEmitter(Emitter):
    """An `Emitter` that never raises: once nobody reads (``broken``), events are dropped.

    The step loop checks ``broken`` between updates and stops as on SIGTERM.
    `emit_held` lets an event wait to share the next write with others, so a
    fast loop pays one write (and one warm encoding loop) per ``HOLD_S``
    instead of a write per update.
    """

    def __init__(self, stream: IO[str], clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stream)
        self._clock = clock
        self._held: list[tuple[str, float, dict[str, Any]]] = []
        self._written_at = clock()
        self._lock = threading.RLock()  # a background commit reports from its own thread

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one event now, after any held ones, or drop it when the stream is broken."""
        with self._lock:
            self._held.append((kind, time.time(), fields))
            self.release(kind)

    def emit_held(self, kind: str, **fields: Any) -> None:
        """Write one event, or hold it for the next write if one was made under ``HOLD_S`` ago.

        For what only stall detection and the loss curve read (a progress event
        with no state hash): a crash loses what is held, under ``HOLD_S`` of
        updates.  Whatever proves something (a state hash, a checkpoint, the
        end) goes through `emit`, which writes the held events before it.  Each
        event keeps the time it happened.
        """
        with self._lock:
            self._held.append((kind, time.time(), fields))
            if len(self._held) >= HOLD_EVENTS or self._clock() - self._written_at >= HOLD_S:
                self.release(kind)

    def release(self, kind: str = "held") -> None:
        """Write the held events (one write, flushed); dropped when the stream is broken."""
        with self._lock:
            held, self._held = self._held, []
            self._written_at = self._clock()
            if held and not self.broken:
                lines = "".join([encode(name, fields, at) for name, at, fields in held])
                with contextlib.suppress(SupervisorGone):
                    self.write(kind, lines)


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

    @property
    def raw(self) -> IO[str]:
        """The stream itself, for the lines a spare says before it is an attempt."""
        return self._stream

    @property
    def redirected(self) -> bool:
        """Whether the program's own stdout goes to stderr for the life of the run."""
        return self._saved_stdout is not None

    def close(self) -> None:
        """Write what is held, flush, close what was opened here and put stdout back."""
        self.emitter.release()
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
