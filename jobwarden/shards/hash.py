"""The state hash of a sharded state: computed box by box, combined in global order.

A leaf that a member does not hold whole (a `jax.Array` neither fully addressable nor fully
replicated) is *laid out*: its sharding cuts it into distinct boxes (``(start, stop)`` per
axis, from ``sharding.devices_indices_map``, replicas counted once), each owned by the
lowest process that holds it.  The job's `Layout` lists, for every laid-out leaf, its boxes
in canonical order (sorted by bounds) and their owners; it is fixed by the initial state.

A laid-out leaf enters its component's xxh3-128 stream as its header (path, dtype, global
shape, ``boxes``) followed, box by box in canonical order, by the box's bounds and the
xxh3-128 digest of its little-endian bytes.  Every other leaf enters as it always has
(`jobwarden.hashing.update_with_leaf`), so a state without laid-out leaves hashes bit for
bit as before.  The state hash is then `hashing.state_hash_of` the components and the step.

Each member computes only the digests of the boxes it owns, from whatever it holds of the
leaf (its shard, or a replicated or host copy), and one all-gather of 16 bytes per box
gives every member every digest: the hash is the same whichever member computes it, and
the same when the state is held replicated or whole in one process and hashed through the
same layout (`layout_state_hash`), because it depends only on the values and the boxes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from jobwarden.checkpoint.shardrecord import Box, Layout
from jobwarden.hashing import Leaves, StateHasher, component_of, little_endian, state_hash_of
from jobwarden.hashing import update_with_leaf as _plain_leaf

Gather = Callable[[np.ndarray], np.ndarray]
"""An all-gather: every member's ``(n, 16)`` uint8 rows, stacked as ``(members, n, 16)``."""
DIGEST_BYTES = 16


def is_laid_out(leaf: Any) -> bool:
    """Whether ``leaf`` is split over several members: a JAX array this process does not
    hold whole (neither fully addressable nor fully replicated)."""
    import jax

    return (
        isinstance(leaf, jax.Array)
        and not leaf.is_fully_addressable
        and not leaf.is_fully_replicated
    )


def boxes_of(leaf: Any) -> tuple[tuple[Box, int], ...]:
    """The leaf's distinct boxes in canonical order, each with its owner (the lowest process
    holding it)."""
    owners: dict[Box, int] = {}
    for device, index in leaf.sharding.devices_indices_map(tuple(leaf.shape)).items():
        box = box_of(index, leaf.shape)
        owners[box] = min(owners.get(box, device.process_index), device.process_index)
    return tuple(sorted(owners.items()))


def layout_of(leaves: Sequence[tuple[str, Any]]) -> dict[str, tuple[tuple[Box, int], ...]]:
    """The layout of a state's leaves: every laid-out leaf's boxes and owners."""
    return {path: boxes_of(value) for path, value in leaves if is_laid_out(value)}


def box_of(index: tuple[slice, ...], shape: Sequence[int]) -> Box:
    """A device's index (slices) as (start, stop) per axis."""
    return tuple(
        (start, stop)
        for (start, stop, _) in (s.indices(n) for s, n in zip(index, shape, strict=True))
    )


def slices_of(box: Box) -> tuple[slice, ...]:
    """The slices that cut ``box`` out of the whole leaf."""
    return tuple(slice(start, stop) for start, stop in box)


def box_data(value: Any, box: Box) -> np.ndarray:
    """The bytes of ``box`` of a leaf as this process holds it (its shard of a laid-out
    array, or a slice of a copy it holds whole); raises `KeyError` when it holds neither."""
    if isinstance(value, np.ndarray):
        return value[slices_of(box)]
    if value.is_fully_addressable or value.is_fully_replicated:
        return np.asarray(value.addressable_data(0))[slices_of(box)]
    for shard in value.addressable_shards:
        if box_of(shard.index, value.shape) == box:
            return np.asarray(shard.data)
    raise KeyError(box)


def box_digest(path: str, dtype: str, box: Box, data: np.ndarray) -> bytes:
    """The 16-byte digest of one box: its leaf's path and dtype, its bounds, its bytes."""
    hasher: Any = xxhash.xxh3_128(f"{path}\0{dtype}\0{list(box)}\0".encode())
    hasher.update(little_endian(np.asarray(data)).reshape(-1).view(np.uint8))
    return bytes(hasher.digest())


def combine(
    leaves: Sequence[tuple[str, Any]],
    step: int,
    layout: Layout,
    digest: Callable[[str, int], bytes],
) -> tuple[str, dict[str, str]]:
    """The complete-state hash and its components: a laid-out leaf by its boxes' digests
    (``digest(path, box_number)``), any other leaf as `jobwarden.hashing` hashes it."""
    hashers: dict[str, Any] = {}
    for path, value in leaves:
        hasher = hashers.get(component_of(path))
        if hasher is None:
            hasher = hashers[component_of(path)] = xxhash.xxh3_128()
        boxes = layout.get(path)
        if boxes is None:
            _plain_leaf(hasher, path, np.asarray(value))
            continue
        name = np.dtype(value.dtype).name
        hasher.update(f"{path}\0{name}\0{list(value.shape)}\0boxes\0".encode())
        for number, (box, _) in enumerate(boxes):
            hasher.update(f"{list(box)}\0".encode())
            hasher.update(digest(path, number))
    hashes = {name: hasher.hexdigest() for name, hasher in hashers.items()}
    hashes["step"] = xxhash.xxh3_128(str(step).encode()).hexdigest()
    return state_hash_of(hashes), hashes


def layout_state_hash(leaves: Leaves, step: int, layout: Layout) -> tuple[str, dict[str, str]]:
    """The hash of a state held whole in one process, through ``layout``'s boxes: what the
    members compute together when they hold it laid out."""
    arrays = dict(leaves)

    def digest(path: str, number: int) -> bytes:
        box = layout[path][number][0]
        array = arrays[path]
        return box_digest(path, array.dtype.name, box, array[slices_of(box)])

    return combine(leaves, step, layout, digest)


class ShardedStateHasher(StateHasher):
    """`StateHasher` through a layout: each member hashes the boxes it owns and one
    all-gather (``gather``) per state gives every member every digest.  With no layout it
    is `StateHasher` exactly.  Every member must hash the same steps in the same order."""

    def __init__(self, gather: Gather, layout: Layout, process: int) -> None:
        super().__init__()
        self.layout = layout
        self._gather = gather
        self._process = process
        self._rows = sum(len(boxes) for boxes in layout.values())

    def __call__(self, leaves: Leaves, step: int) -> tuple[str, dict[str, str]]:
        """The complete-state hash and its components; ``leaves`` may hold laid-out arrays."""
        if not self.layout:
            return super().__call__(leaves, step)
        rows = np.zeros((self._rows, DIGEST_BYTES), np.uint8)
        places: dict[str, int] = {}
        values = dict(leaves)
        position = 0
        for path, boxes in self.layout.items():
            places[path] = position
            value = values[path]
            name = np.dtype(value.dtype).name
            for box, owner in boxes:
                if owner == self._process:
                    data = box_data(value, box)
                    rows[position] = np.frombuffer(box_digest(path, name, box, data), np.uint8)
                position += 1
        every = np.asarray(self._gather(rows)).reshape(-1, self._rows, DIGEST_BYTES)

        def digest(path: str, number: int) -> bytes:
            owner = self.layout[path][number][1]
            return bytes(every[owner, places[path] + number])

        return combine(leaves, step, self.layout, digest)
