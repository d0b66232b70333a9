"""A member's shard file written durably in one pass over its bytes (`checkpoint.onepass`).

The same container, and the same one-pass writer, as a single-file checkpoint: each piece
checksummed as it is written, the header last, a large shard through ``O_DIRECT``.  Then
the commit every file gets: fsync, the fence (``before_replace``), the rename, the
directory's fsync.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from jobwarden.checkpoint import onepass
from jobwarden.checkpoint.manifest import Manifest
from jobwarden.files import PENDING_SUFFIX, Directory
from jobwarden.hashing import Leaves


def write_shard_file(
    handle: Directory,
    name: str,
    manifest: Manifest,
    pieces: Leaves,
    before_replace: Callable[[Path], None],
) -> tuple[str, int]:
    """Write ``pieces`` as the container file ``name`` in ``handle`` durably (pending sibling,
    fsync, ``before_replace``, rename, directory fsync); returns its checksum and size."""
    pending = name + PENDING_SUFFIX
    fd = handle.create_exclusive(pending)
    try:
        size, checksum = onepass.write(fd, manifest, pieces)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        handle.unlink(pending, missing_ok=True)
        raise
    os.close(fd)
    before_replace(handle.path / pending)
    os.replace(pending, name, src_dir_fd=handle.fd, dst_dir_fd=handle.fd)  # replaces a link
    handle.fsync()
    return checksum, size
