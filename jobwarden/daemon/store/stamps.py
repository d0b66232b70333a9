"""When the daemon read each line of an attempt's stdout: the sidecar ``<stdout>.stamps``.

The stdout file (``events.jsonl``, or a plain program's ``output.log``) keeps
every byte the program wrote, unchanged, for people and tools to read.  Beside
it, ``<name>.stamps`` holds one fixed 16-byte record per line the daemon
dispatched: the offset just past the line's newline in the stdout file
(little-endian unsigned 64 bits) and the wall-clock time the daemon handed the
line on (a little-endian double, seconds since the epoch).  It is the daemon's
clock, taken on the loop just before the line's handler runs, so every record
the daemon logs because of a line is stamped after it, and the lines after
it after that record: ``tail`` merges a job's lines with the daemon's own by
these stamps.  The records grow with the offsets, so a reader finds a line's
stamp by bisection without reading the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from jobwarden.daemon.store.evidence import EvidenceFile

STAMP = struct.Struct("<Qd")
"""One record: the line's end offset in the stdout file, and when the daemon read it."""
SUFFIX = ".stamps"
READ_AHEAD = 4096
"""Records read past the first one looked for, at most, per lookup."""


def stamps_path(stdout: Path) -> Path:
    """The sidecar of the stdout file ``stdout``."""
    return stdout.with_name(stdout.name + SUFFIX)


def has_stamps(stdout: Path) -> bool:
    """Whether the stdout file ``stdout`` has its stamps kept beside it."""
    return stamps_path(stdout).exists()


class Stamper:
    """The stamps of one stdout file, gathered per chunk and written in one append."""

    def __init__(self, stdout: EvidenceFile) -> None:
        self.file = EvidenceFile(stamps_path(stdout.path))
        self.pending = bytearray()

    def add(self, end: int, when: float) -> None:
        """The line ending just before offset ``end`` was read at ``when``."""
        self.pending += STAMP.pack(end, when)

    def flush(self) -> None:
        """Append what was gathered (a failing disk costs the stamps, counted, never more)."""
        if self.pending:
            self.file.write(bytes(self.pending))
            self.pending.clear()

    def close(self) -> None:
        """Write what is left and close the file."""
        self.flush()
        self.file.close()


def read_stamps(stdout: Path, ends: Iterable[int]) -> dict[int, float]:
    """The stamps of the lines of ``stdout`` that end at the offsets ``ends``: offset to
    time, for those the sidecar holds (none for a file written before stamps were kept)."""
    wanted = sorted(set(ends))
    if not wanted:
        return {}
    try:
        stream = stamps_path(stdout).open("rb")
    except FileNotFoundError:
        return {}
    found: dict[int, float] = {}
    with stream:
        count = stream.seek(0, 2) // STAMP.size

        def end_at(index: int) -> int:
            stream.seek(index * STAMP.size)
            end: int = STAMP.unpack(stream.read(STAMP.size))[0]
            return end

        low, high = 0, count
        while low < high:  # the first record for an offset at or past the first wanted
            middle = (low + high) // 2
            if end_at(middle) < wanted[0]:
                low = middle + 1
            else:
                high = middle
        stream.seek(low * STAMP.size)
        span = min(count - low, len(wanted) + READ_AHEAD)
        data = stream.read(span * STAMP.size)
    last = wanted[-1]
    for end, when in STAMP.iter_unpack(data[: len(data) - len(data) % STAMP.size]):
        if end > last:
            break
        found[end] = when
    return found
