"""The program's own checkpointer (``checkpoints="external"``): its pending saves at the end.

An asynchronous checkpointer (Orbax's `CheckpointManager`) writes on a thread of
its own.  A run that ends (a ``fail_after`` drill, a preemption, an error, the
last update) while a save is in flight would leave the interpreter to shut down
under it: the save is abandoned half written (Orbax: "cannot schedule new futures
after interpreter shutdown", a ``*.orbax-checkpoint-tmp*`` folder left).  A
checkpointer given to `jobwarden.sdk.run.Run.checkpointer` is waited for
whenever the run stops; what an unregistered one left half written in the
checkpoint directory is named on stderr when the run is left.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobwarden.errors import WorkerInternalError

UNFINISHED_MARKS = (".orbax-checkpoint-tmp",)
"""What a checkpointer's unfinished save is named by (Orbax's temporary folders)."""


class PendingSaves:
    """The waits of the program's own checkpointers, called before the run stops."""

    def __init__(self) -> None:
        self._waits: list[Callable[[], Any]] = []

    def add(self, checkpointer: Any) -> None:
        """Wait for ``checkpointer`` from now on: its ``wait_until_finished()``, or itself
        if it is a callable; anything else is refused (`WorkerInternalError`)."""
        wait = getattr(checkpointer, "wait_until_finished", None)
        if wait is None and callable(checkpointer):
            wait = checkpointer
        if not callable(wait):
            raise WorkerInternalError(
                f"run.checkpointer() takes an object with wait_until_finished() (Orbax's "
                f"CheckpointManager) or a function that waits; got {type(checkpointer).__name__}"
            )
        self._waits.append(wait)

    def wait(self) -> None:
        """Wait for every registered checkpointer's save in flight, in registration order."""
        for wait in self._waits:
            wait()


def unfinished(directory: Path | None) -> list[Path]:
    """The unfinished saves a checkpointer left in ``directory`` (none if it is absent)."""
    if directory is None or not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if any(m in p.name for m in UNFINISHED_MARKS)]
    return sorted(found)


def unfinished_warning(directory: Path | None) -> str:
    """The stderr text naming the unfinished saves in ``directory``, or "" if there are none."""
    found = unfinished(directory)
    if not found:
        return ""
    names = ", ".join(p.name for p in found[:5]) + (" ..." if len(found) > 5 else "")
    return (
        f"jobwarden: the run ends with {len(found)} unfinished save(s) of the program's own "
        f"checkpointer in {directory}: {names}. A save in flight at exit is abandoned; "
        "give the checkpointer to run.checkpointer(manager), or leave its `with` block "
        "before the run ends, so that the run waits for it\n"
    )
