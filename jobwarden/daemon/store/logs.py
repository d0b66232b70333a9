"""The daemon's log: structlog JSON lines to stderr and to ``ROOT/wardend.log`` (mode 0600).

Each stream is written by a thread of its own, from a bounded queue of whole
lines, so that no log record ever waits on the loop for a slow disk or for the
reader of stderr (journald under load, a terminal paused with Ctrl-S, a pipe
nobody reads).  Before this, every record was one synchronous write on the
loop: once a stderr pipe's 64 KiB filled, the daemon stopped answering.  A
stream that falls `QUEUE_LINES` behind loses the newest lines, counted, and
writes one ``log.dropped`` record naming how many once it catches up; the
other stream is not held back by it.  At exit the queues are drained for at
most `DRAIN_S` in all.  `written` lets a reader of the file (``tail``) wait,
in its own thread, until the records logged before it asked are in the file.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

from jobwarden.daemon.store.rootcheck import open_private
from jobwarden.events import iso_twin

QUEUE_LINES = 10_000
"""Lines a stream may fall behind (a few MB at most) before the newest are dropped."""
DRAIN_S = 5.0
"""How long `Log.close` waits for each stream to write what it still holds."""


class LineWriter:
    """One stream, written by its own thread from a bounded queue of whole lines."""

    def __init__(self, stream: IO[str], name: str, capacity: int = QUEUE_LINES) -> None:
        self.stream = stream
        self.lines: queue.Queue[str | threading.Event | None] = queue.Queue(capacity)
        self.lock = threading.Lock()
        self.dropped = 0
        self.thread = threading.Thread(target=self._run, name=f"log-{name}", daemon=True)
        self.thread.start()

    def write(self, line: str) -> None:
        """Queue one whole line; never blocks (a full queue drops it, counted)."""
        try:
            self.lines.put_nowait(line)
        except queue.Full:
            with self.lock:
                self.dropped += 1

    def mark(self) -> threading.Event | None:
        """An event set once every line queued before it is written; None if the queue is
        full (the caller reads without waiting)."""
        marker = threading.Event()
        try:
            self.lines.put_nowait(marker)
        except queue.Full:
            return None
        return marker

    def close(self, timeout: float = DRAIN_S) -> bool:
        """Write what is queued (for at most ``timeout`` s); True if all of it was written."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.lines.put(None, timeout=max(0.0, deadline - time.monotonic()))
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    return False
        self.thread.join(max(0.0, deadline - time.monotonic()))
        return not self.thread.is_alive()

    def _run(self) -> None:
        while (line := self.lines.get()) is not None:
            if isinstance(line, threading.Event):
                line.set()
                continue
            try:
                self.stream.write(line)
                with self.lock:
                    dropped, self.dropped = self.dropped, 0
                if dropped:
                    self.stream.write(dropped_record(dropped))
                self.stream.flush()
            except (OSError, ValueError):  # a closed stderr: this stream is gone, not the daemon
                return


Record = MutableMapping[str, Any]


def stamp_now() -> dict[str, float | str]:
    """``time`` (epoch seconds) and ``time_iso``, as every jobwarden record carries them."""
    now = time.time()
    return {"time": now, "time_iso": iso_twin(now)}


def stamp(
    _logger: object, _name: str, record: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The structlog processor that stamps each record of the daemon's log (`stamp_now`)."""
    record.update(stamp_now())
    return record


def dropped_record(count: int) -> str:
    """The line that stands for ``count`` lines a stream could not keep up with."""
    return (
        json.dumps(
            {
                "lines": count,
                "reason": f"this stream fell {QUEUE_LINES} lines behind",
                "event": "log.dropped",
                "level": "warning",
                **stamp_now(),
            }
        )
        + "\n"
    )


class Log:
    """The daemon's log streams: what structlog writes to, each line to every stream."""

    def __init__(self, *writers: LineWriter) -> None:
        self.writers = writers

    def mark(self) -> threading.Event | None:
        """An event set once the file holds every record logged before this call (None
        without a file, or with its queue full)."""
        files = [w for w in self.writers if w.stream is not sys.stderr]
        return files[-1].mark() if files else None

    def write(self, text: str) -> int:
        """Queue ``text`` (one whole record and its newline) for every stream."""
        for writer in self.writers:
            writer.write(text)
        return len(text)

    def flush(self) -> None:
        """Nothing to do here: each stream's thread flushes after each line."""

    def close(self) -> None:
        """Drain the streams (for at most `DRAIN_S` in all), then close the file."""
        if self in CURRENT:
            CURRENT.remove(self)
        deadline = time.monotonic() + DRAIN_S
        for writer in self.writers:
            writer.close(max(0.0, deadline - time.monotonic()))
        for writer in self.writers:
            if writer.stream is not sys.stderr and not writer.thread.is_alive():
                writer.stream.close()


CURRENT: list[Log] = []
"""The `Log` that `configure` set up, if any (an in-process daemon of a test has none)."""


def written() -> threading.Event | None:
    """Called on the loop: an event set once ``wardend.log`` holds every record logged
    before the call; None when there is nothing to wait for."""
    return CURRENT[-1].mark() if CURRENT else None


def configure(log_file: Path) -> Log:
    """Route structlog to stderr and ``log_file``; returns the `Log` (close it at exit).

    The file is opened without following a link and kept mode 0600 whatever the umask.
    """
    fd = open_private(log_file, os.O_WRONLY | os.O_APPEND)
    stream = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
    log = Log(LineWriter(sys.stderr, "stderr"), LineWriter(stream, "file"))
    CURRENT[:] = [log]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(default=str),
        ],
        logger_factory=structlog.WriteLoggerFactory(log),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    return log
