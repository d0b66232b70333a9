"""One writer per checkpoint directory: an flock held for the writer's life, plus a generation.

The lock is `flock(2)` on ``DIR/.writer.lock``; the kernel drops it when the
holder dies, so a crashed writer never leaves a stale lock.  Each acquisition
increments the writer generation in ``DIR/writer.json``; checkpoints carry the
generation that wrote them, and one newer than the directory's is refused
(a fencing token).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from jobwarden.errors import WriterLockedError
from jobwarden.files import pid_lock, write_text_atomic

LOCK_NAME = ".writer.lock"
GENERATION_NAME = "writer.json"


@dataclass
class WriterLock:
    """The exclusive writer lock on one checkpoint directory."""

    directory: Path
    fd: int = -1
    generation: int = 0

    def acquire(self) -> WriterLock:
        """Take the lock without waiting and bump the generation.

        Raises `WriterLockedError` naming the holder's pid when another process has it.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, holder = pid_lock(self.directory / LOCK_NAME)
        if fd is None:
            raise WriterLockedError(
                f"checkpoint directory {self.directory} is held by writer pid {holder or '?'}",
                directory=str(self.directory),
                holder_pid=holder,
            )
        self.fd = fd
        self.generation = read_generation(self.directory) + 1
        record = {"generation": self.generation, "pid": os.getpid(), "acquired": time.time()}
        write_text_atomic(self.directory / GENERATION_NAME, json.dumps(record) + "\n")
        return self

    def release(self) -> None:
        """Drop the lock; the kernel also drops it when the process exits."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()


def read_generation(directory: Path) -> int:
    """The directory's current writer generation, 0 when none was ever recorded."""
    try:
        record = json.loads((directory / GENERATION_NAME).read_text())
    except FileNotFoundError:
        return 0
    generation = record.get("generation") if isinstance(record, dict) else None
    if not isinstance(generation, int):
        raise ValueError(f"{directory / GENERATION_NAME} holds no integer generation")
    return generation
