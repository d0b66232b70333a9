"""The daemon's log: structlog JSON lines to stderr and to ``ROOT/wardend.log`` (mode 0600)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import IO

import structlog

from jobwarden.daemon.store.rootcheck import open_private


class Tee:
    """A text stream that writes every line to several streams."""

    def __init__(self, *streams: IO[str]) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        """Write ``text`` to every stream."""
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        """Flush every stream."""
        for stream in self.streams:
            stream.flush()


def configure(log_file: Path) -> IO[str]:
    """Route structlog to stderr and ``log_file``; returns the opened file (close it at exit).

    The file is opened without following a link and kept mode 0600 whatever the umask.
    """
    fd = open_private(log_file, os.O_WRONLY | os.O_APPEND)
    stream = os.fdopen(fd, "a", encoding="utf-8", buffering=1)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(default=str),
        ],
        logger_factory=structlog.PrintLoggerFactory(Tee(sys.stderr, stream)),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    return stream
