"""The children the daemon started itself, so that none is taken for an orphan.

The daemon is a child subreaper (`launch.reaper`): orphaned descendants of its
attempts become its children, and it reaps those that have ended.  Its own
children (workers, spares, notification hooks, Slurm commands) each have a
waiter of their own (asyncio's child watcher, ``Popen.wait``); reaping one of
those first would make that waiter see ECHILD and report status 255 (or 0, for
``Popen``).  So each is started within `Children.starting` and stays in
`Children.own` from then until its waiter has reaped it: a zombie child not in
it, while no start is under way, can only be an orphan.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


class Children:
    """The daemon's own children not yet reaped by their waiter, and the starts under way."""

    def __init__(self) -> None:
        self.own: set[int] = set()
        self.lock = threading.Lock()
        self.starts = 0

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Around one start (a fork whose pid is not known yet): the child is to be `add`-ed
        or `follow`-ed within it."""
        with self.lock:
            self.starts += 1
        try:
            yield
        finally:
            with self.lock:
                self.starts -= 1

    @property
    def settled(self) -> bool:
        """Whether no start is under way: then every own child is in `own`."""
        return self.starts == 0

    def add(self, pid: int) -> None:
        """Count ``pid`` among the daemon's own children until `discard`."""
        with self.lock:
            self.own.add(pid)

    def discard(self, pid: int) -> None:
        """``pid`` has been reaped by its waiter."""
        with self.lock:
            self.own.discard(pid)

    def follow(self, proc: asyncio.subprocess.Process) -> None:
        """Count ``proc`` among the daemon's own children until ``proc.wait()`` returns."""
        self.add(proc.pid)
        waited = asyncio.ensure_future(proc.wait())
        waited.add_done_callback(lambda _: self.discard(proc.pid))


CHILDREN = Children()
"""The one registry of the daemon process."""
