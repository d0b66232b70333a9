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

from collections.abc import Mapping
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
