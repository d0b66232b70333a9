"""``sharded_mlp``: the ``mlp`` task with its parameters and Adam moments sharded over every
device of every member of a multi-process job.

The mesh is one axis, ``devices``, of ``jax.devices()`` in order: every device of every
member (one CPU device per member by default; a member that exposes more, with
``JAX_NUM_CPU_DEVICES``, adds them to the mesh).  Each weight matrix,
bias and their Adam ``mu`` and ``nu`` are split over the mesh on their last axis when its
extent divides by the number of devices, else on their first, else kept replicated; Adam's
count and the key are replicated.  No member holds a split leaf whole.  Each batch is
split over the mesh the same way as ``dp_mlp``'s, so every update runs cross-process
collectives (the forward pass's matrix products and the gradient reductions).

Two runs with the same number of members and devices are bit for bit equal.  What
changes the bits is the number of devices in the mesh (members times devices per
member): it changes how products and reductions are split, so the order of the float
sums, and it changes the layout, so the boxes the state hash goes through.  In a single
process with one device nothing is split and the task is ``mlp`` computed the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from jobwarden.tasks import mlp
from jobwarden.tasks.base import State, TrainFields, Update
from jobwarden.tasks.mlp import MLP, MLPTrain, forward

MESH_AXIS = "devices"


class ShardedMLPTrain(MLPTrain):
    """Training fields of ``sharded_mlp``: those of ``mlp`` (``batch_size`` divisible by
    the number of devices)."""


def split_axis(shape: tuple[int, ...], devices: int) -> int | None:
    """The axis a parameter of ``shape`` is split on over ``devices``: the last whose extent
    divides, trying the last axis then the first; None keeps it replicated."""
    if devices == 1 or not shape:
        return None
    for axis in (len(shape) - 1, 0):
        if shape[axis] % devices == 0:
            return axis
    return None


class ShardedMLP(MLP):
    """``mlp`` whose parameters and Adam moments are split over every device of the job."""

    name: ClassVar[str] = "sharded_mlp"
    Train: ClassVar[type[TrainFields]] = ShardedMLPTrain

    def source_files(self) -> list[Path]:
        """This module and ``mlp``'s, whose data, network and initial values it uses."""
        return [Path(__file__), Path(mlp.__file__)]

    def _mesh(self) -> Any:
        import jax
        import numpy as np
        from jax.sharding import Mesh

        return Mesh(np.array(jax.devices()), (MESH_AXIS,))

    def shardings(self, state: State) -> Any:
        """The sharding of every leaf of a state of this task (a pytree like ``state``)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = self._mesh()
        devices = mesh.devices.size

        def of(leaf: Any, *, replicated: bool = False) -> Any:
            axis = None if replicated else split_axis(tuple(leaf.shape), devices)
            parts = [] if axis is None else [*[None] * axis, MESH_AXIS]
            spec = PartitionSpec(*parts)  # type: ignore[no-untyped-call]
            return NamedSharding(mesh, spec)

        return {
            "params": jax.tree.map(of, state["params"]),
            "opt_state": jax.tree.map(of, state["opt_state"]),
            "key": of(state["key"], replicated=True),
        }

    def init_state(self, data: dict[str, Any]) -> State:
        """``mlp``'s initial values, each laid over the mesh by `shardings`."""
        import jax
        import numpy as np

        whole = super().init_state(data)
        shardings = self.shardings(whole)

        def lay(value: Any, sharding: Any) -> Any:
            host = np.asarray(value)
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

        laid: State = jax.tree.map(lay, whole, shardings)
        return laid

    def update(self, data: dict[str, Any]) -> Update:
        """One Adam step on a batch split over the mesh; the state keeps its layout."""
        import jax
        import jax.numpy as jnp
        import numpy as np
        import optax
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = self._mesh()
        batch, examples = self.train.batch_size, self.train.examples
        if batch % mesh.devices.size:
            raise ValueError(
                f"sharded_mlp: batch_size {batch} does not split over {mesh.devices.size} devices"
            )
        split = NamedSharding(mesh, PartitionSpec(MESH_AXIS))  # type: ignore[no-untyped-call]
        x, y = np.asarray(data["x"]), np.asarray(data["y"])
        optimizer = self._optimizer()
        layout: list[Any] = []

        def step(state: State) -> tuple[State, Any]:
            if not layout:
                layout.append(self.shardings(state))
            key, sample = jax.random.split(state["key"])
            indices = jax.random.randint(sample, (batch,), 0, examples)
            constrain = jax.lax.with_sharding_constraint
            inputs = constrain(jnp.asarray(x)[indices], split)  # type: ignore[no-untyped-call]
            targets = constrain(jnp.asarray(y)[indices], split)  # type: ignore[no-untyped-call]

            def objective(params: Any) -> Any:
                return jnp.mean((forward(params, inputs) - targets) ** 2)

            loss, grads = jax.value_and_grad(objective)(state["params"])
            updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            new = {"params": params, "opt_state": opt_state, "key": key}
            return constrain(new, layout[0]), loss  # type: ignore[no-untyped-call]

        return step
