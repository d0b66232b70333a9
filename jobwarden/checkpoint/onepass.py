"""The container written in one pass over the leaves' bytes, each piece checksummed as written.

The header holds the checksum of the data after it, so `format.encode` reads
every byte twice: once to checksum, once more when ``write`` copies it into
the page cache.  Here the header's length is known before the checksum (the
checksum and signature texts have fixed lengths), so the data region is
written first, at its final offset, each piece hashed while it is still in
cache, and the header last, at offset 0.  The bytes are exactly those of
`format.encode`; the commit around them (pending file, fsync, rename,
directory fsync) is unchanged, so no reader ever sees the file before its
header is in place.

A large data region goes through ``O_DIRECT`` from two page-aligned buffers
used in turn: each piece is copied once into one (where it is checksummed)
and the device reads it from there, so a commit takes no page cache (no 512
MiB of pages allocated, dirtied and written back, which on a virtual machine
that hands freed memory back to its host costs more CPU than the copy).  One
writer thread writes a piece while the caller copies and checksums the next
into the other buffer, so the device and the CPU work at once.  The writes
are serial and in order: one is written while at most one more waits behind
it, so the writer goes on to the next piece without waiting for the caller
to wake.  ``pwrite``, numpy's copy and the checksum all let go of the GIL,
so neither thread holds up the other; a writer's error is raised in the
caller.  The first and last partial blocks, and the header, are written
through the page cache; the file's fsync covers both.  A file system that
refuses ``O_DIRECT`` (tmpfs, some network and FUSE file systems) gets the
same bytes through the page cache, written from the leaves' own memory, or
from the buffers if it takes the flag and refuses the write.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import mmap
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from jobwarden.checkpoint import signing
from jobwarden.checkpoint.format import Digests, header, payload
from jobwarden.checkpoint.manifest import Manifest
from jobwarden.hashing import HASH_NAME, Leaves

BLOCK = 4096
"""``O_DIRECT`` offsets, lengths and memory are kept multiples of this (any logical block)"""
DIRECT_PIECE = 2 << 20
"""each of the two aligned buffers a direct write copies its pieces into; small enough that
a piece is still in cache when it is checksummed, and that the first copy and the last write,
which nothing overlaps, are short"""
DIRECT_MIN_BYTES = 32 << 20
"""below this the page cache's cost is small and a direct write's wait is not worth it"""
CACHED_PIECE = 1 << 20
"""a buffered piece is checksummed right after ``write`` read it: it fits in cache"""
MAX_GATHERED = 512
"""pieces written by one ``pwritev`` at most (the system's limit is 1,024)"""
PLACEHOLDER_CHECKSUM = f"{HASH_NAME}:{'0' * 32}"
PLACEHOLDER_SIGNATURE = f"{signing.SIGNATURE_NAME}:{'0' * 64}"


def header_size(manifest: Manifest, signed: bool, manifest_text: str | None = None) -> int:
    """The header's length in bytes (the 8-byte prefix included), known before any checksum."""
    signature = PLACEHOLDER_SIGNATURE if signed else None
    return len(header(manifest, PLACEHOLDER_CHECKSUM, signature, manifest_text))


def write(
    fd: int, manifest: Manifest, leaves: Leaves, key: bytes | None = None, direct: bool = True
) -> tuple[int, str]:
    """Write the whole container to the empty file ``fd``; returns its size and checksum.

    ``direct=False`` never tries ``O_DIRECT``.  Leaves ``fd`` without ``O_DIRECT``.
    """
    views = payload(leaves)
    total = sum(len(view) for view in views)
    text = manifest.to_json()
    digests = Digests(text.encode(), key)
    start = header_size(manifest, key is not None, text)
    first = b""
    if direct and total >= DIRECT_MIN_BYTES and _set_direct(fd, True):
        try:
            first = _write_direct(fd, start, views, digests)
        finally:
            _set_direct(fd, False)
    else:
        _write_cached(fd, start, views, digests)
    signature = None if digests.mac is None else signing.signature_text(digests.mac)
    head = header(manifest, digests.checksum_text(), signature, text)
    if len(head) != start:
        raise AssertionError(f"header is {len(head)} bytes, {start} were reserved")
    _pwrite_all(fd, memoryview(head + first), 0)
    return start + total, digests.checksum_text()


def _write_cached(fd: int, offset: int, views: list[memoryview], digests: Digests) -> None:
    """Write ``views`` from their own memory at ``offset``, each piece hashed after its write:
    the small pieces together, one system call for up to `CACHED_PIECE` bytes of them."""
    batch: list[memoryview] = []
    size = 0
    for view in views:
        for at in range(0, len(view), CACHED_PIECE):
            piece = view[at : at + CACHED_PIECE]
            if batch and (size + len(piece) > CACHED_PIECE or len(batch) == MAX_GATHERED):
                offset = _write_hashed(fd, batch, offset, size, digests)
                batch, size = [], 0
            batch.append(piece)
            size += len(piece)
    if batch:
        _write_hashed(fd, batch, offset, size, digests)


def _write_hashed(
    fd: int, views: list[memoryview], offset: int, size: int, digests: Digests
) -> int:
    """Write ``views`` (``size`` bytes together) in order at ``offset``, then feed them to
    ``digests``; returns the end."""
    end = _pwritev_all(fd, views, offset, size)
    for view in views:
        digests.update(view)
    return end


def _pwritev_all(fd: int, views: list[memoryview], offset: int, size: int) -> int:
    """Write ``views`` (``size`` bytes together) in order at ``offset``; returns the end."""
    written = os.pwritev(fd, views, offset) if len(views) > 1 else 0
    if written == size:
        return offset + size
    for view in views:  # one view, or a partial write: finish piece by piece
        if written >= len(view):
            written -= len(view)
            offset += len(view)
            continue
        offset = _pwrite_all(fd, view[written:], offset + written)
        written = 0
    return offset


def _write_direct(fd: int, start: int, views: list[memoryview], digests: Digests) -> bytes:
    """Write the data's block-aligned middle directly and its unaligned end through the cache;
    returns the data's first bytes, up to the first block boundary, for the header's write."""
    source = _Source(views)
    first = bytearray(-start % BLOCK)
    source.fill(memoryview(first))
    digests.update(memoryview(first))
    offset = start + len(first)
    with _aligned() as one, _aligned() as two:
        buffers = (memoryview(one), memoryview(two))
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="direct-write") as writer:
                writes: deque[Future[None]] = deque()  # the piece being written, the next one
                for turn in itertools.count():
                    if len(writes) == 2:
                        writes.popleft().result()  # its buffer is this turn's
                    aligned = buffers[turn % 2]
                    count = source.fill(aligned)
                    if not count:
                        break
                    digests.update(aligned[:count])
                    writes.append(writer.submit(_write_piece, fd, aligned[:count], offset))
                    offset += count
                for write in writes:
                    write.result()
        finally:  # the executor has waited for any write still reading a buffer
            for buffer in buffers:
                buffer.release()
    return bytes(first)


