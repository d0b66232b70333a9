"""One member of a 2-process JAX job that hashes a state laid out over both members:
``python tests/sharded_members.py PROCESS PROCESSES PORT [flip | task STEPS]``.

It prints one JSON line: the combined hash of the state laid out over a mesh of every
member's device, the hash of the same values replicated over the same mesh and hashed
through the same layout, and the layout.  With ``flip`` member 1 flips one bit of its
own shard first.  `state_values` is the state whole, for the one-process hash.  With
``task STEPS`` it runs ``sharded_mlp`` for STEPS updates instead and prints the combined
hash of the state after them, and which leaves it laid out."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

SPLIT = {"params/w1": 0, "params/w2": 1, "opt_state/mu/w1": 0}
"""The axis each laid-out leaf is split on; every other leaf is replicated."""


def state_values() -> dict[str, np.ndarray]:
    """The state, whole: floats, an integer count and raw key data."""
    rng = np.random.default_rng(7)
    return {
        "params/w1": rng.standard_normal((8, 6)).astype(np.float32),
        "params/w2": rng.standard_normal((6, 4)).astype(np.float32),
        "params/b": rng.standard_normal((6,)).astype(np.float32),
        "opt_state/mu/w1": rng.standard_normal((8, 6)).astype(np.float32),
        "opt_state/count": np.array(3, np.int32),
        "key": np.array([0, 42], np.uint32),
    }


def main() -> None:
    """Join, lay the state out, hash it twice, print."""
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jobwarden.shards.hash import ShardedStateHasher, layout_of

    process, processes, port = (int(a) for a in sys.argv[1:4])
    flip = sys.argv[4:] == ["flip"]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    jax.distributed.initialize(f"127.0.0.1:{port}", processes, process)
    gather = lambda rows: np.asarray(multihost_utils.process_allgather(rows))  # noqa: E731
    if sys.argv[4:5] == ["task"]:
        run_task(process, int(sys.argv[5]), gather)
        jax.distributed.shutdown()
        return
    mesh = Mesh(np.array(jax.devices()), ("m",))
    values = state_values()
    if flip and process == 1:
        w1 = values["params/w1"].view(np.uint32).copy()
        w1[-1, -1] ^= 1  # the last row is member 1's
        values["params/w1"] = w1.view(np.float32)

    def placed(path: str, value: np.ndarray, laid_out: bool) -> Any:
        axis = SPLIT.get(path) if laid_out else None
        spec = PartitionSpec() if axis is None else PartitionSpec(*([None] * axis), "m")
        sharding = NamedSharding(mesh, spec)  # type: ignore[no-untyped-call]
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    sharded = [(path, placed(path, v, True)) for path, v in values.items()]
    layout = layout_of(sharded)
    hasher = ShardedStateHasher(gather, layout, process)
    digest, components = hasher(sharded, 5)
    replicated = [(path, placed(path, v, False)) for path, v in values.items()]
    again, _ = hasher(replicated, 5)
    out = {
        "process": process,
        "sharded": digest,
        "components": components,
        "replicated": again,
        "layout": {path: [[list(map(list, b)), o] for b, o in bs] for path, bs in layout.items()},
    }
    sys.stdout.write(json.dumps(out) + "\n")
    jax.distributed.shutdown()


def run_task(process: int, steps: int, gather: Any) -> None:
    """``sharded_mlp`` for ``steps`` updates; prints the combined hash and the layout."""
    import jax

    from jobwarden.sdk.leaves import Flattener
    from jobwarden.shards.hash import ShardedStateHasher, layout_of
    from jobwarden.tasks.sharded_mlp import ShardedMLP, ShardedMLPTrain

    task = ShardedMLP(ShardedMLPTrain(seed=1, width=32, batch_size=32))
    data = task.data()
    state = task.init_state(data)
    update = jax.jit(task.update(data))
    for _ in range(steps):
        state, _loss = update(state)
    leaves = Flattener()(state)
    layout = layout_of(leaves)
    digest, _ = ShardedStateHasher(gather, layout, process)(leaves, steps)
    out = {"process": process, "sharded": digest, "laid_out": sorted(layout)}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
