"""Raw I/O baselines and cold files for bench/checkpoint.py.

The baselines do what a checkpoint's save and load do, minus the format: a
durable write (pending sibling, fsync, replace, fsync the folder) and a cold
read, either into a buffer allocated for the read as `format.read` allocates
its own (``np.empty``, then ``preadv`` into it), or into one buffer reused
across repeats (the old baseline, kept for reference: it never pays for the
first touch of fresh memory).  `Evictor` makes files cold before a timed read.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from jobwarden.checkpoint.format import READ_CHUNK

WRITE_CHUNK = 1 << 30
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def fsync_dir(directory: Path) -> None:
    """fsync a directory so a rename in it is durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_durable_write(final: Path, data: memoryview) -> None:
    """Write ``data`` to a pending sibling, fsync, replace it into place, fsync the folder."""
    pending = final.with_name(final.name + ".pending")
    fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        position = 0
        while position < len(data):
            position += os.write(fd, data[position : position + WRITE_CHUNK])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(pending, final)
    fsync_dir(final.parent)


def raw_read(path: Path, buffer: bytearray) -> int:
    """Fill ``buffer`` from the start of ``path``; returns the bytes read."""
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        filled = 0
        while filled < len(view):
            count = os.readv(fd, [view[filled:]])
            if count == 0:
                break
            filled += count
    finally:
        os.close(fd)
    if filled != len(view):
        raise RuntimeError(f"{path.name}: read {filled} of {len(view)} bytes")
    return filled


def raw_read_allocating(path: Path, nbytes: int) -> np.ndarray:
    """Read ``nbytes`` from the start of ``path`` into a new array, allocated as a load
    allocates (``np.empty``) and filled with ``preadv`` in `format.read`'s chunks."""
    data = np.empty(nbytes, np.uint8)
    view = memoryview(data)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        filled = 0
        while filled < nbytes:
            count = os.preadv(fd, [view[filled : filled + READ_CHUNK]], filled)
            if count == 0:
                break
            filled += count
    finally:
        os.close(fd)
    if filled != nbytes:
        raise RuntimeError(f"{path.name}: read {filled} of {nbytes} bytes")
    return data


def files_under(path: Path) -> list[Path]:
    """``path`` itself if it is a file, else every file below it."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file())


def tree_bytes(path: Path) -> int:
    """Bytes on disk (apparent size) of a file or a folder of files."""
    return sum(p.stat().st_size for p in files_under(path))


# ---------------------------------------------------------------- cold cache


class Evictor:
    """Drops files from the page cache before a timed read."""

    def __init__(self) -> None:
        self.drop_caches = os.access(DROP_CACHES, os.W_OK)
        self.resident: list[float] = []
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.mmap.restype = ctypes.c_void_p
        self._libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        self._libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]

    @property
    def method(self) -> str:
        """How files are made cold."""
        return "drop_caches+fadvise" if self.drop_caches else "fadvise"

    def evict(self, path: Path) -> None:
        """Make every file at ``path`` cold, and note how much of it stayed cached."""
        files = files_under(path)
        for file in files:
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        if self.drop_caches:
            os.sync()
            try:
                DROP_CACHES.write_text("1\n")
            except OSError:
                self.drop_caches = False
        fraction = self.resident_fraction(files)
        if fraction is not None:
            self.resident.append(fraction)

    def resident_fraction(self, files: Iterable[Path]) -> float | None:
        """Fraction of the files' pages in the page cache (``mincore``), if measurable."""
        page = mmap.PAGESIZE
        resident = total = 0
        for file in files:
            size = file.stat().st_size
            if size == 0:
                continue
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                address = self._libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            finally:
                os.close(fd)
            if address is None or address == ctypes.c_void_p(-1).value:
                return None
            pages = (size + page - 1) // page
            vector = (ctypes.c_ubyte * pages)()
            status = self._libc.mincore(address, size, vector)
            self._libc.munmap(address, size)
            if status != 0:
                return None
            resident += int(np.count_nonzero(np.frombuffer(vector, np.uint8) & 1))
            total += pages
        return resident / total if total else 0.0
