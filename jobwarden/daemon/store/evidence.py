"""Evidence files that survive a full or failing disk.

An attempt's evidence (its events, its exit record, a stack dump) is written
while the root may be out of space (ENOSPC), failing (EIO) or read-only
(EROFS).  Losing some evidence must never cost the daemon its grip on the
attempt: a failed write is counted and logged, the attempt is still followed,
reaped and decided, and writing resumes by itself once the disk takes bytes
again.  What was lost is reported in the attempt's incident.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

import structlog

from jobwarden.files import write_text_atomic

log = structlog.get_logger("wardend.evidence")


def describe(error: OSError) -> str:
    """``ENOSPC (No space left on device)``: the errno name and its text."""
    name = errno.errorcode.get(error.errno or 0, "OSError")
    return f"{name} ({error.strerror or error})"


class EvidenceFile:
    """An append-only evidence file (mode 0600) that counts the bytes it could not keep."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lost_bytes = 0
        self.error: str | None = None
        self._fd: int | None = None
        self._failing = False

    def write(self, data: bytes) -> None:
        """Append ``data``; on an I/O error keep going, counting what was lost."""
        view, position = memoryview(data), 0
        try:
            if self._fd is None:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                self._fd = os.open(self.path, flags, 0o600)
            while position < len(view):
                position += os.write(self._fd, view[position:])
        except OSError as error:
            self.lost_bytes += len(view) - position
            self.error = describe(error)
            if not self._failing:
                log.error("evidence.write_failed", file=str(self.path), error=self.error)
            self._failing = True
            return
        if self._failing:
            log.warning("evidence.write_resumed", file=str(self.path), lost_bytes=self.lost_bytes)
            self._failing = False

    def size(self) -> int:
        """How many bytes the file holds now (0 while it does not exist)."""
        try:
            return os.fstat(self._fd).st_size if self._fd is not None else self.path.stat().st_size
        except OSError:
            return 0

    def close(self) -> None:
        """Close the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_evidence(path: Path) -> BinaryIO:
    """Open an append-only evidence file for a child's output: 0600, never through a link."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    return os.fdopen(os.open(path, flags, 0o600), "ab")


def keep(path: Path, text: str) -> str | None:
    """Write one small evidence file atomically; returns the error instead of raising."""
    try:
        write_text_atomic(path, text)
    except OSError as error:
        described = describe(error)
        log.error("evidence.write_failed", file=str(path), error=described)
        return described
    return None
