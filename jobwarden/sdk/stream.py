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
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, NamedTuple

from jobwarden.errors import JobFileError
from jobwarden.events import Emitter, SupervisorGone, encode

EVENTS_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


HOLD_S = 0.1
"""How long an unhashed progress event may wait for the next write (`RunEmitter.emit_held`)."""
HOLD_EVENTS = 32
"""At most this many events are held: one write of a few KiB."""
LATER_AT_MOST = 2
"""At most this many `RunEmitter.emit_later` events wait for their fields: a loop faster
than its hashes waits for the oldest, instead of holding ever more states in memory and
losing ever more events at a crash."""


Later = Callable[[], Mapping[str, Any]]
"""What `RunEmitter.emit_later` runs on its thread: the rest of an event's fields."""


class Slot(NamedTuple):
    """An event emitted while an earlier one waits for its fields: written in its turn."""

    kind: str
    at: float
    fields: dict[str, Any]
    later: Later | None
    held: bool


class RunEmitter(Emitter):
    """An `Emitter` that never raises: once nobody reads (``broken``), events are dropped.

    The step loop checks ``broken`` between updates and stops as on SIGTERM.
    `emit_held` lets an event wait to share the next write with others, so a
    fast loop pays one write (and one warm encoding loop) per ``HOLD_S``
    instead of a write per update.  `emit_later` has an event's remaining
    fields (a state hash) computed on a thread of its own while the loop runs
    on; every event emitted after it, from any thread, is written after it.
    """

    def __init__(self, stream: IO[str], clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stream)
        self._clock = clock
        self._held: list[tuple[str, float, dict[str, Any]]] = []
        self._written_at = clock()
        self._lock = threading.RLock()  # a background commit reports from its own thread
        self._written = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[Slot | None] = queue.SimpleQueue()
        self._waiting = 0
        """events emitted and not yet written or held, in `_queue`'s order"""
        self._computing = 0
        """of those, the `emit_later` ones"""
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None
        self._next: tuple[str, float, dict[str, Any], Later] | None = None
        """the event `emit_next` left, to be finished when the next one is emitted"""

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one event now, after any held ones, or drop it when the stream is broken;
        after the events still waiting for their fields (`emit_later`), in its turn."""
        with self._lock:
            self._settle_next()
            if self._waiting:
                self._enqueue(Slot(kind, time.time(), fields, None, held=False))
            else:
                self._write_now(kind, time.time(), fields)

    def emit_held(self, kind: str, **fields: Any) -> None:
        """Write one event, or hold it for the next write if one was made under ``HOLD_S`` ago.

        For what only stall detection and the loss curve read (a progress event
        with no state hash): a crash loses what is held, under ``HOLD_S`` of
        updates.  Whatever proves something (a state hash, a checkpoint, the
        end) goes through `emit` or `emit_later`, which write the held events
        before it.  Each event keeps the time it happened.
        """
        with self._lock:
            self._settle_next()
            self._held_at(kind, time.time(), fields)

    def emit_next(self, kind: str, finish: Later, **fields: Any) -> None:
        """Leave one event whose remaining fields ``finish()`` gives when the next event is
        emitted (or the emitter drained, released or stopped), on that caller's thread:
        what the update still running at this call has not yet made (its loss, its
        state's bytes) is ready by then, so taking it costs the loop no wait, and it is
        taken while the next update runs.

        The event keeps the time of this call and is then held as `emit_held` holds it;
        a crash before the next event loses it.  An error of ``finish`` is raised by the
        next `emit_next` or `drain`, on its caller's thread; its event is written without
        the fields.
        """
        with self._lock:
            self._settle_next()
            self._next = (kind, time.time(), fields, finish)
        self._raise_error()

    def finish_next(self) -> None:
        """Finish and hold the event `emit_next` left now, if one is left."""
        with self._lock:
            self._settle_next()

    def _settle_next(self) -> None:
        """Hold the event `emit_next` left, its fields finished (the lock held)."""
        left, self._next = self._next, None
        if left is None:
            return
        kind, at, fields, finish = left
        try:
            fields = {**fields, **finish()}
        except BaseException as error:  # noqa: BLE001 - raised on the training thread
            self._error = self._error or error
        self._held_at(kind, at, fields)

    def _held_at(self, kind: str, at: float, fields: dict[str, Any]) -> None:
        """`emit_held`'s part under the lock, for an event of time ``at``."""
        if self._waiting:
            self._enqueue(Slot(kind, at, fields, None, held=True))
        else:
            self._hold(kind, at, fields)

    def emit_later(self, kind: str, later: Later, **fields: Any) -> None:
        """Write one event with ``fields`` and what ``later()`` returns, once a thread of the
        emitter's own has run it; events emitted after this one are written after it.

        The event keeps the time it was emitted.  A crash before it is written loses
        it (and what follows it).  With `LATER_AT_MOST` such events waiting, this waits
        for the oldest.  An error of ``later`` is raised here or by `drain`, on the
        caller's thread; its event is written without the fields.
        """
        self._raise_error()
        with self._lock:
            self._settle_next()
            while self._computing >= LATER_AT_MOST:
                self._written.wait()
            self._computing += 1
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="jobwarden-events", daemon=True
                )
                self._worker.start()
            self._enqueue(Slot(kind, time.time(), fields, later, held=False))

    def drain(self) -> None:
        """Wait until every event emitted so far is written (or held); raises the error of
        an `emit_later` computation, once."""
        with self._lock:
            self._settle_next()
            while self._waiting:
                self._written.wait()
        self._raise_error()

    def stop(self) -> None:
        """`drain`, then end the emitter's thread (a later `emit_later` starts another)."""
        try:
            self.drain()
        finally:
            with self._lock:
                worker, self._worker = self._worker, None
            if worker is not None:
                self._queue.put(None)
                worker.join()

    def release(self, kind: str = "held") -> None:
        """Write the held events (one write, flushed), the one `emit_next` left among them;
        dropped when the stream is broken."""
        with self._lock:
            self._settle_next()
            self._release(kind)

    def _release(self, kind: str) -> None:
        with self._lock:
            held, self._held = self._held, []
            self._written_at = self._clock()
            if held and not self.broken:
                lines = "".join([encode(name, fields, at) for name, at, fields in held])
                with contextlib.suppress(SupervisorGone):
                    self.write(kind, lines)

    def _write_now(self, kind: str, at: float, fields: dict[str, Any]) -> None:
        self._held.append((kind, at, fields))
        self._release(kind)

    def _hold(self, kind: str, at: float, fields: dict[str, Any]) -> None:
        self._held.append((kind, at, fields))
        if len(self._held) >= HOLD_EVENTS or self._clock() - self._written_at >= HOLD_S:
            self._release(kind)

    def _enqueue(self, slot: Slot) -> None:
        self._waiting += 1
        self._queue.put(slot)

    def _work(self) -> None:
        """The emitter's thread: each slot's fields computed, then written in order."""
        while (slot := self._queue.get()) is not None:
            fields = slot.fields
            if slot.later is not None:
                try:
                    fields = {**fields, **slot.later()}
                except BaseException as error:  # noqa: BLE001 - raised on the caller's thread
                    self._error = self._error or error
            with self._lock:
                if slot.held:
                    self._hold(slot.kind, slot.at, fields)
                else:
                    self._write_now(slot.kind, slot.at, fields)
                self._waiting -= 1
                self._computing -= slot.later is not None
                self._written.notify_all()

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


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
        """Write what waits and what is held, flush, close what was opened here and put
        stdout back."""
        with contextlib.suppress(Exception):  # a background hash's error was reported before
            self.emitter.stop()
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
