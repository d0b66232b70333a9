"""The complete training state as named host leaves, and back.

A state is any pytree: a dict of components (``params``, ``opt_state``,
``key``, a data position), Flax NNX state, linen params, optax state.  Leaves
are named by their pytree path joined with ``/`` (``params/layer00/w``,
``opt_state/0/mu/layer00/w``), so a checkpoint names every array and the first
path segment names its state component.  A typed PRNG key (``jax.random.key``)
is kept as its raw uint32 key data; Python and numpy scalars (an epoch, an
index) are kept as 0-d arrays.  Restoring gives each leaf back in the kind its
template leaf has.  JAX is imported inside the functions: importing this module
must not start it.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jobwarden.checkpoint.manifest import SAFETENSORS_DTYPES
from jobwarden.errors import WorkerInternalError
from jobwarden.hashing import Leaves

State = Any
"""Any pytree of arrays and scalars."""


class UnsupportedLeaf(WorkerInternalError):
    """Raised when a state leaf is not an array or number a checkpoint can hold (a string,
    an object); names the leaf and what it holds.  A bug in the program (``worker.internal``)."""


def _segment(key: Any) -> str:
    for attribute in ("key", "idx", "name"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def _with_paths(state: State) -> list[tuple[str, Any]]:
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return [("/".join(_segment(k) for k in path), leaf) for path, leaf in flat]


def is_typed_key(leaf: Any) -> bool:
    """Whether ``leaf`` is a typed PRNG key array (``jax.random.key``), not raw key data."""
    import jax
    import jax.numpy as jnp

    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def leaf_paths(state: State) -> list[str]:
    """The path of every leaf of ``state`` in flattening order."""
    return [path for path, _ in _with_paths(state)]


def host_array(path: str, leaf: Any) -> np.ndarray:
    """A host copy (or view) of one leaf; raises `UnsupportedLeaf` for what cannot be saved."""
    if is_typed_key(leaf):
        import jax

        leaf = jax.random.key_data(leaf)
    if not isinstance(leaf, (bool, int, float, np.ndarray, np.generic)) and not hasattr(
        leaf, "__array__"
    ):
        raise UnsupportedLeaf(
            f"state leaf {path!r} is a {type(leaf).__name__}, not an array or a number",
            leaf=path,
            found=type(leaf).__name__,
        )
    array = np.asarray(leaf)
    if array.dtype.name not in SAFETENSORS_DTYPES:
        raise UnsupportedLeaf(
            f"state leaf {path!r} has dtype {array.dtype}, which a checkpoint cannot hold",
            leaf=path,
            found=str(array.dtype),
        )
    return array


def flatten(state: State) -> Leaves:
    """Named host copies of every leaf of ``state``; raises `UnsupportedLeaf`."""
    return [(path, host_array(path, leaf)) for path, leaf in _with_paths(state)]


def key_impl_of(state: State) -> str:
    """The PRNG implementation of the state's first typed key, else JAX's default one."""
    import jax

    from jobwarden.runtime import jax_setting

    for _, leaf in _with_paths(state):
        if is_typed_key(leaf):
            return str(jax.random.key_impl(leaf))
    return str(jax_setting("jax_default_prng_impl"))


def _like(template: Any, array: np.ndarray) -> Any:
    """``array`` as the kind of leaf ``template`` is."""
    import jax
    import jax.numpy as jnp

    if is_typed_key(template):
        return jax.random.wrap_key_data(jnp.asarray(array), impl=jax.random.key_impl(template))
    if isinstance(template, jax.Array):
        return jnp.asarray(array)
    if isinstance(template, np.ndarray):
        return np.array(array)
    if isinstance(template, np.generic):
        return np.array(array)[()]
    if isinstance(template, (bool, int, float)):
        return type(template)(array.item())
    return jnp.asarray(array)


def unflatten_like(template: State, arrays: Mapping[str, np.ndarray]) -> State:
    """A state with ``template``'s structure and the leaves of ``arrays``, each of its kind."""
    import jax

    named = _with_paths(template)
    _, treedef = jax.tree_util.tree_flatten(template)
    return jax.tree_util.tree_unflatten(treedef, [_like(leaf, arrays[p]) for p, leaf in named])


def zero_opt_state(state: Any) -> Any:
    """The test-only weights-only restore: the ``opt_state`` component zeroed."""
    import jax
    import jax.numpy as jnp

    if not isinstance(state, dict) or "opt_state" not in state:
        return state
    return {**state, "opt_state": jax.tree_util.tree_map(jnp.zeros_like, state["opt_state"])}


