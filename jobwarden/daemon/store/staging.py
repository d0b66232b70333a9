"""New files made durable together: every one written before any is waited for.

`write_new_files` is how intake makes a staging folder's files (the request,
``job.json``, ``state.json``) durable before the folder is renamed into place.
Each file is written and its writeback started (``sync_file_range`` with
``SYNC_FILE_RANGE_WRITE`` on Linux, a hint that waits for nothing), then the
folder is fsynced, then each file.  Every file and the folder are fsynced
before it returns, as when each file was fsynced as soon as it was written;
only the order of the waits differs.  On ext4 that order is what counts: a
fsync of a file writes its data and commits the journal transaction its
blocks were allocated in, and a fsync of a directory always commits the
running transaction.  Written and fsynced one after the other, the three
files cost three commits before the folder's own; with their writeback
started first their blocks share one transaction, the folder's fsync commits
it, and the files' fsyncs find their data written and their transaction
committed (each still flushes the disk's cache).  Each commit also waits for
whatever other processes' writes that transaction holds, which is where a
busy disk's tail comes from.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from jobwarden.files import CREATE_FLAGS, FILE_MODE, fsync_dir, write_all

SYNC_FILE_RANGE_WRITE = 2


def _writeback() -> Callable[[int], object]:
    """``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)``, or nothing where the C library
    has no such call."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return lambda fd: None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return lambda fd: call(fd, 0, 0, SYNC_FILE_RANGE_WRITE)


start_writeback = _writeback()
"""Start writing a descriptor's dirty pages out, without waiting; a hint whose failure
changes nothing (the fsync that follows is what makes them durable)."""


def write_new_files(folder: Path, files: Mapping[str, bytes]) -> None:
    """Create each of ``files`` (name: bytes) in ``folder`` and make them and their names
    durable: written, writeback started, the folder fsynced, then each file.

    Raises OSError (FileExistsError for a name taken already); what was created is left
    for the caller to discard.
    """
    with contextlib.ExitStack() as opened:
        descriptors = []
        for name, data in files.items():
            fd = os.open(folder / name, CREATE_FLAGS, FILE_MODE)
            opened.callback(os.close, fd)
            write_all(fd, [memoryview(data)])
            start_writeback(fd)
            descriptors.append(fd)
        fsync_dir(folder)
        for fd in descriptors:
            os.fsync(fd)
