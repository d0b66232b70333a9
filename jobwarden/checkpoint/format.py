"""The checkpoint container: one safetensors file per committed step.

Layout (the safetensors format, readable by the reference library):

    8 bytes   little-endian u64: header length N
    N bytes   JSON header, space-padded to a multiple of 8:
              {"__metadata__": {"jobwarden": <manifest JSON>, "checksum": "xxh3-128:<hex>",
                                "signature": "hmac-sha256:<hex>" (only when signed)},
               "<leaf path>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}
    data      raw little-endian bytes of every leaf, in manifest order, no gaps

The manifest (`jobwarden.checkpoint.manifest`) holds the step, the tree
structure, the key implementation, the training fields and the provenance.
The checksum is xxh3-128 over the manifest text followed by the whole data
region: it detects accidental corruption and is not a signature.  The optional
signature (`signing`) is HMAC-SHA256 over the same bytes, made in the same pass.

The header is checked against the file's real size before any data is read or
allocated (`Reader`): the tensor table must describe exactly the manifest's
leaves with contiguous offsets, and the data region must be exactly their size.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from jobwarden.checkpoint import signing
from jobwarden.checkpoint.errors import (
    ChecksumMismatch,
    SignatureMismatch,
    TruncatedCheckpoint,
    UnreadableCheckpoint,
)
from jobwarden.checkpoint.manifest import (
    NUMPY_DTYPES,
    SAFETENSORS_DTYPES,
    SCHEMA_VERSION,
    LeafSpec,
    Manifest,
    Provenance,
    leaf_specs,
)
from jobwarden.decoding import loads_json
from jobwarden.files import READ_FLAGS, Directory, UnsafePathError
from jobwarden.hashing import HASH_NAME, Leaves, little_endian

__all__ = [
    "SCHEMA_VERSION",
    "Checkpoint",
    "LeafSpec",
    "Manifest",
    "Provenance",
    "Reader",
    "encode",
    "leaf_specs",
    "read",
    "read_manifest",
]

MAX_HEADER_BYTES = 64 * 1024 * 1024
READ_CHUNK = 16 << 20
# Both hashes see each piece while it is still in cache.
HASH_CHUNK = 1 << 20
CONTAINER_CHECKS = ("readable", "checksum", "schema")
SIGNED_CHECKS = ("readable", "checksum", "signature", "schema")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back and verified against its checksum (and signature, given a key)."""

    path: Path
    manifest: Manifest
    arrays: Mapping[str, np.ndarray]
    checksum: str
    size: int
    checks: tuple[str, ...] = field(default=CONTAINER_CHECKS)
    signature: str | None = None

    def leaves(self) -> Leaves:
        """The saved leaves in manifest order."""
        return [(leaf.path, self.arrays[leaf.path]) for leaf in self.manifest.leaves]


class Digests:
    """The running checksum, and the running signature when there is a key."""

    def __init__(self, manifest_text: bytes, key: bytes | None) -> None:
        self.checksum = xxhash.xxh3_128(manifest_text)
        self.mac: hmac.HMAC | None = None if key is None else signing.new_mac(key, manifest_text)

    def update(self, view: memoryview) -> None:
        """Feed the next bytes of the data region."""
        if self.mac is None:
            self.checksum.update(view)
            return
        for start in range(0, len(view), HASH_CHUNK):
            piece = view[start : start + HASH_CHUNK]
            self.checksum.update(piece)
            self.mac.update(piece)

    def checksum_text(self) -> str:
        """The checksum as stored in the header."""
        return f"{HASH_NAME}:{self.checksum.hexdigest()}"


