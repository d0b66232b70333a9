"""A commit in the background: at most one in flight, its wait measured, its error kept.

The training thread hands `BackgroundCommit.submit` the work of one commit
(write, fsync, replace, directory fsync, retention, the ``checkpoint`` event);
it runs on a thread of its own while the next updates run.  A second submit
first waits for the one in flight, and says how long it waited.  The files
are the same as a synchronous commit's: until the replace, the previous
committed checkpoint is the newest one, so a crash at any instant leaves it
usable.  An error of the background commit is raised on the training thread
at the next `submit` or `wait`, never lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class BackgroundCommit:
    """One background commit thread at a time, for one writer."""

    def __init__(self, name: str = "jobwarden-commit") -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.waited_s = 0.0
        """the total time the training thread waited for a commit in flight"""

    @property
    def in_flight(self) -> bool:
        """Whether a commit is still being written."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, work: Callable[[float], None]) -> float:
        """Run ``work(blocked_s)`` in the background once the commit in flight is done.

        Returns ``blocked_s``, the seconds the caller waited for that commit; raises
        what the previous commit raised.
        """
        blocked = self.wait()
        thread = threading.Thread(target=self._run, args=(work, blocked), name=self.name)
        thread.daemon = True  # a crash or an os._exit must not wait for it
        self._thread = thread
        thread.start()
        return blocked

    def wait(self) -> float:
        """Wait for the commit in flight (if any); returns the seconds waited.

        Raises the commit's error, once.
        """
        began = time.perf_counter()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        waited = time.perf_counter() - began if thread is not None else 0.0
        self.waited_s += waited
        error, self._error = self._error, None
        if error is not None:
            raise error
        return waited

    def _run(self, work: Callable[[float], None], blocked: float) -> None:
        try:
            work(blocked)
        except BaseException as error:  # noqa: BLE001 - handed to the training thread, raised there
            self._error = error
