"""Durable file primitives shared by the checkpoint store, the daemon and the worker.

Atomic commit: write a pending sibling, fsync, ``os.replace``, fsync the
directory.  A reader sees the old complete file or the new complete file,
never a partial one, and once `commit` returns the new file survives a crash
of the machine (as far as the local filesystem honours fsync).  A leftover
``.pending`` file is never a committed file.  And `pid_lock`, the flock that
both the root lock and the writer lock are made of.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

# Larger single writes are split: Linux writes at most about 2 GiB per call.
WRITE_CHUNK = 1 << 30

PENDING_SUFFIX = ".pending"


def pending_path(final: Path) -> Path:
    """The sibling a commit of ``final`` writes before it is replaced into place."""
    return final.with_name(final.name + PENDING_SUFFIX)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so a rename or unlink in it is durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(
    final: Path, buffers: list[memoryview], before_replace: Callable[[Path], None] | None = None
) -> int:
    """Durably write ``buffers`` as ``final``; returns the bytes written.

    ``before_replace`` runs after the pending file is durable and before it is
    selected; the crash-in-commit drill uses it.
    """
    pending = pending_path(final)
    fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        written = write_all(fd, buffers)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        pending.unlink(missing_ok=True)
        raise
    os.close(fd)
    if before_replace is not None:
        before_replace(pending)
    os.replace(pending, final)
    fsync_dir(final.parent)
    return written


def write_text_atomic(final: Path, text: str) -> None:
    """Durably replace a small text file (state records, reason files)."""
    commit(final, [memoryview(text.encode())])


def write_all(fd: int, buffers: list[memoryview]) -> int:
    """Write every buffer to ``fd``, looping over partial writes; returns the byte count."""
    total = 0
    for view in buffers:
        position = 0
        while position < len(view):
            written = os.write(fd, view[position : position + WRITE_CHUNK])
            position += written
        total += len(view)
    return total


def pid_lock(path: Path) -> tuple[int | None, int | None]:
    """Take ``flock(LOCK_EX)`` on ``path`` without waiting and write our pid into it.

    Returns (fd, None) when taken, the caller keeping the fd open for as long
    as it holds the lock; or (None, the holder's pid if readable) when another
    process holds it.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        return None, int(holder) if holder.isdigit() else None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, None