def header(
    manifest: Manifest, checksum: str, signature: str | None, manifest_text: str | None = None
) -> bytes:
    """The 8-byte length and the padded JSON header; its length depends on the texts' lengths.
    ``manifest_text`` is ``manifest.to_json()``, when the caller has it already."""
    text_of_manifest = manifest.to_json() if manifest_text is None else manifest_text
    meta = {"jobwarden": text_of_manifest, "checksum": checksum}
    if signature is not None:
        meta["signature"] = signature
    table: dict[str, Any] = {"__metadata__": meta}
    offset = 0
    for leaf in manifest.leaves:
        table[leaf.path] = {
            "dtype": SAFETENSORS_DTYPES[leaf.dtype],
            "shape": list(leaf.shape),
            "data_offsets": [offset, offset + leaf.nbytes],
        }
        offset += leaf.nbytes
    text = json.dumps(table, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def encode(manifest: Manifest, leaves: Leaves, key: bytes | None = None) -> list[memoryview]:
    """The file's bytes as a list of buffers (header, then each leaf without copying), the
    checksum taken in a pass before any write; a commit writes them in one (`onepass`).

    With ``key`` the header also carries the HMAC-SHA256 signature.
    """
    views = payload(leaves)
    digests = Digests(manifest.to_json().encode(), key)
    for view in views:
        digests.update(view)
    signature = None if digests.mac is None else signing.signature_text(digests.mac)
    return [memoryview(header(manifest, digests.checksum_text(), signature)), *views]


def payload(leaves: Leaves) -> list[memoryview]:
    """Each leaf's little-endian bytes, a view of its own memory where it already is."""
    return [little_endian(array).reshape(-1).view(np.uint8).data for _, array in leaves]


@dataclass
class Reader:
    """An open checkpoint file whose header was parsed and checked against its real size.

    No data has been read or allocated yet: `verify` streams the data through
    one bounded buffer, `load` reads it into arrays.  Use as a context manager.
    """

    path: Path
    fd: int
    size: int
    header_len: int
    manifest_text: str
    checksum: str
    signature: str | None
    manifest: Manifest

    @classmethod
    def open(cls, path: Path, directory: Directory | None = None) -> Reader:
        """Open ``path`` (by name inside ``directory`` when given), never through a link.

        Raises `UnreadableCheckpoint` or `TruncatedCheckpoint` when the header
        is malformed or does not fit the file, `SchemaMismatch` for another schema.
        """
        name = str(path)
        fd = _open(path, directory)
        try:
            return cls(path, fd, *_read_header(fd, name))
        except BaseException:
            os.close(fd)
            raise

    @property
    def data_bytes(self) -> int:
        """Size of the data region, equal to the leaves' total (checked on open)."""
        return self.size - 8 - self.header_len

    def verify(self, key: bytes | None = None) -> None:
        """Check the checksum (and signature) streaming the data through one bounded buffer."""
        self._require_signature(key)
        buffer = memoryview(bytearray(min(READ_CHUNK, self.data_bytes)))
        self._check(self._stream(buffer, key, reuse=True), key)

    def load(self, key: bytes | None = None) -> Checkpoint:
        """Read and verify the data; raises `ChecksumMismatch` or `SignatureMismatch`."""
        self._require_signature(key)
        data = np.empty(self.data_bytes, np.uint8)
        self._check(self._stream(data.data, key, reuse=False), key)
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for leaf in self.manifest.leaves:
            dtype = NUMPY_DTYPES[leaf.dtype]
            arrays[leaf.path] = np.frombuffer(
                data, dtype=dtype, count=leaf.nbytes // dtype.itemsize, offset=offset
            ).reshape(leaf.shape)
            offset += leaf.nbytes
        return Checkpoint(
            path=self.path,
            manifest=self.manifest,
            arrays=arrays,
            checksum=self.checksum,
            size=self.size,
            checks=CONTAINER_CHECKS if key is None else SIGNED_CHECKS,
            signature=self.signature,
        )

    def _require_signature(self, key: bytes | None) -> None:
        if key is not None and self.signature is None:
            raise SignatureMismatch(
                str(self.path),
                "unsigned, and this reader requires a signature (it was given a signing key)",
                stored=None,
            )

    def _stream(self, buffer: memoryview, key: bytes | None, reuse: bool) -> Digests:
        """Read the data region into ``buffer`` (over and over when ``reuse``), hashing each
        chunk while it is in cache: a zero-filled buffer and one large read would fault twice."""
        digests = Digests(self.manifest_text.encode(), key)
        start, length, position = 8 + self.header_len, self.data_bytes, 0
        while position < length:
            at = 0 if reuse else position
            chunk = buffer[at : at + min(READ_CHUNK, length - position)]
            count = os.preadv(self.fd, [chunk], start + position)
            if count == 0:
                raise TruncatedCheckpoint(str(self.path), "file shrank while it was read")
            digests.update(chunk[:count])
            position += count
        return digests

    def _check(self, digests: Digests, key: bytes | None) -> None:
        found = digests.checksum_text()
        name = str(self.path)
        if found != self.checksum:
            raise ChecksumMismatch(
                name,
                f"checksum mismatch: stored {self.checksum}, recomputed {found}",
                stored=self.checksum,
                found=found,
            )
        if digests.mac is not None and not signing.matches(self.signature or "", digests.mac):
            raise SignatureMismatch(
                name,
                "signature does not match: the checksum verifies, so the file was "
                "rewritten by someone without the signing key (or signed with another key)",
                stored=self.signature,
            )

    def close(self) -> None:
        """Close the file."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read(path: Path, key: bytes | None = None) -> Checkpoint:
    """Read and verify one checkpoint file (and its signature, given ``key``).

    Raises `UnreadableCheckpoint`, `TruncatedCheckpoint`, `ChecksumMismatch` or
    `SignatureMismatch` for damage, and `SchemaMismatch` for another schema version.
    """
    with Reader.open(path) as reader:
        return reader.load(key)


def read_manifest(path: Path) -> tuple[Manifest, str, int]:
    """The manifest, stored checksum and file size, without reading or verifying the data."""
    with Reader.open(path) as reader:
        return reader.manifest, reader.checksum, reader.size


def _open(path: Path, directory: Directory | None) -> int:
    name = str(path)
    try:
        if directory is not None:
            return directory.open_file(path.name)
        fd = os.open(path, READ_FLAGS)
    except UnsafePathError as error:
        raise UnreadableCheckpoint(name, f"refused: {error.reason}") from error
    except OSError as error:
        reason = "is a symbolic link" if error.errno == errno.ELOOP else error.strerror
        raise UnreadableCheckpoint(name, f"cannot open: {reason}") from error
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnreadableCheckpoint(name, "cannot open: not a regular file")
    return fd


def _read_header(fd: int, name: str) -> tuple[int, int, str, str, str | None, Manifest]:
    size = os.fstat(fd).st_size
    if size < 8:
        raise TruncatedCheckpoint(
            name, f"file has {size} bytes, fewer than the 8-byte prefix", size=size
        )
    (header_len,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if header_len > MAX_HEADER_BYTES:
        raise UnreadableCheckpoint(
            name,
            f"header length {header_len} exceeds {MAX_HEADER_BYTES}; not a jobwarden checkpoint",
        )
    if 8 + header_len > size:
        raise TruncatedCheckpoint(
            name, f"header needs {8 + header_len} bytes, file has {size}", size=size
        )
    header_bytes = os.pread(fd, header_len, 8)
    try:
        header = loads_json(header_bytes)
        meta = header.pop("__metadata__")
        manifest_text = meta["jobwarden"]
        stored_checksum = meta["checksum"]
        signature = meta.get("signature")
        if not all(isinstance(v, str) for v in (manifest_text, stored_checksum, signature or "")):
            raise TypeError("metadata values must be strings")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UnreadableCheckpoint(name, f"safetensors header is malformed: {error!r}") from error
    manifest = Manifest.from_json(name, manifest_text)
    _check_table(name, header, manifest)
    expected = sum(leaf.nbytes for leaf in manifest.leaves)
    available = size - 8 - header_len
    if available < expected:
        raise TruncatedCheckpoint(
            name,
            f"data region has {available} bytes, manifest needs {expected}",
            size=size,
            expected_bytes=8 + header_len + expected,
        )
    if available > expected:
        raise UnreadableCheckpoint(name, f"{available - expected} unexpected bytes after the data")
    return size, header_len, manifest_text, stored_checksum, signature, manifest


def _check_table(name: str, header: dict[str, Any], manifest: Manifest) -> None:
    """The safetensors tensor table must describe exactly the manifest's leaves, contiguously."""
    if list(header) != [leaf.path for leaf in manifest.leaves]:
        raise UnreadableCheckpoint(name, "tensor table and manifest list different leaves")
    offset = 0
    for leaf in manifest.leaves:
        entry = header[leaf.path]
        wanted = {
            "dtype": SAFETENSORS_DTYPES[leaf.dtype],
            "shape": list(leaf.shape),
            "data_offsets": [offset, offset + leaf.nbytes],
        }
        if entry != wanted:
            raise UnreadableCheckpoint(
                name, f"tensor table entry for {leaf.path} is {entry}, manifest implies {wanted}"
            )
        offset += leaf.nbytes
