"""Seeing requests arrive: the watchdog (inotify) watch on the spool, and the rescan's list.

The watch's callback only hands a path to the daemon's loop (`Spool` takes
it from there); the rescan, at start and at a slow interval, lists what the
watch missed (inotify overflow, a file renamed in from outside the spool)
and the claimed leftovers of a crash.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from jobwarden.daemon.store.layout import Root

log = structlog.get_logger("wardend.spool")
RESCAN_SETTLE_S = 1.0


class SpoolHandler(FileSystemEventHandler):
    """watchdog callbacks: hand paths to the loop, nothing else (an exception here kills the
    observer thread)."""

    def __init__(self, incoming: Path, enqueue: Callable[[Path], None]) -> None:
        self.incoming = incoming
        self.enqueue = enqueue

    def on_moved(self, event: FileSystemEvent) -> None:
        """A file renamed into incoming."""
        self._hand_over(event.dest_path)

    def on_closed(self, event: FileSystemEvent) -> None:
        """A file closed after writing directly in incoming."""
        self._hand_over(event.src_path)

    def _hand_over(self, raw: str | bytes) -> None:
        try:
            path = Path(os.fsdecode(raw))
            if path.parent == self.incoming:
                self.enqueue(path)
        except Exception as error:  # the rescan catches what is missed here
            log.error("spool.watch_failed", error=repr(error), exc_info=error)


def watch(root: Root, enqueue: Callable[[Path], None]) -> Any:
    """Start a watchdog observer on the whole spool; returns it (call ``.stop()``).

    The whole spool is watched, not only ``incoming``, so that every rename the
    spool sees (tmp -> incoming by writers, incoming -> claimed -> rejected by
    the daemon) has both halves inside the watch.  watchdog holds a rename
    whose other half it never sees for half a second to pair it, and every
    later event waits behind it; accepted requests therefore leave the spool
    by unlink (their job folder holds the daemon's copy), not by rename.  A
    file renamed in from outside the spool is only an unpaired "created"
    event, indistinguishable from a file still being written: the rescan
    picks it up.
    """
    observer = Observer()
    observer.schedule(
        SpoolHandler(root.incoming, enqueue), str(root.incoming.parent), recursive=True
    )
    observer.daemon = True
    observer.start()
    return observer


def pending_requests(root: Root, settle_s: float = RESCAN_SETTLE_S) -> list[Path]:
    """Requests waiting in incoming and leftovers in claimed, oldest first.

    A file in incoming modified less than ``settle_s`` ago is left for its
    watch event or the next scan: it may still be being written by a writer
    that ignores the tmp-then-rename discipline.  A file gone while listed is
    skipped.
    """
    found = []
    now = time.time_ns()
    for folder in (root.claimed, root.incoming):
        for entry in os.scandir(folder):
            if entry.name.startswith("."):
                continue
            try:
                mtime = entry.stat(follow_symlinks=False).st_mtime_ns
            except OSError:
                continue
            if folder == root.incoming and now - mtime < settle_s * 1e9:
                continue
            found.append((mtime, Path(entry.path)))
    return [path for _, path in sorted(found)]
