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

import contextlib
import operator
import sys
from collections.abc import Hashable
from typing import Any, cast

import numpy as np

from jobwarden import statetree as state_tree
from jobwarden.checkpoint.manifest import SAFETENSORS_DTYPES
from jobwarden.checkpoint.validate import Expected
from jobwarden.errors import WorkerInternalError
from jobwarden.hashing import Leaves, StateHasher, little_endian

MAX_CACHED_TREES = 64
HASHED_HERE_BELOW = 4 << 20
"""A state smaller than this is hashed on the training thread, right after its update:
handing it to the emitter's thread costs the training loop more than its hash (the
thread's Python contends for the interpreter lock and a core).  A larger one is hashed
on that thread while the next update runs, its bytes hashed without the lock."""
_DTYPE, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")


class Flattener:
    """`jobwarden.statetree.flatten`, with paths cached per treedef and leaf kinds per dtype."""

    def __init__(self) -> None:
        import jax

        self._jax = jax
        self._paths: dict[Any, tuple[state_tree.Getter | None, list[str], int]] = {}
        """per treedef: its leaf getter, the leaves' paths, and their bytes when the tree
        was first seen"""
        self._last: tuple[state_tree.Getter | None, list[str], int] = (None, [], 0)
        """the last tree's: a state whose leaves its getter gives needs no flattening"""
        self._kinds: dict[Any, str] = {}
        self._immutable: set[type] = set()
        """the types of JAX array seen: kept as they are, a type check per leaf in C"""
        self._exports = sys.byteorder == "little"  # the canonical bytes are little-endian
        self.donations = 0
        """states whose arrays were donated to a later update before they were hashed"""
        self._plans: dict[int, tuple[list[str], Hashable, tuple[tuple[int, str], ...]]] = {}

    def __call__(self, state: Any) -> Leaves:
        """Named host copies (or views) of every leaf; raises `statetree.UnsupportedLeaf`."""
        return self.snapshot(state).leaves()

    def snapshot(self, state: Any) -> Snapshot:
        """What `Snapshot.leaves` needs of ``state`` later, on another thread, to give what
        this call would give now: its leaves taken out of the program's containers (which
        it may change in place), a JAX array as it is (immutable), anything else as a host
        copy made now (a NumPy array is the program's to change)."""
        getter, paths, nbytes = self._last
        values = getter(state) if getter is not None else None
        if values is None:
            values, treedef = self._jax.tree_util.tree_flatten(state)
            tree = self._paths.get(treedef)
            if tree is None:
                if len(self._paths) >= MAX_CACHED_TREES:
                    self._paths.clear()
                paths, nbytes = state_tree.leaf_paths(state), _nbytes(values)
                tree = self._paths[treedef] = (state_tree.leaf_getter(state), paths, nbytes)
            getter, paths, nbytes = self._last = tree
        if all(map(self._immutable.__contains__, map(type, values))):
            return Snapshot(self, paths, values, nbytes)  # every leaf a JAX array, as it is
        array_type = self._jax.Array
        taken = [
            value if isinstance(value, array_type) else _copied(path, value)
            for path, value in zip(paths, values, strict=True)
        ]
        self._immutable.update(type(v) for v in values if isinstance(v, array_type))
        return Snapshot(self, paths, taken, nbytes)

    def named(self, state: Any) -> Snapshot:
        """`snapshot`, refusing a state that is a bare array (a leaf with no path)."""
        snapshot = self.snapshot(state)
        if not all(snapshot.paths):
            raise UsageError(
                "the state must be a container of named components (a dict, a "
                "tuple, an NNX State), not a bare array"
            )
        return snapshot

    def host(self, path: str, leaf: Any) -> np.ndarray:
        """One leaf as a host array (a view of a JAX array's buffer where it can be)."""
        if not isinstance(leaf, self._jax.Array):
            return state_tree.host_array(path, leaf)
        kind = self._kinds.get(leaf.dtype)
        if kind is None:
            kind = self._kinds[leaf.dtype] = self._kind_of(leaf)
        if kind == "buffer":
            kind = "array"
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

    def exported(self, paths: list[str], values: list[Any], layout: Hashable) -> list[Any]:
        """The values (of ``layout``, equal exactly when their dtypes and shapes are), each
        as an exporter of its canonical bytes
        (`StateHasher.of_buffers`): a JAX array as it is (on this host, the buffer
        protocol gives its bytes once it is ready), a typed key as its raw key data, a
        NumPy array in canonical order, the rest as `host` gives them.  The choice is made
        once per tree and layout."""
        plan = self._plans.get(id(paths))
        if plan is None or plan[0] is not paths or plan[1] != layout:
            if len(self._plans) >= MAX_CACHED_TREES:
                self._plans.clear()
            plan = self._plans[id(paths)] = (paths, layout, self._plan(paths, values))
        changed = plan[2]
        if not changed:
            return values
        values = list(values)
        for index, kind in changed:
            value = values[index]
            if kind == "key":
                values[index] = value._base_array
            elif kind == "numpy":
                values[index] = little_endian(value)
            else:
                values[index] = self.host(paths[index], value)
        return values

    def _plan(self, paths: list[str], values: list[Any]) -> tuple[tuple[int, str], ...]:
        """The leaves `exported` gives otherwise than as they are: keys, NumPy arrays whose
        bytes are not canonical as they lie (big-endian, strided), and host arrays."""
        changed = []
        for index, (path, value) in enumerate(zip(paths, values, strict=True)):
            if isinstance(value, np.ndarray):
                if value.dtype.byteorder == ">" or not value.flags.c_contiguous:
                    changed.append((index, "numpy"))
                continue
            self.host(path, value)  # learns its dtype's kind
            kind = self._kinds.get(value.dtype) if isinstance(value, self._jax.Array) else None
            if kind == "buffer":
                continue
            if kind == "key" and getattr(value, "_base_array", None) is not None:
                changed.append((index, "key"))
            else:
                changed.append((index, "host"))
        return tuple(changed)

    @property
    def exports(self) -> bool:
        """Whether states are hashed from their arrays' own buffers (`Snapshot.hash`): not
        on a big-endian host, nor once an array refused its buffer (`no_exports`)."""
        return self._exports

    def no_exports(self) -> None:
        """Give every later state the host views of `leaves` (an array refused its buffer)."""
        self._exports = False

    def _kind_of(self, leaf: Any) -> str:
        """``buffer`` or ``array`` (saved as is; a ``buffer`` also exports its bytes), ``key``
        (a typed PRNG key) or ``other`` (the general path)."""
        if state_tree.is_typed_key(leaf):
            return "key"
        if np.dtype(leaf.dtype).name in SAFETENSORS_DTYPES:
            # NumPy's own dtypes have a buffer format; ml_dtypes' (bfloat16, float8) do not
            return "buffer" if np.dtype(leaf.dtype).isbuiltin == 1 else "array"
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


