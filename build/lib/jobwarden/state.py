"""The complete training state as named leaves, and back.

Leaves are named by their pytree path joined with ``/`` (``params/layer00/w``,
``opt_state/0/mu/layer00/w``), so a checkpoint names every array and the first
path segment names its state component.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from jobwarden.hashing import Leaves
from jobwarden.tasks.base import State


def _segment(key: Any) -> str:
    for attribute in ("key", "idx", "name"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def leaf_paths(state: State) -> list[str]:
    """The path of every leaf of ``state`` in flattening order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return ["/".join(_segment(k) for k in path) for path, _ in flat]


def flatten(state: State) -> Leaves:
    """Named host copies of every leaf of ``state``."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return [("/".join(_segment(k) for k in path), np.asarray(leaf)) for path, leaf in flat]


def unflatten_like(template: State, arrays: Mapping[str, np.ndarray]) -> State:
    """A state with ``template``'s structure and the leaves of ``arrays``."""
    _, treedef = jax.tree_util.tree_flatten(template)
    leaves = [jnp.asarray(arrays[p]) for p in leaf_paths(template)]
    return cast(State, jax.tree_util.tree_unflatten(treedef, leaves))
