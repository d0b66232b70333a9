"""A program with its own checkpoints (``checkpoints="external"``) whose state is laid out
over the members: ``sharded_mlp``'s model and update driven through the SDK by hand.

Not a test module: tests/test_sharded_commit.py runs it as two real member processes
(``python tests/sharded_program.py STEPS``); each reports every update's combined hash.
"""

from __future__ import annotations

import sys

import jobwarden.sdk as jw
from jobwarden.tasks.sharded_mlp import ShardedMLP, ShardedMLPTrain


def main() -> None:
    """Train for the steps given; no checkpoint is kept by jobwarden."""
    import jax

    task = ShardedMLP(ShardedMLPTrain(seed=1, width=32, batch_size=32))
    with jw.attach(
        config={"seed": 1, "width": 32, "batch_size": 32},
        data_hash="sharded-mlp-seed-1",
        name="sharded-own",
        steps=int(sys.argv[1]),
        checkpoint_every=2,
        checkpoints="external",
        argv=[],
        environ={},
    ) as run:
        data = task.data()
        state = task.init_state(data)
        update = jax.jit(task.update(data))
        for step in run.steps(state):
            state, loss = update(state)
            run.progress(step, state, loss=loss)


if __name__ == "__main__":
    main()
