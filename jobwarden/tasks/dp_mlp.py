"""``dp_mlp``: the ``mlp`` task trained data-parallel across the members of a multi-process job.

Every member holds the same parameters, optimizer state and key (replicated);
each update draws one batch from the shared key, and the batch is sharded
over a mesh of one device per member, so each member computes the loss and
gradients of its slice and XLA reduces the gradients across the members
(gloo on CPU).  Run after run, the states are bit for bit the same for a given
number of processes; with another number the reduction order differs, so the
last bits may too (docs/multiprocess.md gives the measured comparison).  In a
single process the mesh has one device and the task is ``mlp`` computed the
same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from jobwarden.tasks import mlp
from jobwarden.tasks.base import State, TrainFields, Update
from jobwarden.tasks.mlp import MLP, MLPTrain, forward


class DPMLPTrain(MLPTrain):
    """Training fields of ``dp_mlp``: those of ``mlp`` (``batch_size`` divisible by N)."""


class DPMLP(MLP):
    """``mlp`` with each batch split across the job's processes."""

    name: ClassVar[str] = "dp_mlp"
    Train: ClassVar[type[TrainFields]] = DPMLPTrain

    def source_files(self) -> list[Path]:
        """This module and ``mlp``'s, whose data and initial state it uses."""
        return [Path(__file__), Path(mlp.__file__)]

    def update(self, data: dict[str, Any]) -> Update:
        """One optimizer step; the batch is sharded over the members, the gradients reduced."""
        import jax
        import jax.numpy as jnp
        import numpy as np
        import optax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        devices = jax.devices()
        batch, examples = self.train.batch_size, self.train.examples
        if batch % len(devices):
            raise ValueError(
                f"dp_mlp: batch_size {batch} does not split over {len(devices)} processes"
            )
        mesh = Mesh(np.array(devices), ("members",))
        split = NamedSharding(mesh, PartitionSpec("members"))  # type: ignore[no-untyped-call]
        x, y = np.asarray(data["x"]), np.asarray(data["y"])
        optimizer = self._optimizer()

        def step(state: State) -> tuple[State, Any]:
            key, sample = jax.random.split(state["key"])
            indices = jax.random.randint(sample, (batch,), 0, examples)
            inputs = jax.lax.with_sharding_constraint(  # type: ignore[no-untyped-call]
                jnp.asarray(x)[indices], split
            )
            targets = jax.lax.with_sharding_constraint(  # type: ignore[no-untyped-call]
                jnp.asarray(y)[indices], split
            )

            def objective(params: Any) -> Any:
                return jnp.mean((forward(params, inputs) - targets) ** 2)

            loss, grads = jax.value_and_grad(objective)(state["params"])
            updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            return {"params": params, "opt_state": opt_state, "key": key}, loss

        return step
