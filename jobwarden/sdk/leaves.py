"""A state's named host leaves, update after update, with the per-structure work done once.

`jobwarden.statetree.flatten` names every leaf from its pytree path and checks
what kind of leaf it is; for a loop that reports the same structure on every
update, recomputing the paths and asking JAX about each leaf's dtype costs more
than hashing the bytes.  `Flattener` gives exactly what `jobwarden.statetree.flatten`
gives (same paths, same arrays), caching the paths per tree structure (JAX's
treedef, which fixes every key of the path) and the kind of leaf per dtype.
`same_tree` refuses a state whose leaves drifted from the initial state's, with
`UsageError`, the error of a program that calls the SDK out of order.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from jobwarden import statetree as state_tree
from jobwarden.checkpoint.manifest import SAFETENSORS_DTYPES
from jobwarden.checkpoint.validate import Expected
from jobwarden.errors import WorkerInternalError
from jobwarden.hashing import Leaves

MAX_CACHED_TREES = 64


class Flattener:
    """`jobwarden.statetree.flatten`, with paths cached per treedef and leaf kinds per dtype."""

    def __init__(self) -> None:
        import jax

        self._jax = jax
        self._paths: dict[Any, list[str]] = {}
        self._kinds: dict[Any, str] = {}

    def __call__(self, state: Any) -> Leaves:
        """Named host copies (or views) of every leaf; raises `statetree.UnsupportedLeaf`."""
        return self.snapshot(state).leaves()

    def snapshot(self, state: Any) -> Snapshot:
        """What `Snapshot.leaves` needs of ``state`` later, on another thread, to give what
        this call would give now: its leaves taken out of the program's containers (which
        it may change in place), a JAX array as it is (immutable), anything else as a host
        copy made now (a NumPy array is the program's to change)."""
        values, treedef = self._jax.tree_util.tree_flatten(state)
        paths = self._paths.get(treedef)
        if paths is None:
            if len(self._paths) >= MAX_CACHED_TREES:
                self._paths.clear()
            paths = self._paths[treedef] = state_tree.leaf_paths(state)
        array_type = self._jax.Array
        taken = [
            value if isinstance(value, array_type) else _copied(path, value)
            for path, value in zip(paths, values, strict=True)
        ]
        return Snapshot(self, paths, taken)

    def host(self, path: str, leaf: Any) -> np.ndarray:
        """One leaf as a host array (a view of a JAX array's buffer where it can be)."""
        if not isinstance(leaf, self._jax.Array):
            return state_tree.host_array(path, leaf)
        kind = self._kinds.get(leaf.dtype)
        if kind is None:
            kind = self._kinds[leaf.dtype] = self._kind_of(leaf)
        if kind == "array" and not leaf.is_fully_addressable:
            if leaf.is_fully_replicated:  # every member holds it whole
                return np.asarray(leaf.addressable_data(0))
            # Laid out over the members: no process may gather it; it is hashed, written and
            # restored by its boxes (`jobwarden.shards`).
            return cast(np.ndarray, leaf)
        if kind == "array":
            return np.asarray(leaf)
        if kind == "key":
            # jax.random.key_data binds a primitive (tens of microseconds eagerly);
            # its eager implementation returns this attribute, the raw key data.
            data = getattr(leaf, "_base_array", None)
            if data is not None:
                return np.asarray(data)
        return state_tree.host_array(path, leaf)

    def _kind_of(self, leaf: Any) -> str:
        """``array`` (saved as is), ``key`` (a typed PRNG key) or ``other`` (the general path)."""
        if state_tree.is_typed_key(leaf):
            return "key"
        if np.dtype(leaf.dtype).name in SAFETENSORS_DTYPES:
            return "array"
        return "other"


class UsageError(WorkerInternalError):
    """Raised when a program calls the SDK out of order (an update never reported, a
    state whose tree drifted, a restore after the loop began): a bug in the program."""


def same_tree(specs: tuple[Any, ...], expected: Expected) -> None:
    """Refuse to commit a state whose leaves drifted from the initial state's (no resume could
    restore it): names the first leaf whose path, shape or dtype changed."""
    if specs == expected.leaves:
        return
    for now, then in zip(specs, expected.leaves, strict=False):
        if now != then:
            raise UsageError(
                f"the state changed structure since run.restore(): {now.path} "
                f"{now.dtype}{list(now.shape)} was {then.path} {then.dtype}{list(then.shape)}",
                leaf=now.path,
            )
    raise UsageError(f"the state has {len(specs)} leaves, run.restore() had {len(expected.leaves)}")


def _copied(path: str, leaf: Any) -> np.ndarray:
    """A leaf that is not a JAX array, as a host array the program can no longer change."""
    array = state_tree.host_array(path, leaf)
    return array.copy() if array.flags.writeable else array


class Snapshot:
    """A state's leaves as `Flattener.snapshot` took them; `leaves` gives their host arrays."""

    def __init__(self, flattener: Flattener, paths: list[str], values: list[Any]) -> None:
        self._flattener = flattener
        self.paths = paths
        self._values = values

    def leaves(self) -> Leaves:
        """Named host arrays of every leaf (its caches are dicts: any thread may call this)."""
        host = self._flattener.host
        return [(path, host(path, v)) for path, v in zip(self.paths, self._values, strict=True)]

    def donated(self) -> bool:
        """Whether a JAX array of it was deleted since (donated to a later update)."""
        return any(not isinstance(v, np.ndarray) and v.is_deleted() for v in self._values)