def _aligned() -> mmap.mmap:
    """A page-aligned buffer of ``DIRECT_PIECE`` bytes, its pages faulted in at once
    (one call, not a fault per page on the first copy)."""
    return mmap.mmap(-1, DIRECT_PIECE, flags=mmap.MAP_PRIVATE | mmap.MAP_POPULATE)


def _write_piece(fd: int, piece: memoryview, offset: int) -> None:
    """Write one buffer's piece, its whole blocks directly and a last piece's tail cached, and
    release it: a view left in an error's traceback would keep the buffer from closing."""
    whole = len(piece) - len(piece) % BLOCK
    with piece, piece[:whole] as blocks, piece[whole:] as tail:
        offset = _pwrite_direct(fd, blocks, offset)
        if tail:  # the last piece's tail, past the last block boundary
            _set_direct(fd, False)
            _pwrite_all(fd, tail, offset)


class _Source:
    """The data region's bytes in order, copied out into buffers piece by piece."""

    def __init__(self, views: list[memoryview]) -> None:
        self._views = iter(views)
        self._rest = memoryview(b"")

    def fill(self, target: memoryview) -> int:
        """Copy the next bytes into ``target`` until it is full or none are left; the count."""
        filled = 0
        while filled < len(target):
            if not self._rest:
                following = next(self._views, None)
                if following is None:
                    break
                self._rest = following
                continue
            count = min(len(self._rest), len(target) - filled)
            # numpy's copy lets go of the GIL, so the writer's thread is not kept waiting
            np.frombuffer(target, np.uint8)[filled : filled + count] = np.frombuffer(
                self._rest[:count], np.uint8
            )
            self._rest = self._rest[count:]
            filled += count
        return filled


def _pwrite_direct(fd: int, view: memoryview, offset: int) -> int:
    """Write ``view`` at ``offset`` directly, or through the cache if the file system refuses."""
    try:
        return _pwrite_all(fd, view, offset)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
    _set_direct(fd, False)  # accepted at fcntl, refused at write: the same bytes, cached
    return _pwrite_all(fd, view, offset)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> int:
    """Write all of ``view`` at ``offset``, looping over partial writes; returns the end."""
    position = 0
    while position < len(view):
        position += os.pwrite(fd, view[position:], offset + position)
    return offset + position


def _set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; False if the file system refuses it."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    wanted = flags | os.O_DIRECT if on else flags & ~os.O_DIRECT
    if wanted == flags:
        return on
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, wanted)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        return False
    return True
