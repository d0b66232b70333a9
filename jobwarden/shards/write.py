"""A member's shard file written in one pass: each chunk checksummed and written together.

The container (docs/checkpoint-format.md) holds the checksum in its header, ahead of the
data it covers, so `jobwarden.checkpoint.format.encode` reads every byte once for the
checksum and the write reads it again.  The header's length does not depend on the
checksum (xxh3-128 has a fixed-length text), so here the data goes to its final offset
chunk by chunk, each chunk checksummed while it is still in cache, and the header is
written at offset 0 last.  After each chunk the kernel is asked to start writing it back
(``sync_file_range(SYNC_FILE_RANGE_WRITE)`` on Linux) so the disk works while the next
one is copied, and the closing fsync has less left to wait for.  That is a hint only:
durability is, as for every commit, the file's fsync, the rename and the directory's fsync.
The bytes are those `format.encode` gives.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from jobwarden.checkpoint import format
from jobwarden.checkpoint.manifest import Manifest
from jobwarden.files import PENDING_SUFFIX, Directory
from jobwarden.hashing import HASH_NAME, Leaves, little_endian

CHUNK = 8 << 20
"""Small enough to be checksummed while in cache, large enough for few system calls."""
SYNC_FILE_RANGE_WRITE = 2


def _writeback() -> Callable[[int, int, int], object]:
    """``sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)``, or nothing where the C
    library has none."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return lambda fd, offset, length: None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return lambda fd, offset, length: call(fd, offset, length, SYNC_FILE_RANGE_WRITE)


start_writeback = _writeback()
"""Start writing back a written range; its result is not checked (a hint)."""


def write_shard_file(
    handle: Directory,
    name: str,
    manifest: Manifest,
    pieces: Leaves,
    before_replace: Callable[[Path], None],
) -> tuple[str, int]:
    """Write ``pieces`` as the container file ``name`` in ``handle`` durably (pending sibling,
    fsync, ``before_replace``, rename, directory fsync); returns its checksum and size."""
    digest = xxhash.xxh3_128(manifest.to_json().encode())
    # The header's length, from a checksum of the same length (its value comes last).
    offset = len(format._header(manifest, f"{HASH_NAME}:{digest.hexdigest()}", None))
    pending = name + PENDING_SUFFIX
    fd = handle.create_exclusive(pending)
    try:
        for _, array in pieces:
            data = little_endian(array).reshape(-1).view(np.uint8).data
            for start in range(0, len(data), CHUNK):
                chunk = data[start : start + CHUNK]
                digest.update(chunk)
                _pwrite_all(fd, chunk, offset)
                start_writeback(fd, offset, len(chunk))
                offset += len(chunk)
        checksum = f"{HASH_NAME}:{digest.hexdigest()}"
        _pwrite_all(fd, memoryview(format._header(manifest, checksum, None)), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        handle.unlink(pending, missing_ok=True)
        raise
    os.close(fd)
    before_replace(handle.path / pending)
    os.replace(pending, name, src_dir_fd=handle.fd, dst_dir_fd=handle.fd)  # replaces a link
    handle.fsync()
    return checksum, offset


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of ``view`` at ``offset``, looping over partial writes."""
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
