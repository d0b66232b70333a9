"""How the step loop commits a state: at once, or in the background (``[run] async_commit``).

Both write the same file the same way (`CheckpointStore.commit`: pending
sibling, fsync, replace, directory fsync), then apply retention, then emit
``checkpoint``; the event always follows durability.  In the background the
training thread only takes the leaves' host copies (`owned`) and hands the
rest to `jobwarden.checkpoint.background.BackgroundCommit`; it waits only
when the previous commit is still in flight, and that wait is the event's
``blocked_s``.  Retention runs after the new file is durable, in the same
thread, so it never deletes the step being written, and keeps the newest
durable one (``keep_checkpoints`` is at least 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from jobwarden.checkpoint.background import BackgroundCommit
from jobwarden.checkpoint.format import Manifest
from jobwarden.checkpoint.store import CheckpointStore
from jobwarden.events import Emitter
from jobwarden.hashing import Leaves

Hook = Callable[[Path], None] | None


def owned(leaves: Leaves) -> Leaves:
    """Leaves a background write may read while the program trains on.

    A read-only host view is of an immutable JAX buffer (and JAX refuses to
    donate a buffer a view still holds), so it is kept as is; a writable array
    is the program's to change in place, so it is copied now.
    """
    return [(path, array.copy() if array.flags.writeable else array) for path, array in leaves]


class Committer:
    """The commits of one writer: synchronous, or one at a time in the background."""

    def __init__(
        self, store: CheckpointStore, emitter: Emitter, keep: int, background: bool
    ) -> None:
        self.store = store
        self.emitter = emitter
        self.keep = keep
        self.background = BackgroundCommit() if background else None
        self.committed = -1
        """the newest step this run made durable (read on the training thread after `settle`)"""

    def commit(
        self,
        step: int,
        manifest: Manifest,
        leaves: Leaves,
        hook: Hook,
        *,
        report: bool = True,
        now: bool = False,
    ) -> float:
        """Commit ``leaves`` as ``step``; returns the seconds the training thread was held.

        ``now`` (a preemption's last commit): after the one in flight, durable on return.
        """
        began = time.perf_counter()
        if now:
            self.settle()
        if self.background is None or now:
            self._write(step, manifest, leaves, hook, report, began, None)
            return time.perf_counter() - began
        copies = owned(leaves)  # the device-to-host part stays on the training thread
        prepared = time.perf_counter() - began

        def work(waited: float) -> None:
            blocked = prepared + waited
            self._write(step, manifest, copies, hook, report, time.perf_counter(), blocked)

        blocked = self.background.submit(work)
        return prepared + blocked

    def settle(self) -> float:
        """Wait for the commit in flight, if any; returns the wait, raises its error."""
        return 0.0 if self.background is None else self.background.wait()

    def _write(  # noqa: PLR0917 - private, called from two places with the same order
        self,
        step: int,
        manifest: Manifest,
        leaves: Leaves,
        hook: Hook,
        report: bool,
        began: float,
        blocked: float | None,
    ) -> None:
        """Write, retain, report; ``blocked`` is None for a commit made on the training thread."""
        path, size = self.store.commit(step, manifest, leaves, hook)
        seconds = time.perf_counter() - began
        self.store.retain(self.keep)
        self.committed = step
        if not report:
            return
        self.emitter.emit(
            "checkpoint",
            step=step,
            file=str(path),
            bytes=size,
            seconds=seconds,
            blocked_s=seconds if blocked is None else blocked,
            background=blocked is not None,
            state_hash=manifest.state_hash,
        )
