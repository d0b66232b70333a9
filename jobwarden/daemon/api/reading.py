"""Reading a line file another process appends to: from its end backwards, or on from an offset.

A file is read backwards from its end in blocks (`last_lines`) until enough
lines are found or a byte budget is spent, so the answer costs the lines
asked for, not the file.  Only complete lines are given (a line still being
written waits for its newline), each with the offset just past its newline:
where a follow-up reads on, and how a line's stamp is found
(`jobwarden.daemon.store.stamps`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

BLOCK = 64 << 10
SCAN_BYTES = 64 << 20
"""How far back from the end a tail looks at most, per file."""
FORWARD_BYTES = 4 << 20
"""How much a follow-up request reads on from its cursor, per file."""

Line = tuple[bytes, int]
"""A line without its newline, and the offset just past that newline."""


def complete_end(stream: IO[bytes], size: int) -> int:
    """The offset just past the last newline of a file of ``size`` bytes (0 if none)."""
    pos = size
    while pos > 0 and size - pos < SCAN_BYTES:
        start = max(0, pos - BLOCK)
        stream.seek(start)
        block = stream.read(pos - start)
        found = block.rfind(b"\n")
        if found >= 0:
            return start + found + 1
        pos = start
    return 0


def reverse_lines(stream: IO[bytes], end: int) -> Iterator[bytes]:
    """The complete lines before ``end``, newest first, within `SCAN_BYTES` of it."""
    pos, head = end, b""
    while pos > 0 and end - pos < SCAN_BYTES:
        start = max(0, pos - BLOCK)
        stream.seek(start)
        lines = (stream.read(pos - start) + head).split(b"\n")
        head = lines.pop(0)  # the start of a line whose beginning is further back
        pos = start
        yield from reversed(lines)
    if pos == 0 and head:
        yield head


def last_lines(
    path: Path, count: int, keep: Callable[[bytes], bool] = bool
) -> tuple[list[Line], int]:
    """The last ``count`` complete lines of ``path`` that ``keep`` accepts, oldest first, and
    the offset after them (where a follow-up reads on); nothing for a missing file."""
    try:
        stream = path.open("rb")
    except FileNotFoundError:
        return [], 0
    with stream:
        end = complete_end(stream, stream.seek(0, 2))
        found: list[Line] = []
        stop = end  # where the line being looked at ends, before its newline
        for line in reverse_lines(stream, end):
            if len(found) >= count:
                break
            if line.strip() and keep(line):
                found.append((line, stop + 1))
            stop -= len(line) + 1
    return found[::-1], end


def lines_from(path: Path, offset: int) -> tuple[list[Line], int]:
    """The complete lines of ``path`` from ``offset`` on (up to `FORWARD_BYTES`) and the
    offset after them; a file shorter than ``offset`` (replaced) is read from its start."""
    try:
        stream = path.open("rb")
    except FileNotFoundError:
        return [], offset
    with stream:
        if stream.seek(0, 2) < offset:
            offset = 0
        stream.seek(offset)
        data = stream.read(FORWARD_BYTES)
    found: list[Line] = []
    at = offset
    for line in data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]:
        at += len(line) + 1
        if line.strip():
            found.append((line, at))
    return found, at
