"""The checkpoint container: one safetensors file per committed step.

Layout (the safetensors format, readable by the reference library):

    8 bytes   little-endian u64: header length N
    N bytes   JSON header, space-padded to a multiple of 8:
              {"__metadata__": {"jobwarden": <manifest JSON>, "checksum": "xxh3-128:<hex>"},
               "<leaf path>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}
    data      raw little-endian bytes of every leaf, in manifest order, no gaps

The manifest holds the step, the tree structure (leaf paths, dtypes, shapes),
the key implementation, the training fields and the provenance.  The checksum
is xxh3-128 over the manifest text followed by the whole data region: it detects
accidental corruption and is not a signature.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import xxhash

from jobwarden.checkpoint.errors import (
    ChecksumMismatch,
    SchemaMismatch,
    TruncatedCheckpoint,
    UnreadableCheckpoint,
)
from jobwarden.hashing import HASH_NAME, Leaves, little_endian

SCHEMA_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024 * 1024
READ_CHUNK = 16 << 20

SAFETENSORS_DTYPES: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    for name in SAFETENSORS_DTYPES
}


@dataclass(frozen=True)
class LeafSpec:
    """One leaf of the saved state: its path, numpy dtype name and shape."""

    path: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes this leaf occupies in the data region."""
        count = 1
        for extent in self.shape:
            count *= extent
        return count * NUMPY_DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class Provenance:
    """Where a checkpoint came from; compared field by field on restore."""

    config_hash: str
    data_hash: str
    source_hash: str
    runtime: Mapping[str, str]
    writer_generation: int


@dataclass(frozen=True)
class Manifest:
    """Everything about a checkpoint except its array bytes."""

    task: str
    job_id: str
    step: int
    key_impl: str
    leaves: tuple[LeafSpec, ...]
    train: Mapping[str, Any]
    provenance: Provenance
    state_hash: str
    components: Mapping[str, str]
    created: float
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        """The manifest as the compact JSON text stored in the header."""
        record = {
            "schema_version": self.schema_version,
            "task": self.task,
            "job_id": self.job_id,
            "step": self.step,
            "key_impl": self.key_impl,
            "leaves": [[leaf.path, leaf.dtype, list(leaf.shape)] for leaf in self.leaves],
            "train": dict(self.train),
            "provenance": {
                "config_hash": self.provenance.config_hash,
                "data_hash": self.provenance.data_hash,
                "source_hash": self.provenance.source_hash,
                "runtime": dict(self.provenance.runtime),
                "writer_generation": self.provenance.writer_generation,
            },
            "state_hash": self.state_hash,
            "components": dict(self.components),
            "created": self.created,
        }
        return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, path: str, text: str) -> Manifest:
        """Parse manifest text; any missing or mistyped field makes the file unreadable."""
        try:
            raw = json.loads(text)
            version = raw["schema_version"]
            if version != SCHEMA_VERSION:
                raise SchemaMismatch(path, "schema_version", version, SCHEMA_VERSION)
            prov = raw["provenance"]
            leaves = tuple(
                LeafSpec(str(p), str(d), tuple(int(n) for n in s)) for p, d, s in raw["leaves"]
            )
            for leaf in leaves:
                if leaf.dtype not in NUMPY_DTYPES:
                    raise ValueError(f"leaf {leaf.path} has unsupported dtype {leaf.dtype}")
            return cls(
                task=str(raw["task"]),
                job_id=str(raw["job_id"]),
                step=_int(raw["step"]),
                key_impl=str(raw["key_impl"]),
                leaves=leaves,
                train=dict(raw["train"]),
                provenance=Provenance(
                    config_hash=str(prov["config_hash"]),
                    data_hash=str(prov["data_hash"]),
                    source_hash=str(prov["source_hash"]),
                    runtime={str(k): str(v) for k, v in prov["runtime"].items()},
                    writer_generation=_int(prov["writer_generation"]),
                ),
                state_hash=str(raw["state_hash"]),
                components={str(k): str(v) for k, v in raw["components"].items()},
                created=float(raw["created"]),
            )
        except SchemaMismatch:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise UnreadableCheckpoint(path, f"manifest is malformed: {error!r}") from error


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, found {value!r}")
    return value


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back and verified against its checksum."""

    path: Path
    manifest: Manifest
    arrays: Mapping[str, np.ndarray]
    checksum: str
    size: int
    checks: tuple[str, ...] = field(default=("readable", "checksum", "schema"))

    def leaves(self) -> Leaves:
        """The saved leaves in manifest order."""
        return [(leaf.path, self.arrays[leaf.path]) for leaf in self.manifest.leaves]


def leaf_specs(leaves: Leaves) -> tuple[LeafSpec, ...]:
    """Describe ``leaves`` for a manifest; refuses dtypes safetensors cannot hold."""
    specs = []
    for path, array in leaves:
        if array.dtype.name not in SAFETENSORS_DTYPES:
            raise TypeError(f"leaf {path}: dtype {array.dtype} cannot be checkpointed")
        specs.append(LeafSpec(path, array.dtype.name, tuple(array.shape)))
    return tuple(specs)


def _checksum(manifest_text: bytes, payload: list[memoryview]) -> str:
    hasher = xxhash.xxh3_128(manifest_text)
    for view in payload:
        hasher.update(view)
    return f"{HASH_NAME}:{hasher.hexdigest()}"


def _header(manifest: Manifest, checksum: str) -> bytes:
    table: dict[str, Any] = {
        "__metadata__": {"jobwarden": manifest.to_json(), "checksum": checksum}
    }
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


def encode(manifest: Manifest, leaves: Leaves) -> list[memoryview]:
    """The file's bytes as a list of buffers (header, then each leaf without copying)."""
    payload = [little_endian(array).reshape(-1).view(np.uint8).data for _, array in leaves]
    checksum = _checksum(manifest.to_json().encode(), payload)
    return [memoryview(_header(manifest, checksum)), *payload]


