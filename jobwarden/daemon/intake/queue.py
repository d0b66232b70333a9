"""Taking requests in without stalling the loop: one intake thread, outcomes applied in batches.

Claiming, validating and the fsyncs that make a job folder or a rejection
durable (`Spool.take`) run in one dedicated thread, so requests are taken one
at a time, in order, and the loop stays free to answer the control socket and
ping the watchdog however full the spool is.  The loop hands that thread at
most `BATCH` paths at once, then the next batch once it returns; the thread
hands each outcome back to the loop as soon as it is durable, and the loop
applies it (``admit``: register the job, queue it) in its turn, so a request
never waits for the later ones of its batch.  A rescan lists the spool in the
thread too, once the paths already queued are taken.

Nothing a request does escapes this module: a failure in one file is logged
and that file is left in the spool for the next scan; the others go on.  A
failure for want of the system's resources (descriptors, memory, space:
`short_of_resources`) is the system's, not the request's: the file is
never rejected for it, only left where it is (``spool/incoming`` or
``spool/claimed``) for the next rescan, which lists both; an inotify event
missed meanwhile is covered by the same rescan.  Such failures are logged once
per episode (``spool.short_of_resources``, then ``spool.resources_back`` with
how many takes and scans were put off).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from jobwarden.daemon.intake import spool
from jobwarden.daemon.store.evidence import describe
from jobwarden.jobfile import Job

log = structlog.get_logger("wardend.intake")

BATCH = 16
"""Paths handed to the intake thread at once (a rescan's listing waits for them); each
outcome is applied as soon as it is durable."""

RESOURCE_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.ENOSPC, errno.EDQUOT}
)
"""What the system is short of (descriptors, memory, space), whatever the request holds."""


def short_of_resources(error: BaseException) -> bool:
    """Whether ``error`` says the system is short of something, not that a file is wrong."""
    return isinstance(error, OSError) and error.errno in RESOURCE_ERRNOS


@dataclass(frozen=True)
class Kept:
    """A request left in the spool (``name``, in incoming or claimed) for the next scan,
    because taking it failed for want of resources (``problem``)."""

    name: str
    problem: str


Taken = Job | spool.Rejection | Kept | None
"""A request's outcome: a durable job, a durable rejection, a request kept in the spool for
the next scan, or nothing to do."""

Batch = dict[Path, list["asyncio.Future[Taken]"]]
"""The paths handed to the intake thread at once, each with the futures waiting for it."""


class Intake:
    """The daemon's queue of request files and the thread that takes them in."""

    def __init__(self, requests: spool.Spool, admit: Callable[[Job | spool.Rejection], None]):
        self.spool = requests
        self.admit = admit
        self.pending: Batch = {}
        self.scan_wanted = False
        self.closed = False
        self.put_off = 0
        """Takes and scans put off for want of resources in the episode under way (0: none)."""
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wardend-intake")
        self._task: asyncio.Task[None] | None = None

    def put(self, path: Path) -> asyncio.Future[Taken]:
        """Queue ``path`` (on the loop); the future holds its outcome once it is durable."""
        future: asyncio.Future[Taken] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_result(None)
            return future
        self.pending.setdefault(path, []).append(future)
        self._wake()
        return future

    def rescan(self) -> None:
        """List the spool (in the thread) once the queued paths are taken, and queue it all."""
        if not self.closed:
            self.scan_wanted = True
            self._wake()

    async def submit(self, name: str, data: bytes) -> Taken:
        """Drop a request into the spool as a writer would, and take it in ahead of the queue.

        Raises OSError when the drop itself fails (nothing is left in spool/tmp); a take
        put off for want of resources is `Kept`.
        """
        if self.closed:
            return None
        loop = asyncio.get_running_loop()
        try:
            taken = await loop.run_in_executor(self.executor, self._drop_and_take, name, data)
        except asyncio.CancelledError:
            if self.closed:
                return None
            raise
        self._apply(taken)
        return taken

    async def close(self) -> None:
        """Take nothing more: pending outcomes are None (the files stay in the spool)."""
        self.closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for futures in self.pending.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)
        self.pending.clear()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _wake(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.closed:
                if not self.pending and self.scan_wanted:
                    self.scan_wanted = False
                    for path in await loop.run_in_executor(self.executor, self._scan):
                        self.pending.setdefault(path, [])
                if not self.pending:
                    return
                paths = list(itertools.islice(self.pending, BATCH))
                batch = {path: self.pending.pop(path) for path in paths}
                hand_back = functools.partial(self._hand_back, loop, batch)
                try:
                    await loop.run_in_executor(self.executor, self._take_all, paths, hand_back)
                finally:  # what the thread did not hand back (the daemon is closing): None
                    for path in list(batch):
                        self._settle(batch, path, None)
        except RuntimeError:  # the executor is shut down: the daemon is closing
            if not self.closed:
                raise
        finally:
            self._task = None

    def _settle(self, batch: Batch, path: Path, taken: Taken) -> None:
        """On the loop: ``path``'s outcome applied (unless intake has closed) and its futures
        resolved, once; it leaves ``batch``."""
        futures = batch.pop(path, None)
        if futures is None:
            return
        if not self.closed:
            self._apply(taken)
        for future in futures:
            if not future.done():
                future.set_result(taken)

    def _apply(self, taken: Taken) -> None:
        if taken is None or isinstance(taken, Kept):
            return
        try:
            self.admit(taken)
        except Exception as error:  # the job is durable: the next start will load it
            log.error("intake.admit_failed", outcome=repr(taken), exc_info=error)

    # ---- in the intake thread

    def _scan(self) -> list[Path]:
        try:
            found = spool.pending_requests(self.spool.root)
        except Exception as error:  # the next scan tries again
            if not self._short(error, "scan"):
                log.error("spool.scan_failed", exc_info=error)
            return []
        self._recovered()
        return found

    def _take_all(self, paths: list[Path], hand_back: Callable[[Path, Taken], None]) -> None:
        for path in paths:
            hand_back(path, self._take(path))

    def _hand_back(
        self, loop: asyncio.AbstractEventLoop, batch: Batch, path: Path, taken: Taken
    ) -> None:
        """``path``'s outcome, durable now, to be settled on the loop without waiting for the
        rest of its batch."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: the daemon is gone
            loop.call_soon_threadsafe(self._settle, batch, path, taken)

    def _take(self, path: Path) -> Taken:
        try:
            taken = self.spool.take(path)
        except OSError as error:  # left in the spool; the next scan tries again
            if self._short(error, spool.printable(str(path))):
                return Kept(path.name, describe(error))
            log.error("spool.error", file=spool.printable(str(path)), error=repr(error))
        except Exception as error:
            log.error("spool.failed", file=spool.printable(str(path)), exc_info=error)
        else:
            self._recovered()
            return taken
        return None

    def _short(self, error: BaseException, what: str) -> bool:
        """Whether ``error`` is a want of resources; the first of an episode is logged."""
        if not isinstance(error, OSError) or not short_of_resources(error):
            return False
        if not self.put_off:
            log.warning(
                "spool.short_of_resources",
                error=describe(error),
                first=what,
                retry="at the next rescan; requests stay in the spool",
            )
        self.put_off += 1
        return True

    def _recovered(self) -> None:
        if self.put_off:
            log.info("spool.resources_back", put_off=self.put_off)
            self.put_off = 0

    def _drop_and_take(self, name: str, data: bytes) -> Taken:
        return self._take(spool.drop(self.spool.root, name, data))
