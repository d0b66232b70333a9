"""Orbax saves a training state laid out over two members, jobwarden proves the replays.

A program of its own for a ``processes = 2`` job (docs/multiprocess.md): the SDK joins
the members (`jax.distributed`, gloo collectives on CPU) as the run is entered, and the
program lays its state over a mesh of every device of every member.  No member holds a
weight matrix whole:

* ``hidden/w`` (64 x 128) is split by columns and ``hidden/b`` with it, ``out/w``
  (128 x 10) by rows (tensor parallel: each member computes its half of the hidden
  layer, the output's partial sums are reduced across the members);
* Adam's moments (``mu``, ``nu``) are laid out as the parameters they follow; Adam's
  count, ``out/b`` and the PRNG key (raw ``uint32``, the batch draws) are replicated.

Orbax's `CheckpointManager` saves the whole state every ``checkpoint_every`` updates,
asynchronously, each member writing only its own shards (Orbax's multi-process save:
``default/ocdbt.process_<i>`` per member, member 0 finalizing the step).  On a restart
every member restores the newest complete step onto the same layout, reading its own
shards only, and tells the SDK which step and state it restored
(``run.restored(step, state)``).  The run reports every update's combined state hash, the
same in every member, so wardend proves that each resumed update equals the failed
attempt's (docs/multiprocess.md, "Sharded state").

Run it under wardend (``job.toml``) or by hand as two members (README.md).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import jobwarden.sdk as jw

AXIS = "model"
LAYOUT = {"hidden/w": (None, AXIS), "hidden/b": (AXIS,), "out/w": (AXIS, None)}
"""How each parameter (and each Adam moment of it) is split over the mesh, by path suffix;
every other leaf is replicated."""


@dataclass(frozen=True)
class Config:
    """The training fields."""

    seed: int = 0
    hidden: int = 128
    learning_rate: float = 0.01
    batch_size: int = 50
    test_fraction: float = 0.2
    split_seed: int = 0


@dataclass(frozen=True)
class Digits:
    """scikit-learn's bundled digits (1,797 8x8 images), pixels in [0, 1], split in two."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load(config: Config) -> Digits:
    """The data set, split the same way every time (stratified, ``split_seed``)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    split = train_test_split(
        x, y, test_size=config.test_fraction, random_state=config.split_seed, stratify=y
    )
    x_train, x_test, y_train, y_test = split
    return Digits(x_train, y_train, x_test, y_test)


class Trainer:
    """The mesh, every leaf's sharding, the initial state, the jitted update and evaluation."""

    def __init__(self, config: Config, data: Digits) -> None:
        import jax
        import jax.numpy as jnp
        import optax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        mesh = Mesh(np.array(jax.devices()), (AXIS,))  # every device of every member
        if config.hidden % mesh.devices.size:
            raise ValueError(
                f"hidden {config.hidden} does not split over {mesh.devices.size} devices"
            )
        self.config = config
        optimizer = optax.adam(config.learning_rate)

        def init(key: Any) -> Any:
            k_hidden, k_out, k_batches = jax.random.split(key, 3)
            params = {
                "hidden": {
                    "w": jax.random.normal(k_hidden, (64, config.hidden)) / 8.0,
                    "b": jnp.zeros(config.hidden),
                },
                "out": {
                    "w": jax.random.normal(k_out, (config.hidden, 10)) / config.hidden**0.5,
                    "b": jnp.zeros(10),
                },
            }
            return {"params": params, "opt_state": optimizer.init(params), "key": k_batches}

        def sharding(path: Any, leaf: Any) -> Any:
            name = jax.tree_util.keystr(path, simple=True, separator="/")
            spec = next((s for tail, s in LAYOUT.items() if name.endswith(tail)), ())
            return NamedSharding(mesh, PartitionSpec(*spec))

        self.shardings = jax.tree_util.tree_map_with_path(
            sharding, jax.eval_shape(init, jax.random.PRNGKey(0))
        )
        replicated = NamedSharding(mesh, PartitionSpec())
        self._init = jax.jit(init, out_shardings=self.shardings)
        x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)

        def logits(params: Any, inputs: Any) -> Any:
            hidden = jax.nn.relu(inputs @ params["hidden"]["w"] + params["hidden"]["b"])
            return hidden @ params["out"]["w"] + params["out"]["b"]

        def step(state: Any) -> tuple[Any, Any]:
            key, draw = jax.random.split(state["key"])
            batch = jax.random.randint(draw, (config.batch_size,), 0, x.shape[0])

            def objective(params: Any) -> Any:
                out = logits(params, x[batch])
                return optax.softmax_cross_entropy_with_integer_labels(out, y[batch]).mean()

            loss, grads = jax.value_and_grad(objective)(state["params"])
            updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
            params = optax.apply_updates(state["params"], updates)
            return {"params": params, "opt_state": opt_state, "key": key}, loss

        self._step = jax.jit(step, out_shardings=(self.shardings, replicated))
        x_test, y_test = jnp.asarray(data.x_test), jnp.asarray(data.y_test)
        self._accuracy = jax.jit(
            lambda params: (logits(params, x_test).argmax(-1) == y_test).mean(),
            out_shardings=replicated,
        )

    def init_state(self) -> Any:
        """The complete initial state, laid over the mesh."""
        import jax

        return self._init(jax.random.PRNGKey(self.config.seed))

    def step(self, state: Any) -> tuple[Any, Any]:
        """One Adam update of the complete state; the state keeps its layout."""
        return self._step(state)

    def test_accuracy(self, state: Any) -> float:
        """The held-out accuracy (a collective: every member calls it)."""
        return float(self._accuracy(state["params"]))


def main() -> None:
    """Train with Orbax's multi-process checkpoints in the run's directory, verified."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="updates in all (default 40)")
    args, _ = parser.parse_known_args()
    config = Config()
    data = load(config)
    with jw.attach(
        config=asdict(config),
        sources=[__file__],
        data=asdict(data),
        steps=args.steps,
        checkpoint_every=10,
        checkpoints="external",
    ) as run:  # every member joins the others here
        parser.parse_args()  # the SDK took --checkpoint-dir out of sys.argv
        import jax
        import orbax.checkpoint as ocp

        trainer = Trainer(config, data)
        options = ocp.CheckpointManagerOptions(max_to_keep=run.keep_checkpoints)
        directory = run.checkpoint_dir or Path("checkpoints").absolute()  # the same in all
        # run.checkpointer: a save in flight is waited for whenever the run stops
        with run.checkpointer(ocp.CheckpointManager(directory, options=options)) as manager:
            state = trainer.init_state()
            saved = manager.latest_step()  # the newest finalized step: never a *-tmp folder
            if saved is not None:
                layout = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)  # with shardings
                state = manager.restore(saved, args=ocp.args.StandardRestore(layout))
                run.restored(saved, state, source=str(Path(directory) / str(saved)))
            step = run.start_step
            for step in run.steps(state):
                state, loss = trainer.step(state)
                run.progress(step, state, loss=loss, examples=config.batch_size)
                if step % run.checkpoint_every == 0 or step == run.total_steps:
                    manager.save(step, args=ocp.args.StandardSave(state))  # every member
            # No save on preemption: it is a collective, and a member may already be inside
            # the next update's; the newest complete step is restored instead.
        if not run.preempted:  # a collective too
            accuracy = trainer.test_accuracy(state)
            print(f"member {jax.process_index()}, step {step}: test accuracy {accuracy:.1%}")


if __name__ == "__main__":
    main()
