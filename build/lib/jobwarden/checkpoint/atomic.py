"""Atomic, durable file commit: pending sibling, fsync, replace, fsync the directory.

A reader sees the old complete file or the new complete file, never a partial
one, and once `commit` returns the new file survives a crash of the machine
(as far as the local filesystem honours fsync).  A leftover ``.pending`` file
is never a committed file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from jobwarden.checkpoint.format import write_all

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
