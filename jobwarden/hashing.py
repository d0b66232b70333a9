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
import operator
import os
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import xxhash

HASH_NAME = "xxh3-128"
STATE_HASH_VERSION = b"jobwarden-state-v1"

Leaves = list[tuple[str, np.ndarray]]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def canonical_json(value: Any) -> bytes:
    """Stable JSON bytes: sorted keys, no whitespace, no NaN (`json.dumps` with those
    options, without building an encoder for every call)."""
    return _CANONICAL.encode(value).encode()


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
JOINED_AT_MOST = 1 << 16
"""Leaves up to this size are copied into one buffer per component and hashed in one call
(`StateHasher.of_buffers`, `Recipe`).

The hash function lets go of the interpreter lock on every call; for a small leaf,
letting go and taking it back costs more than the bytes, and a thread hashing
beside a training loop then contends for the lock twice per leaf.  A larger leaf
is hashed where it lies."""


class Layout(NamedTuple):
    """What one leaf's path, dtype and shape fix: its header bytes and how its bytes are fed."""

    head: bytes
    nbytes: int
    as_bytes: bool
    """its dtype has no buffer format (ml_dtypes): fed as a flat view of bytes"""


class StateHasher:
    """`state_hash`, bit for bit, with the work that depends only on the state's layout cached.

    A training loop hashes a state of the same leaves update after update; the
    grouping of leaf paths into components and each leaf's header bytes (path,
    dtype, shape) are computed once per layout instead of on every update.
    A leaf may be a NumPy array or any array exporting its canonical bytes
    through the buffer protocol (a single-device JAX array on a little-endian host).
    """

    def __init__(self) -> None:
        self._groups: dict[tuple[str, ...], tuple[tuple[str, tuple[int, ...]], ...]] = {}
        self._layouts: dict[tuple[str, Any, tuple[int, ...]], Layout] = {}
        self._recipes: dict[int, Recipe] = {}

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
                if isinstance(array, np.ndarray) and (
                    array.dtype.byteorder == ">" or not array.flags.c_contiguous
                ):
                    array = little_endian(array)
                layout = self._layout(path, array)
                hasher.update(layout.head)
                hasher.update(array.reshape(-1).view(np.uint8) if layout.as_bytes else array)
            hashes[name] = hasher.hexdigest()
        hashes["step"] = xxhash.xxh3_128(str(step).encode()).hexdigest()
        return state_hash_of(hashes), hashes

    def of_buffers(
        self, paths: list[str], values: list[Any], step: int, layout: Hashable
    ) -> tuple[str, dict[str, str]]:
        """``self(list(zip(paths, values)), step)``, bit for bit, for values that all export
        their canonical bytes, with no Python per leaf once their layout is known: per
        component, the leaves' headers and buffers are joined in one call (`Recipe`).

        ``paths`` must be the same list object for the same paths (a flattener's cache);
        ``layout`` anything equal exactly when the values' dtypes and shapes are (the
        caller's leaves' dtypes and shapes, which fix those of what it exports).  Raises
        `BufferError` (or the exporter's error) for a value that does not export its bytes
        contiguously; the caller then hashes host arrays instead.
        """
        recipe = self._recipes.get(id(paths))
        if recipe is None or recipe.paths is not paths or layout != recipe.layout:
            if len(self._recipes) >= MAX_CACHED_RECIPES:
                self._recipes.clear()
            recipe = self._recipes[id(paths)] = Recipe(self, paths, values, layout)
        return recipe(values, step)

    def _layout(self, path: str, array: Any) -> Layout:
        """`update_with_leaf`'s header, which names the shape `little_endian` gives (0-d is
        [1]), with the leaf's size and whether its dtype lacks a buffer format."""
        key = (path, array.dtype, array.shape)
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= MAX_CACHED_HEADS:  # a state whose shapes keep changing
                self._layouts.clear()
            canonical = little_endian(np.asarray(array))
            text = f"{path}\0{canonical.dtype.name}\0{list(canonical.shape)}\0"
            layout = Layout(text.encode(), canonical.nbytes, canonical.dtype.isbuiltin != 1)
            self._layouts[key] = layout
        return layout


MAX_CACHED_RECIPES = 64
Segment = tuple[list[Any], Callable[[list[Any]], Any], bool]
"""headers with a place after each, what fills the places, and whether to join them (else
one leaf, hashed where it lies)"""


class Recipe:
    """How `StateHasher.of_buffers` hashes a state of one layout: per component, segments
    of a template (each leaf's header, then a place for its buffer) filled in one C call
    (`operator.itemgetter`) and joined in another, so that the hash of a state of many
    small leaves releases the interpreter lock a few times instead of twice per leaf.  A
    leaf over `JOINED_AT_MOST`, or of a dtype with no buffer format, is a segment of its
    own, hashed where it lies."""

    def __init__(
        self,
        hasher: StateHasher,
        paths: list[str],
        values: list[Any],
        layout: Hashable,
    ) -> None:
        self.paths, self.layout = paths, layout
        self.components: list[tuple[str, list[Segment]]] = []
        for name, indices in _groups_of(tuple(paths)):
            segments: list[Segment] = []
            heads: list[bytes] = []
            members: list[int] = []
            for index in indices:
                leaf = hasher._layout(paths[index], values[index])
                if leaf.nbytes <= JOINED_AT_MOST and not leaf.as_bytes:
                    heads.append(leaf.head)
                    members.append(index)
                    continue
                if heads:
                    segments.append(_joined(heads, members))
                segments.append(_alone(leaf, index))
                heads, members = [], []
            if heads:
                segments.append(_joined(heads, members))
            self.components.append((name, segments))

    def __call__(self, values: list[Any], step: int) -> tuple[str, dict[str, str]]:
        """The complete-state hash and its component digests, as `state_hash` gives them."""
        hashes = {}
        for name, segments in self.components:
            hasher: Any = xxhash.xxh3_128()
            for template, take, joined in segments:
                if joined:
                    parts = template.copy()
                    parts[1::2] = take(values)
                    hasher.update(b"".join(parts))
                else:  # one leaf, where it lies
                    hasher.update(template[0])
                    hasher.update(take(values)[0])
            hashes[name] = hasher.hexdigest()
        hashes["step"] = xxhash.xxh3_128(str(step).encode()).hexdigest()
        return state_hash_of(hashes), hashes


def _joined(heads: list[bytes], indices: list[int]) -> Segment:
    """A template of headers with a place after each, and what takes their buffers."""
    template: list[Any] = []
    for head in heads:
        template += [head, None]
    if len(indices) == 1:
        index = indices[0]
        return template, lambda values: (values[index],), True
    return template, operator.itemgetter(*indices), True


def _alone(leaf: Layout, index: int) -> Segment:
    """One leaf hashed where it lies: a large one, or one whose dtype has no buffer format
    (fed as a flat view of bytes)."""
    if leaf.as_bytes:
        return [leaf.head], lambda values: (values[index].reshape(-1).view(np.uint8),), False
    return [leaf.head], lambda values: (values[index],), False


def _groups_of(paths: tuple[str, ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Leaf indices per component, components in order of first appearance (`component_hashes`)."""
    groups: dict[str, list[int]] = {}
    for index, path in enumerate(paths):
        groups.setdefault(component_of(path), []).append(index)
    return tuple((name, tuple(indices)) for name, indices in groups.items())
