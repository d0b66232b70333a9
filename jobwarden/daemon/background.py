"""Work the loop starts and does not wait for, and blocking work sent off the loop.

`Background` is the one keeper of fire-and-forget tasks in the daemon: it
holds a reference to each task until it ends (asyncio keeps only a weak one,
so an unreferenced task may vanish mid-flight), and it logs the exception of
every task that fails instead of dropping it.  `off_loop` is the one way to
run a blocking call (file reads, a checkpoint's verification) in the default
thread pool; the intake keeps its own single thread on purpose (requests are
taken in one at a time, in order: `intake.queue`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import structlog

T = TypeVar("T")


class Background:
    """Tasks started for their effect; each failure is logged under ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tasks: set[asyncio.Future[Any]] = set()
        self._log = structlog.get_logger(name)

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start ``work`` on the running loop and keep it until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Future[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._log.error(f"{self.name}.task_failed", error=repr(error), exc_info=error)

    def cancel(self) -> None:
        """Cancel every task still running (the loop may already be closed)."""
        for task in list(self.tasks):
            with contextlib.suppress(RuntimeError):  # its loop has closed
                task.cancel()

    async def cancel_and_wait(self) -> None:
        """Cancel every task but the caller's own, and wait until they have ended."""
        current = asyncio.current_task()
        others = [t for t in self.tasks if t is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)


def off_loop(function: Callable[..., T], *args: Any) -> Awaitable[T]:
    """Run a blocking ``function(*args)`` in the default thread pool, awaitable on the loop."""
    return asyncio.to_thread(function, *args)