Getter = Callable[[State], "list[Any] | None"]
"""``jax.tree_util.tree_leaves`` of a state built like one seen before, or None."""
_LEAF_TYPES = (bool, int, float, np.ndarray, np.generic)


class _Unfollowed(Exception):
    """A container whose flattening a getter does not repeat: the state has no getter."""


def leaf_getter(state: State) -> Getter | None:
    """A function that gives the leaves of a state built as ``state`` is, as
    ``jax.tree_util.tree_leaves`` would, without calling the pytree registry's Python
    flatteners node by node; None where it would not pay or cannot follow ``state``.

    Built once per structure (generated code, one subscript or attribute per node), it
    checks every node of the state it is given: the same type (exactly), the same length
    and the same keys (a missing key fails the lookup, a new one the length), and a leaf
    of the same type; for any other state it returns None, and the caller flattens.  It
    follows dicts, lists, tuples, named tuples and None, which JAX flattens in C++, and
    Flax NNX's `State` and `Variable`, whose Python flatteners are most of a training
    state's flattening cost: a state with none of those gets no getter.
    """
    follower = _Follower(_nnx())
    try:
        follower.follow("state", state)
    except _Unfollowed:
        return None
    if not follower.python_nodes:
        return None  # JAX's flattening of it runs in C++: a getter would not pay its build
    body = "".join(f"        {line}\n" for line in follower.lines)
    source = (
        "def leaves(state):\n"
        "    try:\n"
        f"{body}"
        "    except (LookupError, AttributeError, TypeError):\n"
        "        return None\n"
        f"    return [{', '.join(follower.leaves)}]\n"
    )
    names = dict(follower.types)
    exec(compile(source, "<jobwarden leaf getter>", "exec"), names)  # noqa: S102 - our own text
    getter: Getter = names["leaves"]
    import jax

    expected = jax.tree_util.tree_leaves(state)
    got = getter(state)
    if got is None or len(got) != len(expected) or not all(map(operator.is_, got, expected)):
        return None  # a flattener that does not do what it is followed as doing
    return getter


class _Follower:
    """The lines of a leaf getter, written node by node as JAX's flattening visits them."""

    def __init__(self, nnx: tuple[type, type] | None) -> None:
        self.nnx = nnx
        self.lines: list[str] = []
        self.types: dict[str, type] = {}
        self.leaves: list[str] = []
        """the names bound to leaves, in order"""
        self.python_nodes = 0
        """nodes whose flattening JAX does in Python (NNX's)"""

    def follow(self, expression: str, node: Any) -> None:
        """The lines that bind ``node`` (reached by ``expression``), check it and follow it."""
        name = f"n{len(self.lines)}"
        self.lines.append(f"{name} = {expression}")
        if node is None:
            self.lines.append(f"if {name} is not None: return None")
            return
        kind = type(node)
        kind_name = f"t{id(kind)}"
        self.types[kind_name] = kind
        self.lines.append(f"if type({name}) is not {kind_name}: return None")
        nnx = self.nnx
        if kind is dict or (nnx is not None and isinstance(node, nnx[0])):
            mapping = node
            if kind is not dict:
                self.python_nodes += 1
                mapping = node._mapping
                self.lines.append(f"{name} = {name}._mapping")
            try:
                keys = sorted(mapping)
            except TypeError:  # keys of several types: JAX cannot flatten it either
                raise _Unfollowed from None
            if any(type(key) not in (str, int) for key in keys):
                raise _Unfollowed
            self.lines.append(f"if len({name}) != {len(keys)}: return None")
            for key in keys:
                self.follow(f"{name}[{key!r}]", mapping[key])
        elif kind in (list, tuple) or (issubclass(kind, tuple) and hasattr(kind, "_fields")):
            self.lines.append(f"if len({name}) != {len(node)}: return None")
            for index, item in enumerate(node):
                self.follow(f"{name}[{index}]", item)
        elif nnx is not None and isinstance(node, nnx[1]):
            self.python_nodes += 1
            self.follow(f"{name}._raw_value", getattr(node, "_raw_value"))  # noqa: B009
        elif _is_leaf(node):
            self.leaves.append(name)
        else:
            raise _Unfollowed


def _is_leaf(node: Any) -> bool:
    """Whether ``node`` is a leaf of JAX's flattening that a getter may hand on as is."""
    import jax

    return isinstance(node, (jax.Array, *_LEAF_TYPES))


def _nnx() -> tuple[type, type] | None:
    """Flax NNX's `State` and `Variable` classes, when the program imported Flax NNX."""
    statelib = sys.modules.get("flax.nnx.statelib")
    variablelib = sys.modules.get("flax.nnx.variablelib")
    if statelib is None or variablelib is None:
        return None
    return statelib.State, variablelib.Variable
