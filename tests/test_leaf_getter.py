"""`statetree.leaf_getter`: a state's leaves without the registry's Python flatteners, and
None for any state not built as the one it was made from."""

from __future__ import annotations

import collections
import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jobwarden import statetree
from jobwarden.sdk.leaves import Flattener


class Moments(NamedTuple):
    """An optimizer state as optax keeps it: a named tuple of trees."""

    mu: Any
    nu: Any


def plain_state(scale: float = 1.0) -> dict[str, Any]:
    """A state of every container the getter follows, and every kind of leaf it hands on."""
    return {
        "model": nnx_state(4)["model"],
        "params": {"w": jnp.ones((3, 2)) * scale, "b": jnp.zeros(2)},
        "opt": (Moments(mu={"w": jnp.ones(2)}, nu=[jnp.ones(1), None]), jnp.int32(4)),
        "data": {"key": jax.random.key(3), "epoch": 2, "index": np.int32(5), "rate": 0.5},
        "host": np.arange(3.0),
        "layers": {0: [True], 1: jnp.ones(1)},
    }


def same(found: list[Any] | None, state: Any) -> bool:
    """Whether ``found`` holds the very objects ``jax.tree_util.tree_leaves`` gives, in order."""
    expected = jax.tree_util.tree_leaves(state)
    return (
        found is not None
        and len(found) == len(expected)
        and all(map(operator.is_, found, expected))
    )


def nnx_state(hidden: int) -> dict[str, Any]:
    """A Flax NNX model's and optimizer's state, as ``nnx.split`` gives them."""
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")
    model = nnx.Sequential(
        nnx.Linear(4, hidden, rngs=nnx.Rngs(0)), nnx.Linear(hidden, 2, rngs=nnx.Rngs(1))
    )
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    return {"model": nnx.split(model)[1], "optimizer": nnx.split(optimizer)[1]}


class TestLeafGetter:
    """The getter gives tree_leaves for a state of the same build, and None otherwise."""

    def test_a_state_of_the_same_build_gives_its_own_leaves(self) -> None:
        """Built from one state, the getter gives another's leaves: new arrays, other values."""
        getter = statetree.leaf_getter(plain_state())
        assert getter is not None
        other = plain_state(2.0)
        assert same(getter(other), other)

    def test_other_shapes_are_the_same_build(self) -> None:
        """Shapes are the leaves' business: the hash and the checkpoint check them."""
        getter = statetree.leaf_getter(plain_state())
        assert getter is not None
        other = plain_state()
        other["params"]["w"] = jnp.ones((5, 5))
        assert same(getter(other), other)

    @pytest.mark.parametrize(
        "change",
        [
            lambda s: s["params"].update(extra=jnp.ones(1)),  # a key added
            lambda s: s["params"].pop("b"),  # a key removed
            lambda s: s["params"].update(c=s["params"].pop("b")),  # a key renamed
            lambda s: s.update(opt=list(s["opt"])),  # a tuple become a list
            lambda s: s["opt"][0].nu.append(jnp.ones(1)),  # a list grown
            lambda s: s["opt"][0].nu.__setitem__(1, jnp.ones(1)),  # None become an array
            lambda s: s["params"].update(b={"x": jnp.ones(1)}),  # a leaf become a dict
            lambda s: s["data"].update(epoch=2.0),  # an int become a float
            lambda s: s["data"].update(epoch=jnp.int32(2)),  # a number become an array
            lambda s: s.update(params=collections.OrderedDict(s["params"])),  # another mapping
        ],
    )
    def test_a_state_built_otherwise_gives_none(self, change: Any) -> None:
        """Every change of container, key, length or leaf kind is seen."""
        getter = statetree.leaf_getter(plain_state())
        assert getter is not None
        other = plain_state()
        change(other)
        assert getter(other) is None

    def test_a_container_it_does_not_follow_gives_no_getter(self) -> None:
        """An OrderedDict (flattened in insertion order) or a custom node: no getter."""
        model = nnx_state(4)["model"]
        for other in (collections.OrderedDict(b=jnp.ones(1)), "text"):
            assert statetree.leaf_getter({"model": model, "other": other}) is None
        assert statetree.leaf_getter({1: jnp.ones(1), "b": model}) is None  # unsortable keys

    def test_a_state_jax_flattens_in_cpp_gives_no_getter(self) -> None:
        """Dicts, lists and tuples of arrays alone: JAX's own flattening is fast enough."""
        state = plain_state()
        del state["model"]
        assert statetree.leaf_getter(state) is None

    def test_a_flax_nnx_state_is_followed_through_its_variables(self) -> None:
        """NNX State and Variable nodes: the same leaves as JAX's flattening, new or not."""
        getter = statetree.leaf_getter(nnx_state(8))
        assert getter is not None
        other = nnx_state(8)
        assert same(getter(other), other)
        wider = nnx_state(16)  # the same keys, other shapes
        assert same(getter(wider), wider)
        del other["optimizer"]["opt_state"]
        assert getter(other) is None


class TestFlattenerFastPath:
    """`Flattener` takes a known state's leaves with its getter and keeps to its paths."""

    def test_paths_follow_a_state_whose_build_changed(self) -> None:
        """A state, another build of it, then the first again: each named as JAX names it."""
        flatten = Flattener()
        first, changed = plain_state(), plain_state()
        changed["params"]["extra"] = jnp.ones(1)
        for state in (first, changed, first, changed):
            expected = statetree.flatten(state)
            found = flatten(state)
            assert [path for path, _ in expected] == [path for path, _ in found]
            for (_, want), (_, got) in zip(expected, found, strict=True):
                assert want.tobytes() == got.tobytes()

    def test_a_flax_nnx_state_is_named_as_jax_names_it(self) -> None:
        """The NNX state's leaves and paths, from the getter, equal the uncached flattening."""
        state = nnx_state(8)
        flatten = Flattener()
        flatten(state)  # learns the build
        expected, found = statetree.flatten(state), flatten(nnx_state(8))
        assert [path for path, _ in expected] == [path for path, _ in found]