def _read_and_hash(
    fd: int, start: int, length: int, manifest_text: bytes, name: str
) -> tuple[np.ndarray, str]:
    """Read the data region in chunks into one uninitialised buffer, hashing each chunk
    while it is still in cache.

    A zero-filled buffer followed by one large read costs twice the page faults;
    chunks of `READ_CHUNK` keep the checksum nearly free next to the read.
    """
    data = np.empty(length, np.uint8)
    view = data.data
    hasher = xxhash.xxh3_128(manifest_text)
    position = 0
    while position < length:
        chunk = view[position : position + READ_CHUNK]
        count = os.preadv(fd, [chunk], start + position)
        if count == 0:
            raise TruncatedCheckpoint(name, "file shrank while it was read")
        hasher.update(chunk[:count])
        position += count
    return data, f"{HASH_NAME}:{hasher.hexdigest()}"


def read(path: Path) -> Checkpoint:
    """Read and verify one checkpoint file.

    Raises `UnreadableCheckpoint`, `TruncatedCheckpoint` or `ChecksumMismatch`
    for damage, and `SchemaMismatch` for a file of another schema version.
    """
    name = str(path)
    fd = _open(name)
    try:
        size, header_len, manifest_text, stored_checksum, manifest = _read_header(fd, name)
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
            raise UnreadableCheckpoint(
                name, f"{available - expected} unexpected bytes after the data"
            )
        data, found = _read_and_hash(fd, 8 + header_len, expected, manifest_text.encode(), name)
    finally:
        os.close(fd)
    if found != stored_checksum:
        raise ChecksumMismatch(
            name,
            f"checksum mismatch: stored {stored_checksum}, recomputed {found}",
            stored=stored_checksum,
            found=found,
        )
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for leaf in manifest.leaves:
        dtype = NUMPY_DTYPES[leaf.dtype]
        count = leaf.nbytes // dtype.itemsize
        arrays[leaf.path] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(
            leaf.shape
        )
        offset += leaf.nbytes
    return Checkpoint(
        path=path, manifest=manifest, arrays=arrays, checksum=stored_checksum, size=size
    )


def _open(name: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise UnreadableCheckpoint(name, f"cannot open: {error.strerror}") from error


def _read_header(fd: int, name: str) -> tuple[int, int, str, str, Manifest]:
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
        header = json.loads(header_bytes)
        meta = header.pop("__metadata__")
        manifest_text = meta["jobwarden"]
        stored_checksum = meta["checksum"]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UnreadableCheckpoint(name, f"safetensors header is malformed: {error!r}") from error
    manifest = Manifest.from_json(name, manifest_text)
    _check_table(name, header, manifest)
    return size, header_len, manifest_text, stored_checksum, manifest


def read_manifest(path: Path) -> tuple[Manifest, str, int]:
    """The manifest, stored checksum and file size, without reading or verifying the data."""
    fd = _open(str(path))
    try:
        size, _, _, checksum, manifest = _read_header(fd, str(path))
    finally:
        os.close(fd)
    return manifest, checksum, size


def _check_table(name: str, header: dict[str, Any], manifest: Manifest) -> None:
    """The safetensors tensor table must describe exactly the manifest's leaves."""
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
