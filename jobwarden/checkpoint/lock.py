"""One writer per checkpoint directory: an flock held for the writer's life, plus a generation.

The lock is `flock(2)` on the checkpoint directory itself, through a
descriptor opened ``O_DIRECTORY | O_NOFOLLOW``: it belongs to the directory's
inode, so deleting or replacing any file inside cannot admit a second writer,
and the kernel drops it when the holder dies, so a crashed writer never leaves
a stale lock.  ``DIR/.writer.lock`` only records the holder's pid, for the
refusal message.  Each acquisition increments the writer generation in
``DIR/writer.json``.  Before every commit the writer checks (`WriterLock.check`)
that its path still names the directory it locked and that ``writer.json``
still names its generation; a checkpoint records the generation that wrote it,
and one newer than the directory's is refused on restore (a fencing token).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from jobwarden.checkpoint import lease
from jobwarden.checkpoint.errors import UnsafeCheckpointDirectory, WriterFenced, WriterLockLost
from jobwarden.errors import WriterLockedError
from jobwarden.files import Directory

LOCK_NAME = ".writer.lock"
GENERATION_NAME = "writer.json"


def open_directory(path: Path, create: bool = False) -> Directory:
    """Open a checkpoint directory for writing; refuses one that is a link, not ours, or
    writable by others (`UnsafeCheckpointDirectory`).  ``create`` makes it mode 0700."""
    return Directory.open(path, create=create, private=True, error=UnsafeCheckpointDirectory)


@dataclass
class WriterLock:
    """The exclusive writer lock on one checkpoint directory.

    ``handle`` is the open directory the lock is held on; the store writes
    through it, so every commit lands in the directory that was locked.
    """

    directory: Path
    fd: int = -1
    generation: int = 0
    handle: Directory | None = None
    leased: bool = False
    """Whether this writer also holds `lease` (under Slurm: flock may be node-local)."""

    def acquire(self) -> WriterLock:
        """Take the lock without waiting and bump the generation.

        Raises `WriterLockedError` naming the holder's pid when another process
        has it, `UnsafeCheckpointDirectory` when the directory is unsafe.
        Nothing is written unless the lock is taken.
        """
        handle = open_directory(self.directory, create=True)
        try:
            if not handle.try_lock():
                holder = _holder_pid(handle)
                raise WriterLockedError(
                    f"checkpoint directory {self.directory} is held by writer pid {holder or '?'}",
                    directory=str(self.directory),
                    holder_pid=holder,
                )
            handle.write_atomic(LOCK_NAME, f"{os.getpid()}\n".encode())
            generation = read_generation(handle) + 1
            record = {"generation": generation, "pid": os.getpid(), "acquired": time.time()}
            handle.write_atomic(GENERATION_NAME, (json.dumps(record) + "\n").encode())
            if lease.wanted(os.environ):
                lease.take(self.directory, generation, os.environ.get(lease.SLURM_JOB_ENV))
                self.leased = True
        except BaseException:
            handle.close()
            raise
        self.handle, self.fd, self.generation = handle, handle.fd, generation
        return self

    def check(self) -> None:
        """Refuse to commit unless this writer still holds the directory and its generation.

        Raises `WriterLockLost` when the path no longer names the locked
        directory, `WriterFenced` when ``writer.json`` names another generation.
        """
        handle = self.handle
        if handle is None or not handle.still_at_path():
            raise WriterLockLost(
                f"checkpoint directory {self.directory} is no longer the directory this writer "
                "locked (moved, replaced or deleted); refusing to commit",
                directory=str(self.directory),
                generation=self.generation,
                locked_inode=None if handle is None else os.fstat(handle.fd).st_ino,
                found_inode=_inode_at(self.directory),
            )
        try:
            current: int | None = read_generation(handle)
        except (OSError, ValueError):
            current = None
        if current != self.generation:
            raise WriterFenced(
                f"{self.directory / GENERATION_NAME} names writer generation {current}, "
                f"this writer holds {self.generation}: fenced by another writer; "
                "refusing to commit",
                directory=str(self.directory),
                generation=self.generation,
                current_generation=current,
                holder_pid=_recorded_pid(handle),
            )
        if self.leased:
            lease.check(self.directory, self.generation)

    def release(self) -> None:
        """Drop the lock; the kernel also drops it when the process exits."""
        if self.handle is not None:
            self.handle.close()
            self.handle, self.fd = None, -1

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()


def read_generation(directory: Path | Directory) -> int:
    """The directory's current writer generation, 0 when none was ever recorded.

    Read without following a link; raises ValueError for a record without one.
    """
    if isinstance(directory, Path):
        try:
            with Directory.open(directory) as opened:
                return read_generation(opened)
        except FileNotFoundError:
            return 0
    try:
        record = json.loads(directory.read_small(GENERATION_NAME))
    except FileNotFoundError:
        return 0
    generation = record.get("generation") if isinstance(record, dict) else None
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise ValueError(f"{directory.path / GENERATION_NAME} holds no integer generation")
    return generation


def _inode_at(path: Path) -> int | None:
    """The inode now at ``path`` (not followed), None if nothing is."""
    try:
        return os.lstat(path).st_ino
    except OSError:
        return None


def _holder_pid(handle: Directory) -> int | None:
    """The pid the lock holder recorded, if it can be read."""
    try:
        text = handle.read_small(LOCK_NAME, 32).decode(errors="replace").strip()
    except (OSError, UnsafeCheckpointDirectory):
        return None
    return int(text) if text.isdigit() else None


def _recorded_pid(handle: Directory) -> int | None:
    """The pid named in ``writer.json``, if it can be read."""
    try:
        record = json.loads(handle.read_small(GENERATION_NAME))
    except (OSError, ValueError, UnsafeCheckpointDirectory):
        return None
    pid = record.get("pid") if isinstance(record, dict) else None
    return pid if isinstance(pid, int) else None
