"""Optional keyed signatures: HMAC-SHA256 over a checkpoint's manifest text and data region.

The checksum (xxh3-128 over the same bytes) detects accidents: a torn write,
a flipped bit.  Anyone can recompute it, so it proves nothing about who wrote
the file.  The signature detects tampering: only a holder of the key can make
it.  It is computed in the same pass over the bytes as the checksum, chunk by
chunk while each chunk is in cache, and stored beside it in ``__metadata__``.

The key is a file's bytes, exactly as stored (at least `MIN_KEY_BYTES`; 32
random bytes are right).  The file must be a regular file, not a link, owned by
the user that runs the worker, with no group or other permission (0600 or 0400).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import stat
from pathlib import Path
from typing import Any

from jobwarden.files import READ_FLAGS, UnsafePathError, kind_of

SIGNATURE_NAME = "hmac-sha256"
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 4096


class UnsafeSigningKey(UnsafePathError):
    """Raised when the signing key file is a link, not a regular file, not ours,
    readable or writable by group or others, or too short; names path, owner and mode."""

    code = "worker.signing_key_unsafe"
    exit_status = 6


def load_key(path: Path) -> bytes:
    """The signing key held in ``path``; raises `UnsafeSigningKey` unless the file is private."""
    shown = str(path)
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as failure:
        reason = (
            "is a symbolic link; the key must be a regular file"
            if failure.errno == errno.ELOOP
            else f"cannot be opened: {failure.strerror}"
        )
        raise UnsafeSigningKey(shown, reason) from failure
    try:
        info = os.fstat(fd)
        facts: dict[str, Any] = {
            "found": kind_of(info.st_mode),
            "owner": info.st_uid,
            "mode": f"{stat.S_IMODE(info.st_mode):04o}",
            "expected": f"a regular file owned by uid {os.getuid()}, mode 0600 or stricter",
        }
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeSigningKey(shown, f"is a {facts['found']}, not a regular file", **facts)
        if info.st_uid != os.getuid():
            raise UnsafeSigningKey(
                shown, f"is owned by uid {info.st_uid}, not by uid {os.getuid()}", **facts
            )
        if info.st_mode & 0o077:
            raise UnsafeSigningKey(
                shown, f"has mode {facts['mode']}; expected 0600 or stricter", **facts
            )
        key = os.pread(fd, MAX_KEY_BYTES + 1, 0)
    finally:
        os.close(fd)
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise UnsafeSigningKey(
            shown,
            f"holds {len(key)} bytes; a key has {MIN_KEY_BYTES} to {MAX_KEY_BYTES}",
            **facts,
        )
    return key


def new_mac(key: bytes, manifest_text: bytes) -> hmac.HMAC:
    """A running HMAC-SHA256 that has seen the manifest text; feed it the data region next."""
    return hmac.new(key, manifest_text, hashlib.sha256)


def signature_text(mac: hmac.HMAC) -> str:
    """The stored form, ``hmac-sha256:<hex>``."""
    return f"{SIGNATURE_NAME}:{mac.hexdigest()}"


def matches(stored: str, mac: hmac.HMAC) -> bool:
    """Whether ``stored`` is the signature ``mac`` computed, compared in constant time."""
    return hmac.compare_digest(stored.encode(), signature_text(mac).encode())