def finished(loss: Any, snapshot: Snapshot | None, hasher: Any, step: int) -> dict[str, Any]:
    """A progress event's loss and, with a ``snapshot``, its hash (`Snapshot.fields`), made
    once the update has ended: `RunEmitter.emit_next`'s ``finish``."""
    done: dict[str, Any] = {"loss": None if loss is None else float(loss)}
    if snapshot is not None:
        done.update(snapshot.fields(hasher, step))
    return done


def _nbytes(values: list[Any]) -> int:
    """The leaves' bytes together, as far as they tell (a leaf that does not counts 0)."""
    total = 0
    for value in values:
        with contextlib.suppress(Exception):
            total += int(getattr(value, "nbytes", 0))
    return total


def _copied(path: str, leaf: Any) -> np.ndarray:
    """A leaf that is not a JAX array, as a host array the program can no longer change."""
    array = state_tree.host_array(path, leaf)
    return array.copy() if array.flags.writeable else array


class Snapshot:
    """A state's leaves as `Flattener.snapshot` took them; `leaves` gives their host arrays."""

    def __init__(
        self, flattener: Flattener, paths: list[str], values: list[Any], nbytes: int
    ) -> None:
        self._flattener = flattener
        self.paths = paths
        self._values = values
        self.nbytes = nbytes
        """the state's size, as its tree's first state had it"""

    def leaves(self) -> Leaves:
        """Named host arrays of every leaf (its caches are dicts: any thread may call this)."""
        host = self._flattener.host
        return [(path, host(path, v)) for path, v in zip(self.paths, self._values, strict=True)]

    def hash(self, hasher: StateHasher, step: int) -> tuple[str, dict[str, str]]:
        """``hasher(self.leaves(), step)``, bit for bit, from the arrays' own buffers
        (`Flattener.exported`, `StateHasher.of_buffers`): no host view is made and no
        Python runs per leaf, which on the emitter's thread would hold the interpreter
        lock the training thread dispatches with.  A state one of whose arrays refuses
        its buffer (over several devices, say) is hashed from `leaves`, and so is every
        later one."""
        if self._flattener.exports:
            values = self._values
            layout = (tuple(map(_DTYPE, values)), tuple(map(_SHAPE, values)))
            try:
                exported = self._flattener.exported(self.paths, values, layout)
                return hasher.of_buffers(self.paths, exported, step, layout)
            except (BufferError, TypeError, ValueError, RuntimeError):
                if self.donated():
                    raise RuntimeError("an array of the state was donated") from None
                self._flattener.no_exports()
        return hasher(self.leaves(), step)

    def fields(self, hasher: StateHasher, step: int) -> dict[str, Any]:
        """`hash` as a progress event's fields, or none for a state an array of which was
        donated to a later update before it was hashed (then it is not a verification
        point)."""
        try:
            digest, components = self.hash(hasher, step)
        except RuntimeError:
            if not self.donated():
                raise
            self._flattener.donations += 1
            return {}
        return {"state_hash": digest, "components": components}

    def donated(self) -> bool:
        """Whether a JAX array of it was deleted since (donated to a later update)."""
        return any(not isinstance(v, np.ndarray) and v.is_deleted() for v in self._values)
