"""Canonical hashes: training state, data, training config and the source that defines an update.

The state hash is computed over canonical bytes (leaf path, dtype, shape, raw
little-endian bytes, and the step), never over float text, so two states hash
equal exactly when every bit of them is equal.  xxh3-128 is used because it
runs at memory speed; these hashes detect accidental difference, they are not
signatures.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

HASH_NAME = "xxh3-128"
STATE_HASH_VERSION = b"jobwarden-state-v1"

Leaves = list[tuple[str, np.ndarray]]


def canonical_json(value: Any) -> bytes:
    """Stable JSON bytes: sorted keys, no whitespace, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def little_endian(array: np.ndarray) -> np.ndarray:
    """The array as contiguous little-endian bytes; a view when it already is."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array)


def update_with_leaf(hasher: Any, path: str, array: np.ndarray) -> None:
    """Feed one leaf's identity and raw bytes to ``hasher``."""
    array = little_endian(array)
    head = f"{path}\0{array.dtype.name}\0{list(array.shape)}\0".encode()
    hasher.update(head)
    hasher.update(array.reshape(-1).view(np.uint8))


def leaves_digest(leaves: Iterable[tuple[str, np.ndarray]]) -> str:
    """xxh3-128 hex digest over the canonical bytes of ``leaves`` in order."""
    hasher = xxhash.xxh3_128()
    for path, array in leaves:
        update_with_leaf(hasher, path, array)
    return hasher.hexdigest()


def component_of(path: str) -> str:
    """The state component a leaf belongs to: the first segment of its path."""
    return path.split("/", 1)[0]


def component_hashes(leaves: Leaves, step: int) -> dict[str, str]:
    """One digest per top-level state component, plus the step."""
    groups: dict[str, Leaves] = {}
    for path, array in leaves:
        groups.setdefault(component_of(path), []).append((path, array))
    hashes = {name: leaves_digest(group) for name, group in groups.items()}
    hashes["step"] = xxhash.xxh3_128(str(step).encode()).hexdigest()
    return hashes


def state_hash_of(components: Mapping[str, str]) -> str:
    """The complete-state hash, derived from the component digests."""
    hasher = xxhash.xxh3_128(STATE_HASH_VERSION)
    hasher.update(canonical_json(dict(components)))
    return hasher.hexdigest()


def state_hash(leaves: Leaves, step: int) -> tuple[str, dict[str, str]]:
    """The complete-state hash and its component digests."""
    components = component_hashes(leaves, step)
    return state_hash_of(components), components


def config_hash(task: str, train: Mapping[str, Any]) -> str:
    """sha256 over the task name and its normalized training fields only."""
    return hashlib.sha256(canonical_json({"task": task, "train": dict(train)})).hexdigest()


def files_digest(paths: Iterable[Path]) -> str:
    """sha256 over each file's name and bytes, in the given order."""
    hasher = hashlib.sha256()
    for path in paths:
        data = path.read_bytes()
        hasher.update(f"{path.name}\0{len(data)}\0".encode())
        hasher.update(data)
    return hasher.hexdigest()


DATA_CHUNK = 16 << 20


def data_files_digest(paths: Iterable[Path]) -> str:
    """xxh3-128 over each file's length and bytes, in the given order, read in bounded chunks.

    A data set may be gigabytes, so files are streamed (at memory speed) rather than
    read whole; their names are not hashed: the same bytes moved elsewhere are the same data.
    """
    hasher = xxhash.xxh3_128(b"jobwarden-data-files-v1")
    for path in paths:
        with path.open("rb") as stream:
            hasher.update(f"{os.fstat(stream.fileno()).st_size}\0".encode())
            while chunk := stream.read(DATA_CHUNK):
                hasher.update(chunk)
    return hasher.hexdigest()


MAX_CACHED_HEADS = 1 << 14


class StateHasher:
    """`state_hash`, bit for bit, with the work that depends only on the state's layout cached.

    A training loop hashes a state of the same leaves update after update; the
    grouping of leaf paths into components and each leaf's header bytes (path,
    dtype, shape) are computed once per layout instead of on every update.
    """

    def __init__(self) -> None:
        self._groups: dict[tuple[str, ...], tuple[tuple[str, tuple[int, ...]], ...]] = {}
        self._heads: dict[tuple[str, np.dtype[Any], tuple[int, ...]], bytes] = {}

    def __call__(self, leaves: Leaves, step: int) -> tuple[str, dict[str, str]]:
        """The complete-state hash and its component digests, as `state_hash` gives them."""
        paths = tuple(path for path, _ in leaves)
        groups = self._groups.get(paths)
        if groups is None:
            groups = self._groups[paths] = _groups_of(paths)
        hashes = {}
        for name, indices in groups:
            hasher: Any = xxhash.xxh3_128()  # numpy arrays are buffers; the stub says Buffer
            for index in indices:
                path, array = leaves[index]
                if array.dtype.byteorder == ">" or not array.flags.c_contiguous:
                    array = little_endian(array)
                hasher.update(self._head(path, array))
                try:  # the array's own buffer: its bytes in order, without a reshaped view
                    hasher.update(array)
                except (BufferError, TypeError, ValueError):  # a dtype the buffer protocol lacks
                    hasher.update(array.reshape(-1).view(np.uint8))
            hashes[name] = hasher.hexdigest()
        hashes["step"] = xxhash.xxh3_128(str(step).encode()).hexdigest()
        return state_hash_of(hashes), hashes

    def _head(self, path: str, array: np.ndarray) -> bytes:
        """`update_with_leaf`'s header, which names the shape `little_endian` gives (0-d is [1])."""
        key = (path, array.dtype, array.shape)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) >= MAX_CACHED_HEADS:  # a state whose shapes keep changing
                self._heads.clear()
            canonical = little_endian(array)
            text = f"{path}\0{canonical.dtype.name}\0{list(canonical.shape)}\0"
            head = self._heads[key] = text.encode()
        return head


def _groups_of(paths: tuple[str, ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Leaf indices per component, components in order of first appearance (`component_hashes`)."""
    groups: dict[str, list[int]] = {}
    for index, path in enumerate(paths):
        groups.setdefault(component_of(path), []).append(index)
    return tuple((name, tuple(indices)) for name, indices in groups.items())
